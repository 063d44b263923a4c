"""The length history: observed response lengths per prompt id and epoch.

The same prompt is sampled every epoch in RL, and its earlier lengths are the best cheap predictor of its next ones
(docs/design.md#length-estimation). The store is columnar (one record = prompt id, epoch, the n observed lengths) and
kept as flat numpy arrays, so 10^5 prompts x several epochs load, merge and gather in well under a second.

File formats, chosen by suffix:

- ``.parquet``: columns ``prompt_id`` (string), ``epoch`` (int64), ``lengths`` (list<int64>).
- ``.jsonl``: one record per line, ``{"prompt_id": "17", "epoch": 3, "lengths": [812, 1033, ...]}``.

Rollout logs (what the runtime writes while it generates) are JSON Lines with one finished group per line:
``{"prompt_id": "17", "epoch": 3, "response_lengths": [812, 1033, ...], ...}``; other keys are ignored.
A record (JSON Lines) or the Parquet schema metadata (``mindspeed_asp.max_new_tokens``) may declare the
generation cap the lengths were produced under, ``"max_new_tokens": 16384``: it is kept as `declared_cap`, so a
trace's cap comes from the file rather than from its longest length (workloads/traces.py).
``append_rollout_log`` merges them: lines with the same (prompt_id, epoch), for example a group split over
instances or regenerated after a lag violation, are concatenated into one record. A saved history file must
instead hold each (prompt_id, epoch) once; a duplicate there is reported with its line. Every length read from
a file is an integer in 1 .. 10^7 tokens (`mindspeed_asp.core.limits.MAX_LENGTH`: a response has at least one
token, and 10^7 is far above any context length) and every epoch in 0 .. 2^31 - 1; anything else is refused
with the file, line (or row) and key (a JSON key given twice too: `mindspeed_asp.utils.jsonl`). Lengths added in
code (`add`, `add_epoch`: the runtime's observed groups, a checkpoint's history, traces) obey the same bounds,
refused with a ValueError naming the prompt and epoch (a resume names the checkpoint file and key).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from mindspeed_asp.utils.atomic import atomic_open, atomic_path
from mindspeed_asp.errors import InputError
from mindspeed_asp.utils.jsonl import iter_jsonl_objects
from mindspeed_asp.core.limits import MAX_COUNT, MAX_LENGTH, length_range_message, length_value, short_repr

SCHEMA_VERSION = 1
CAP_METADATA = "mindspeed_asp.max_new_tokens"  # Parquet schema metadata key of a declared generation cap
PathLike = Union[str, Path]


@dataclass(frozen=True)
class HistorySamples:
    """Flat, vectorised view of the history of a list of prompts: one row per observed sample.

    `group[k]` is the index of the prompt (in the order asked for) that sample k belongs to, `epoch[k]` its
    epoch, `length[k]` its length, `record[k]` the index of its (prompt, epoch) record inside this view
    (records are numbered in (group, epoch) order; `record_group`/`record_epoch` describe them).
    """

    group: np.ndarray  # int64 [S]
    epoch: np.ndarray  # int64 [S]
    length: np.ndarray  # int64 [S]
    record: np.ndarray  # int64 [S]
    record_group: np.ndarray  # int64 [R]
    record_epoch: np.ndarray  # int64 [R]
    num_groups: int

    def counts(self) -> np.ndarray:
        """Number of observed samples per prompt, [num_groups]."""
        return np.bincount(self.group, minlength=self.num_groups)


def _segment_gather(offsets: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Flat value indexes of the segments `rows` of a CSR layout, in the order given."""
    starts = offsets[rows]
    counts = offsets[rows + 1] - starts
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(starts - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
    return np.arange(total, dtype=np.int64) + shift


class LengthHistory:
    """Observed response lengths keyed by (prompt id, epoch); each key holds the group's n lengths."""

    def __init__(self) -> None:
        self._pid = np.zeros(0, dtype=object)
        self._epoch = np.zeros(0, dtype=np.int64)
        self._offsets = np.zeros(1, dtype=np.int64)
        self._values = np.zeros(0, dtype=np.int64)
        self._pending: List[Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._index: Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]] = None
        self.declared_cap: Optional[int] = None  # max_new_tokens the file declares, if it does

    # ------------------------------------------------------------------ building
    def add(self, prompt_id: str, epoch: int, lengths: Sequence[int]) -> None:
        """Record one group's observed lengths; a repeated (prompt_id, epoch) is merged (concatenated)."""
        _check_epoch(epoch)
        arr = checked_lengths(lengths, f"prompt {prompt_id!r} epoch {epoch}")
        self._pending.append((np.array([str(prompt_id)], dtype=object), np.array([int(epoch)], dtype=np.int64),
                              np.array([0, len(arr)], dtype=np.int64), arr))
        self._index = None

    def add_epoch(self, prompt_ids: Sequence[str], epoch: int, lengths: np.ndarray) -> None:
        """Record a whole epoch at once: `lengths` is [G, n] for the G prompt ids (vectorised add)."""
        shape = np.shape(lengths)
        if len(shape) != 2 or shape[0] != len(prompt_ids):
            raise ValueError(f"lengths must be [G={len(prompt_ids)}, n], got shape {shape}")
        if shape[1] == 0:
            raise ValueError("each group needs at least one length")
        _check_epoch(epoch)
        G, n = shape
        lengths = checked_lengths(lengths, f"epoch {epoch}") if G else np.zeros(0, dtype=np.int64)
        pids = np.array([str(p) for p in prompt_ids], dtype=object)
        self._pending.append((pids, np.full(G, int(epoch), dtype=np.int64),
                              np.arange(G + 1, dtype=np.int64) * n, lengths))
        self._index = None

    def extend(self, other: "LengthHistory") -> None:
        """Merge another history into this one (same keys are concatenated)."""
        other._consolidate()
        self._pending.append((other._pid, other._epoch, other._offsets, other._values))
        self._index = None
        if other.declared_cap is not None:  # the larger cap covers both
            self.declared_cap = max(self.declared_cap or 0, other.declared_cap)

    def _consolidate(self) -> None:
        """Fold pending additions into the sorted, key-unique arrays (vectorised sort and merge)."""
        if not self._pending:
            return
        parts = [(self._pid, self._epoch, self._offsets, self._values)] + self._pending
        self._pending = []
        pid = np.concatenate([p[0] for p in parts])
        epoch = np.concatenate([p[1] for p in parts])
        counts = np.concatenate([np.diff(p[2]) for p in parts])
        values = np.concatenate([p[3][p[2][0]:p[2][-1]] for p in parts])
        offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        uniq, code = np.unique(pid.astype(str), return_inverse=True)
        code = code.reshape(-1)
        order = np.lexsort((np.arange(len(pid)), epoch, code))  # stable: earlier additions first
        code_s, epoch_s = code[order], epoch[order]
        new_key = np.ones(len(order), dtype=bool)
        new_key[1:] = (code_s[1:] != code_s[:-1]) | (epoch_s[1:] != epoch_s[:-1])
        key_of = np.cumsum(new_key) - 1
        values = values[_segment_gather(offsets, order)]
        seg_counts = counts[order]
        key_counts = np.bincount(key_of, weights=seg_counts, minlength=int(new_key.sum())).astype(np.int64)
        self._pid = uniq[code_s[new_key]].astype(object)
        self._epoch = epoch_s[new_key]
        self._offsets = np.concatenate(([0], np.cumsum(key_counts))).astype(np.int64)
        self._values = values

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        """Number of (prompt id, epoch) records."""
        self._consolidate()
        return len(self._pid)

    @property
    def num_samples(self) -> int:
        self._consolidate()
        return len(self._values)

    def max_length(self) -> int:
        """The longest observed length (0 for an empty history)."""
        self._consolidate()
        return int(self._values.max()) if len(self._values) else 0

    def epochs(self) -> List[int]:
        """Sorted distinct epochs present."""
        self._consolidate()
        return [int(e) for e in np.unique(self._epoch)]

    def latest_epoch(self) -> Optional[int]:
        """The largest epoch present, or None for an empty history."""
        self._consolidate()
        return int(self._epoch.max()) if len(self._epoch) else None

    def prompt_ids(self) -> np.ndarray:
        """Distinct prompt ids present (sorted, object array of str)."""
        self._consolidate()
        return np.unique(self._pid.astype(str)).astype(object) if len(self._pid) else np.zeros(0, dtype=object)

    def records(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The columnar table as (prompt_id [R], epoch [R], offsets [R+1], values [S]), sorted by key."""
        self._consolidate()
        return self._pid, self._epoch, self._offsets, self._values

    def _ranges(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sorted distinct prompt ids (str array) with their [start, end) record rows.

        Records of one prompt are contiguous and epoch-sorted, so a prompt's history is one slice.
        """
        self._consolidate()
        if self._index is None:
            pid = self._pid.astype(str)
            if len(pid) == 0:
                self._index = (np.zeros(0, dtype=str), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
            else:
                starts = np.flatnonzero(np.concatenate(([True], pid[1:] != pid[:-1])))
                ends = np.concatenate((starts[1:], [len(pid)]))
                self._index = (pid[starts], starts.astype(np.int64), ends.astype(np.int64))
        return self._index

    def _locate(self, prompt_ids: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
        """[start, end) record rows per asked prompt (start == end for prompts without history)."""
        uniq, starts, ends = self._ranges()
        q = np.asarray(prompt_ids).astype(str)
        if len(uniq) == 0 or len(q) == 0:
            z = np.zeros(len(q), dtype=np.int64)
            return z, z.copy()
        pos = np.minimum(np.searchsorted(uniq, q), len(uniq) - 1)
        found = uniq[pos] == q
        return np.where(found, starts[pos], 0), np.where(found, ends[pos], 0)

    def gather(self, prompt_ids: Sequence[str], max_epochs: Optional[int] = None,
               before_epoch: Optional[int] = None) -> HistorySamples:
        """All samples of the given prompts as flat arrays (see HistorySamples), fully vectorised.

        `max_epochs` keeps each prompt's most recent k epochs; `before_epoch` drops epochs >= it (for
        back-testing: predict epoch e from what was known before it).
        """
        start, end = self._locate(prompt_ids)
        counts = end - start
        grp_offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        rec_rows = np.repeat(start - grp_offsets[:-1], counts) + np.arange(int(counts.sum()), dtype=np.int64)
        rec_group = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        if before_epoch is not None:
            keep = self._epoch[rec_rows] < before_epoch
            rec_rows, rec_group = rec_rows[keep], rec_group[keep]
        if max_epochs is not None and len(rec_rows):
            per = np.bincount(rec_group, minlength=len(counts))
            last = np.cumsum(per)[rec_group] - 1  # index of the group's last (most recent) record
            keep = last - np.arange(len(rec_rows)) < max_epochs
            rec_rows, rec_group = rec_rows[keep], rec_group[keep]
        counts = self._offsets[rec_rows + 1] - self._offsets[rec_rows]
        idx = _segment_gather(self._offsets, rec_rows)
        rec_of_sample = np.repeat(np.arange(len(rec_rows), dtype=np.int64), counts)
        return HistorySamples(group=rec_group[rec_of_sample], epoch=self._epoch[rec_rows][rec_of_sample],
                              length=self._values[idx], record=rec_of_sample, record_group=rec_group,
                              record_epoch=self._epoch[rec_rows], num_groups=len(prompt_ids))

    def lengths_for(self, prompt_ids: Sequence[str]) -> List[Dict[int, np.ndarray]]:
        """Per prompt (in the order given) a mapping epoch -> observed lengths; empty for unseen prompts."""
        start, end = self._locate(prompt_ids)
        out: List[Dict[int, np.ndarray]] = []
        for s, e in zip(start.tolist(), end.tolist()):
            out.append({int(self._epoch[r]): self._values[self._offsets[r]:self._offsets[r + 1]].copy()
                        for r in range(s, e)})
        return out

    def epoch_matrix(self, prompt_ids: Sequence[str], epoch: int, n: Optional[int] = None) -> np.ndarray:
        """Lengths of one epoch as a [G, n] int array (-1 where a prompt has no record or fewer samples)."""
        view = self.gather(prompt_ids, before_epoch=epoch + 1)
        keep = view.epoch == epoch
        if n is None:
            n = int(np.bincount(view.record[keep]).max()) if keep.any() else 1
        out = np.full((len(prompt_ids), n), -1, dtype=np.int64)
        rec = view.record[keep]
        if len(rec):
            first = np.searchsorted(rec, rec, side="left")
            pos = np.arange(len(rec)) - first
            ok = pos < n
            out[view.group[keep][ok], pos[ok]] = view.length[keep][ok]
        return out

    def select_epochs(self, before: Optional[int] = None, only: Optional[int] = None) -> "LengthHistory":
        """A new history with the records of epochs < `before` (and/or exactly `only`)."""
        self._consolidate()
        keep = np.ones(len(self._pid), dtype=bool)
        if before is not None:
            keep &= self._epoch < before
        if only is not None:
            keep &= self._epoch == only
        rows = np.flatnonzero(keep)
        out = LengthHistory()
        out._pid = self._pid[rows]
        out._epoch = self._epoch[rows]
        out._offsets = np.concatenate(([0], np.cumsum(self._offsets[rows + 1] - self._offsets[rows]))).astype(np.int64)
        out._values = self._values[_segment_gather(self._offsets, rows)]
        out.declared_cap = self.declared_cap
        return out

    # ------------------------------------------------------------------ files
    def to_arrow(self):
        """The records as a pyarrow Table (prompt_id, epoch, lengths list)."""
        import pyarrow as pa

        self._consolidate()
        lengths = pa.ListArray.from_arrays(pa.array(self._offsets, type=pa.int32() if len(self._values) < 2**31
                                                    else pa.int64()), pa.array(self._values, type=pa.int64()))
        if lengths.type != pa.list_(pa.int64()):
            lengths = lengths.cast(pa.list_(pa.int64()))
        table = pa.table({"prompt_id": pa.array(self._pid.astype(str).tolist(), type=pa.string()),
                          "epoch": pa.array(self._epoch, type=pa.int64()), "lengths": lengths})
        meta = {"mindspeed_asp.length_history": str(SCHEMA_VERSION)}
        if self.declared_cap is not None:
            meta[CAP_METADATA] = str(int(self.declared_cap))
        return table.replace_schema_metadata(meta)

    def save(self, path: PathLike) -> None:
        """Write to `.parquet` or `.jsonl` (chosen by suffix), atomically (temp file + rename): a run or a
        command interrupted mid-save leaves the previous history intact."""
        path = Path(path)
        kind = _kind(path)
        if kind == "parquet":
            import pyarrow.parquet as pq

            table = self.to_arrow()
            with atomic_path(path) as tmp:
                pq.write_table(table, str(tmp))
            return
        self._consolidate()
        with atomic_open(path) as fh:
            for r in range(len(self._pid)):
                vals = self._values[self._offsets[r]:self._offsets[r + 1]].tolist()
                rec = {"prompt_id": str(self._pid[r]), "epoch": int(self._epoch[r]), "lengths": vals}
                if self.declared_cap is not None:
                    rec["max_new_tokens"] = int(self.declared_cap)
                fh.write(json.dumps(rec) + "\n")

    @classmethod
    def load(cls, path: PathLike) -> "LengthHistory":
        """Read a history file written by `save` (or by hand); errors name the file and line or row."""
        path = Path(path)
        kind = _kind(path)
        if not path.is_file():
            raise InputError("length history file not found", path=str(path))
        hist = cls()
        if kind == "parquet":
            hist._load_parquet(path)
        else:
            hist._read_jsonl(path, lengths_keys=("lengths", "response_lengths"), allow_duplicates=False)
        return hist

    def append_rollout_log(self, path: PathLike) -> int:
        """Merge a runtime rollout log (JSON Lines, see module doc); returns the number of groups read."""
        path = Path(path)
        if not path.is_file():
            raise InputError("rollout log not found", path=str(path))
        return self._read_jsonl(path, lengths_keys=("response_lengths", "lengths"), allow_duplicates=True)

    def _read_jsonl(self, path: Path, lengths_keys: Tuple[str, ...], allow_duplicates: bool) -> int:
        pids: List[str] = []
        epochs: List[int] = []
        counts: List[int] = []
        values: List[int] = []
        lines: List[int] = []
        cap_line: Optional[Tuple[int, int]] = None  # (declared cap, first line declaring it)
        for lineno, rec in iter_jsonl_objects(path):
            pid, epoch, lens = _parse_record(rec, lengths_keys, str(path), lineno)
            if "max_new_tokens" in rec:
                cap = declared_cap_value(rec["max_new_tokens"], str(path), lineno)
                if cap_line is not None and cap != cap_line[0]:
                    raise InputError(f"max_new_tokens {cap} differs from {cap_line[0]} declared on line "
                                     f"{cap_line[1]}", path=str(path), line=lineno, key="max_new_tokens")
                cap_line = cap_line or (cap, lineno)
            pids.append(pid)
            epochs.append(epoch)
            counts.append(len(lens))
            values.extend(lens)
            lines.append(lineno)
        if cap_line is not None:
            self.declared_cap = max(self.declared_cap or 0, cap_line[0])
        if not pids:
            return 0
        pid_arr = np.array(pids, dtype=object)
        ep_arr = np.array(epochs, dtype=np.int64)
        if not allow_duplicates:
            _check_unique_keys(pid_arr, ep_arr, np.array(lines), str(path))
        self._pending.append((pid_arr, ep_arr, np.concatenate(([0], np.cumsum(counts))).astype(np.int64),
                              np.array(values, dtype=np.int64)))
        self._index = None
        return len(pids)

    def _load_parquet(self, path: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(str(path))
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(f"not a readable Parquet file ({exc})", path=str(path)) from None
        for col in ("prompt_id", "epoch", "lengths"):
            if col not in table.column_names:
                raise InputError("missing column", path=str(path), key=col)
        meta = table.schema.metadata or {}
        if CAP_METADATA.encode() in meta:
            raw = meta[CAP_METADATA.encode()].decode("utf-8", "replace")
            try:
                cap = int(raw)
            except ValueError:
                raise InputError(f"schema metadata {CAP_METADATA} must be an integer, got {raw!r}",
                                 path=str(path), key="max_new_tokens") from None
            self.declared_cap = declared_cap_value(cap, str(path), None)
        pid_col = table.column("prompt_id").combine_chunks()
        if pid_col.null_count:
            row = int(np.flatnonzero(np.asarray(pid_col.is_null()))[0])
            raise InputError(f"row {row + 1}: prompt_id is null", path=str(path), key="prompt_id")
        if not pa.types.is_string(pid_col.type) and not pa.types.is_large_string(pid_col.type):
            pid_col = pid_col.cast(pa.string())
        pid = np.asarray(pid_col.to_numpy(zero_copy_only=False), dtype=object)
        epoch_col = table.column("epoch").combine_chunks()
        if epoch_col.null_count:
            row = int(np.flatnonzero(np.asarray(epoch_col.is_null()))[0])
            raise InputError(f"row {row + 1}: epoch is null", path=str(path), key="epoch")
        if not pa.types.is_integer(epoch_col.type):  # a float epoch would be truncated, a uint64 one wrap
            raise InputError(f"epoch must be an integer column, got {epoch_col.type}", path=str(path), key="epoch")
        epoch = np.asarray(epoch_col.to_numpy(zero_copy_only=False))
        lens = table.column("lengths").combine_chunks()
        if not (pa.types.is_list(lens.type) or pa.types.is_large_list(lens.type)):
            raise InputError(f"lengths must be a list column, got {lens.type}", path=str(path), key="lengths")
        if lens.null_count:
            row = int(np.flatnonzero(np.asarray(lens.is_null()))[0])
            raise InputError(f"row {row + 1}: lengths is null", path=str(path), key="lengths")
        if not pa.types.is_integer(lens.type.value_type):  # floats, booleans: what the JSON readers refuse too
            raise InputError(f"lengths must be integers, got {lens.type.value_type}", path=str(path), key="lengths")
        offsets = np.asarray(lens.offsets.to_numpy(), dtype=np.int64)
        flat = lens.flatten()
        if flat.null_count:
            first = int(np.flatnonzero(np.asarray(flat.is_null()))[0])
            row = int(np.searchsorted(offsets - offsets[0], first, side="right") - 1)
            raise InputError(f"row {row + 1}: a length is null", path=str(path), key="lengths")
        values = np.asarray(flat.to_numpy(zero_copy_only=False))
        offsets = offsets - offsets[0]
        bad = np.flatnonzero(epoch < 0)
        if len(bad):
            raise InputError(f"row {bad[0] + 1}: negative epoch {epoch[bad[0]]}", path=str(path), key="epoch")
        bad = np.flatnonzero(epoch > MAX_COUNT)
        if len(bad):
            raise InputError(f"row {bad[0] + 1}: epoch {epoch[bad[0]]} is out of range: 0 .. {MAX_COUNT}",
                             path=str(path), key="epoch")
        out = (values < 1) | (values > MAX_LENGTH)
        if len(values) and out.any():
            first = int(np.flatnonzero(out)[0])
            row = int(np.searchsorted(offsets, first, side="right") - 1)
            raise InputError(f"row {row + 1}: {length_range_message(int(values[first]))}", path=str(path),
                             key="lengths")
        values, epoch = values.astype(np.int64), epoch.astype(np.int64)  # in range: no uint64 wraps
        empty = np.flatnonzero(np.diff(offsets) == 0)
        if len(empty):
            raise InputError(f"row {empty[0] + 1}: empty lengths list", path=str(path), key="lengths")
        _check_unique_keys(pid, epoch, None, str(path))
        self._pending.append((pid, epoch, offsets, values))
        self._index = None


def declared_cap_value(value, path: str, line: Optional[int]) -> int:
    """A declared max_new_tokens, checked: an integer in 1 .. MAX_LENGTH (errors name the file, line and key)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"max_new_tokens must be a positive integer, got {value!r}", path=path, line=line,
                         key="max_new_tokens")
    return length_value(value, path=path, line=line, key="max_new_tokens", what="max_new_tokens")


def _kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    raise InputError("length history must end in .parquet or .jsonl", path=str(path))


def _check_epoch(epoch) -> None:
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or not 0 <= int(epoch) <= MAX_COUNT:
        raise ValueError(f"epoch must be an integer in 0 .. {MAX_COUNT}, got {epoch!r}")


def checked_lengths(values, what: str) -> np.ndarray:
    """`values` (any array-like) as a flat int64 array of token lengths, each an integer in 1 .. MAX_LENGTH, or a
    ValueError naming `what` (the prompt and epoch) and the first bad value. Why here and not only in the file
    readers: lengths also arrive in code (the runtime's observed groups, a checkpoint's history, traces and
    synthetic workloads), and a 0 kept in memory is saved, planned and simulated with, far from where it came
    in. Integral floats (12.0) are taken, as numpy arithmetic gives them; booleans are not."""
    try:
        arr = np.asarray(values).reshape(-1)
    except ValueError as exc:  # a ragged nesting
        raise ValueError(f"{what}: lengths must be a flat list of integers ({exc})") from None
    if arr.size == 0:
        raise ValueError(f"{what}: at least one length is needed")
    kind = arr.dtype.kind
    if kind == "O":  # Python integers beyond int64, or mixed types
        for v in arr.tolist():
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ValueError(f"{what}: a length must be an integer, got {short_repr(v)}")
    elif kind == "f":
        bad = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))
        if len(bad):
            raise ValueError(f"{what}: a length must be an integer, got {float(arr[bad[0]])!r}")
    elif kind not in "iu":  # booleans, strings
        raise ValueError(f"{what}: a length must be an integer, got {short_repr(arr[0].item())}")
    out = np.flatnonzero((arr < 1) | (arr > MAX_LENGTH))
    if len(out):
        v = arr[out[0]]
        raise ValueError(f"{what}: {length_range_message(int(v) if kind != 'f' else float(v))}")
    return arr.astype(np.int64)


def _parse_record(rec: dict, lengths_keys: Tuple[str, ...], path: str, line: int) -> Tuple[str, int, List[int]]:
    """Validate one JSON record into (prompt_id, epoch, lengths), naming the line and key on error."""
    pid = rec.get("prompt_id", rec.get("id"))
    if pid is None or isinstance(pid, (list, dict, bool)):
        raise InputError("missing or invalid prompt id", path=path, line=line, key="prompt_id")
    epoch = rec.get("epoch")
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        raise InputError("missing or non-integer epoch", path=path, line=line, key="epoch")
    if epoch < 0:
        raise InputError(f"negative epoch {epoch}", path=path, line=line, key="epoch")
    if epoch > MAX_COUNT:
        raise InputError(f"epoch {epoch} is out of range: 0 .. {MAX_COUNT}", path=path, line=line, key="epoch")
    key = next((k for k in lengths_keys if k in rec), None)
    if key is None:
        raise InputError("missing lengths", path=path, line=line, key=lengths_keys[0])
    lens = rec[key]
    if not isinstance(lens, list) or not lens:
        raise InputError("lengths must be a non-empty list", path=path, line=line, key=key)
    for v in lens:  # before numpy: a length beyond int64 would overflow there with no line named
        length_value(v, path=path, line=line, key=key)
    return str(pid), epoch, lens


def _check_unique_keys(pid: np.ndarray, epoch: np.ndarray, lines: Optional[np.ndarray], path: str) -> None:
    """Refuse a file holding the same (prompt_id, epoch) twice, naming the second occurrence."""
    if len(pid) < 2:
        return
    _, code = np.unique(pid.astype(str), return_inverse=True)
    code = code.reshape(-1)
    order = np.lexsort((np.arange(len(pid)), epoch, code))
    dup = (code[order][1:] == code[order][:-1]) & (epoch[order][1:] == epoch[order][:-1])
    if dup.any():
        second = order[1:][dup].min()
        where = dict(line=int(lines[second])) if lines is not None else {}
        prefix = "" if lines is not None else f"row {second + 1}: "
        raise InputError(f"{prefix}duplicate record for prompt {pid[second]!r} epoch {int(epoch[second])}",
                         path=path, key="prompt_id", **where)

