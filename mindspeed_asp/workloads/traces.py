"""Loaders for two real response-length traces (alpaca-train-10k lengths and the Splitwise conversation trace).

- Alpaca/Vicuna (`alpaca-train-10k-length.json`): 4 responses per prompt at temperatures 0, 0.3, 0.5, 0.7.
  They stand in for earlier epochs of the same prompt: the held-out column is the truth of the "next
  epoch", the other three (in temperature order) are history epochs 0, 1, 2 with one sample each. The
  reference-answer column `L_gt` is not a model sample and is not used. The trace has no prompt lengths, so
  `prompt_len` is a constant the caller chooses (default 0).
- Splitwise conversation (`splitwise_conv.csv`): one decode length per request and no repeated prompts,
  so there is no history. Groups are n consecutive requests (in arrival order); a group's prompt length is
  the mean prefill of its members. A remainder of fewer than n requests at the end is left out, and a line
  on stderr says how many.

The generation cap (max_new_tokens) of a trace comes from the data: the cap the file declares when it does (a
``"max_new_tokens"`` key on the records of a JSON/JSON Lines trace, or the Parquet schema metadata of a history
file), else the longest length in the file. A declared cap below a length in the file is an error. Every length
is read as an integer in 1 .. 10^7 tokens and every prompt length in 0 .. 10^7 (`mindspeed_asp.core.limits`), else
the file, line and column are named.
"""
from __future__ import annotations

import csv
import io
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Tuple, Union

import numpy as np

from mindspeed_asp.errors import InputError
from mindspeed_asp.utils.jsonl import iter_json_objects
from mindspeed_asp.core.limits import length_value
from mindspeed_asp.utils.textfile import read_text
from mindspeed_asp.scheduler.history import LengthHistory, declared_cap_value
from mindspeed_asp.core.problem import PromptSet
from mindspeed_asp.workloads.prompts import load_prompt_set

PathLike = Union[str, Path]
ALPACA_COLUMNS = ("t0.0", "t0.3", "t0.5", "t0.7")
SPLITWISE_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")


@dataclass
class LengthTrace:
    """A loaded trace; unpacks as (prompts, history, truth) and carries the cap derived from the file."""

    prompts: PromptSet
    history: LengthHistory
    truth: np.ndarray  # int64 [G, n]
    max_new_tokens: int
    cap_source: str  # "declared" (the file says so) or "observed" (the longest length in the file)

    def __iter__(self) -> Iterator:
        return iter((self.prompts, self.history, self.truth))


def trace_cap(observed_max: int, declared: Optional[int], path: str) -> Tuple[int, str]:
    """(max_new_tokens, source): the declared cap when there is one (checked against the data), else the
    longest observed length (at least 1)."""
    observed_max = int(max(observed_max, 1))
    if declared is None:
        return observed_max, "observed"
    if observed_max > declared:
        raise InputError(f"a length of {observed_max} exceeds the declared max_new_tokens {declared}", path=path,
                         key="max_new_tokens")
    return int(declared), "declared"


def _length_value(rec: dict, key: str, path: str, line: int) -> int:
    if key not in rec:
        raise InputError("missing column", path=path, line=line, key=key)
    return length_value(rec[key], path=path, line=line, key=key, integral_floats=True)


def load_alpaca(path: PathLike, target: Optional[str] = "t0.7", prompt_len: int = 0) -> LengthTrace:
    """Read the alpaca length trace as (prompts, history, truth), with its cap (`max_new_tokens` on the
    records, or the longest of all four columns).

    With `target` one of t0.0/t0.3/t0.5/t0.7 the truth is that column, [G, 1], and the history holds the
    other three as epochs 0..2 (n = 1 each). With `target=None` the truth is all four columns, [G, 4]
    (a group of n = 4), and the history is empty.
    """
    if target is not None:
        target = target if target.startswith("t") else "t" + target
        if target not in ALPACA_COLUMNS:
            raise InputError(f"unknown target column {target!r}; choose one of {', '.join(ALPACA_COLUMNS)}",
                             key="target")
    spath = str(path)
    cols = [f"L_{c}" for c in ALPACA_COLUMNS]
    ids = []
    rows = []
    seen = {}
    declared: Optional[Tuple[int, int]] = None  # (cap, line)
    for line, rec in iter_json_objects(path):
        if "max_new_tokens" in rec:
            cap = declared_cap_value(rec["max_new_tokens"], spath, line)
            if declared is not None and cap != declared[0]:
                raise InputError(f"max_new_tokens {cap} differs from {declared[0]} declared on line {declared[1]}",
                                 path=spath, line=line, key="max_new_tokens")
            declared = declared or (cap, line)
        if "id" not in rec:
            raise InputError("missing column", path=spath, line=line, key="id")
        pid = str(rec["id"])
        if pid in seen:
            raise InputError(f"duplicate prompt id {pid!r} (first on line {seen[pid]})", path=spath, line=line,
                             key="id")
        seen[pid] = line
        ids.append(pid)
        rows.append([_length_value(rec, c, spath, line) for c in cols])
    if not ids:
        raise InputError("no records in file", path=spath)
    lengths = np.array(rows, dtype=np.int64)
    pid_arr = np.array(ids, dtype=object)
    cap, source = trace_cap(int(lengths.max()), declared[0] if declared else None, spath)
    hist = LengthHistory()
    hist.declared_cap = declared[0] if declared else None
    if target is None:
        prompts = PromptSet(pid_arr, np.full(len(ids), prompt_len, dtype=np.int64), n=4, origin=spath)
        return LengthTrace(prompts, hist, lengths, cap, source)
    t = ALPACA_COLUMNS.index(target)
    others = [k for k in range(len(ALPACA_COLUMNS)) if k != t]
    for epoch, k in enumerate(others):
        hist.add_epoch(pid_arr, epoch, lengths[:, k:k + 1])
    prompts = PromptSet(pid_arr, np.full(len(ids), prompt_len, dtype=np.int64), n=1, origin=spath)
    return LengthTrace(prompts, hist, lengths[:, t:t + 1].copy(), cap, source)


def load_splitwise(path: PathLike, n: int = 8) -> LengthTrace:
    """Read the splitwise CSV as (prompts, empty history, truth [G, n]) with groups of n consecutive requests;
    its cap is the longest decode length in the file (requests left out included)."""
    if n < 1:
        raise InputError("n must be >= 1", key="n")
    spath = str(path)
    p = Path(path)
    if not p.is_file():
        raise InputError("file not found", path=spath)
    prefill = []
    decode = []
    with io.StringIO(read_text(p), newline="") as fh:  # read_text names a line that is not UTF-8
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise InputError("empty file", path=spath)
        header = [h.strip() for h in header]
        for col in SPLITWISE_COLUMNS[1:]:
            if col not in header:
                raise InputError("missing column", path=spath, line=1, key=col)
        ip, idc = header.index("num_prefill_tokens"), header.index("num_decode_tokens")
        for lineno, row in enumerate(reader, start=2):
            if not row or not any(c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise InputError(f"expected {len(header)} fields, got {len(row)}", path=spath, line=lineno)
            vals = []
            for idx, name in ((ip, "num_prefill_tokens"), (idc, "num_decode_tokens")):
                try:
                    v = float(row[idx])
                except ValueError:
                    raise InputError(f"not a number: {row[idx]!r}", path=spath, line=lineno, key=name) from None
                if v < 0 or not np.isfinite(v) or not float(v).is_integer():
                    raise InputError(f"invalid length {row[idx]!r} (must be a non-negative integer)",
                                     path=spath, line=lineno, key=name)
                # a request generates at least one token; its prompt may be empty
                vals.append(length_value(v, path=spath, line=lineno, key=name, integral_floats=True,
                                         lo=0 if name == "num_prefill_tokens" else 1,
                                         what="prompt length" if name == "num_prefill_tokens" else "length"))
            prefill.append(vals[0])
            decode.append(vals[1])
    G = len(decode) // n
    if G == 0:
        raise InputError(f"fewer than n={n} requests in file", path=spath)
    left = len(decode) - G * n
    truth = np.array(decode[:G * n], dtype=np.int64).reshape(G, n)
    plen = np.rint(np.array(prefill[:G * n], dtype=np.float64).reshape(G, n).mean(axis=1)).astype(np.int64)
    ids = np.array([f"splitwise-{g}" for g in range(G)], dtype=object)
    if left:
        print(f"{spath}: last {left} requests do not fill a group of n={n}; left out", file=sys.stderr)
    cap, source = trace_cap(max(decode), None, spath)
    return LengthTrace(PromptSet(ids, plen, n=n, origin=spath), LengthHistory(), truth, cap, source)


def read_history_any(path: PathLike) -> LengthHistory:
    """A history from a Parquet history file, or from JSON Lines (a history file or a runtime rollout log:
    repeated (prompt_id, epoch) lines are merged)."""
    p = Path(path)
    if p.suffix.lower() in (".parquet", ".pq"):
        return LengthHistory.load(p)
    hist = LengthHistory()
    if p.suffix.lower() not in (".jsonl", ".ndjson"):
        raise InputError("length history must end in .parquet or .jsonl", path=str(p))
    if not p.is_file():
        raise InputError("length history file not found", path=str(p))
    hist.append_rollout_log(p)
    return hist


def load_history_trace(path: PathLike, epoch: Optional[int] = None, n: Optional[int] = None,
                       dataset: Optional[PathLike] = None) -> LengthTrace:
    """Back-test on a real run: epoch `epoch` (default the latest) of a history or rollout log is the truth,
    the epochs before it are the history. The cap is the one the file declares, else its longest length
    (all epochs).

    Groups are the prompts with at least n samples at that epoch (n defaults to the most common group size
    there; extra samples beyond n are ignored, prompts with fewer are left out with a note on stderr). With
    `dataset` (a prompt JSON Lines file) prompts keep the dataset's order and prompt lengths; without it they
    are sorted by id with prompt_len 0.
    """
    spath = str(path)
    full = read_history_any(path)
    epochs = full.epochs()
    if not epochs:
        raise InputError("no lengths in file", path=spath)
    e = epochs[-1] if epoch is None else int(epoch)
    if e not in epochs:
        raise InputError(f"no epoch {e} in file (epochs: {epochs})", path=spath, key="epoch")
    at = full.select_epochs(only=e)
    pid, _, offsets, _ = at.records()
    counts = np.diff(offsets)
    if n is None:
        vals, freq = np.unique(counts, return_counts=True)
        n = int(vals[np.argmax(freq)])
    if n < 1:
        raise InputError("n must be >= 1", key="n")
    if dataset is not None:
        ds = load_prompt_set(dataset, n=n)
        ids = ds.prompt_ids
    else:
        ds = None
        ids = pid
    mat = at.epoch_matrix(ids, e, n=n)
    ok = (mat >= 0).all(axis=1)
    if not ok.any():
        raise InputError(f"no prompt has {n} samples at epoch {e}", path=spath, key="epoch")
    if not ok.all():
        print(f"{spath}: {int((~ok).sum())} prompt(s) have fewer than n={n} samples at epoch {e}; left out",
              file=sys.stderr)
    keep = np.flatnonzero(ok)
    if ds is not None:
        prompts = ds.subset(keep)
    else:
        prompts = PromptSet(np.asarray(ids, dtype=object)[keep], np.zeros(len(keep), dtype=np.int64), n=n,
                            origin=spath)
    cap, source = trace_cap(full.max_length(), full.declared_cap, spath)
    return LengthTrace(prompts, full.select_epochs(before=e), mat[keep], cap, source)
