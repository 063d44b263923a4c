"""The DispatchPlan file: per iteration, per instance, the ordered prompt groups, with provenance.

Why a file: the offline pass runs once (on a login node), and every instance, the dispatcher and the
comparison tools read the same plan. The plan is a flat table, one row per prompt group:

    iteration, instance, position, row, prompt_id, pred_median, pred_group_max, minibatch

`row` is the group's row in the dataset (the PromptSet the plan was built for); iteration `i` covers the
contiguous dataset rows `[iteration_starts[i], iteration_starts[i+1])`, and the group index used by
`Assignment`s is `row - iteration_starts[i]`. A header holds the schema version and provenance (dataset
fingerprint, estimator, planner and its parameters, cost model, build time, package version, predicted
summary). Parquet keeps the header as JSON in the schema metadata; JSON Lines writes it as the first line.
Loading refuses an unknown schema version and, given the dataset, a fingerprint mismatch
(`PlanMismatchError`), so a plan can never silently drive another dataset. The header also records the
settings the plan depends on (`SETTINGS`: n, instances, slots, KV budget, minibatch, window, cap, lag bound,
stealing, planner) and `plan_fingerprint`, a hash of those with the dataset fingerprint: a loaded header whose
settings no longer hash to it was edited and is refused, and `check_settings` refuses a run whose settings
differ, naming the setting. Every column value is range-checked on read (minibatch tags >= -1, predictions
finite and >= 0, indices in range), naming the column and the line (JSON Lines) or row (Parquet), and a header
key given twice (json would keep the last silently) is refused naming it (`mindspeed_asp.utils.jsonl.loads`).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from mindspeed_asp.utils.atomic import atomic_open, atomic_path
from mindspeed_asp.errors import InputError, PlanMismatchError
from mindspeed_asp.utils.jsonl import iter_jsonl_objects, loads
from mindspeed_asp.core.limits import MAX_COUNT
from mindspeed_asp.core.problem import Assignment, PromptSet

SCHEMA_VERSION = 1
FORMAT = "mindspeed-asp/dispatch-plan"
META_KEY = b"mindspeed_asp.plan"
COLUMNS = ("iteration", "instance", "position", "row", "prompt_id", "pred_median", "pred_group_max", "minibatch")
_INT_COLS = ("iteration", "instance", "position", "row", "minibatch")
_FLOAT_COLS = ("pred_median", "pred_group_max")
#: The least value of each integer column: minibatch -1 is "untagged" (baselines; the trainer takes arrival order).
_INT_MIN = {"iteration": 0, "instance": 0, "position": 0, "row": 0, "minibatch": -1}
#: What a plan depends on besides its dataset: a run whose value differs would follow a plan made for another
#: configuration (queues sized for other slots, tags for another minibatch, a window or lag bound it was not
#: scored in). n is also part of the dataset fingerprint. Not here: the cost model and rho, which tune the
#: planner's choices but make no plan invalid (the runtime fits its own), and the seed.
SETTINGS = ("n", "instances", "slots", "kv_budget", "minibatch_groups", "groups_per_iteration", "max_new_tokens",
            "max_lag", "work_stealing", "planner")
#: The `asp plan` flag that sets each setting (for the message saying how to rebuild).
SETTING_FLAGS = {"n": "--n", "instances": "--instances", "slots": "--slots", "kv_budget": "--kv-budget",
                 "minibatch_groups": "--minibatch", "groups_per_iteration": "--groups-per-iteration",
                 "max_new_tokens": "--max-new-tokens", "max_lag": "--max-lag", "work_stealing": "--no-work-stealing",
                 "planner": "--planner"}
PathLike = Union[str, Path]


def plan_fingerprint(header: Mapping[str, Any]) -> str:
    """Hash of the dataset fingerprint and the SETTINGS the header records: the plan's identity."""
    fields = {k: header[k] for k in ("dataset_fingerprint",) + SETTINGS if k in header}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=_json_default).encode()).hexdigest()[:16]


def _rebuild_hint(key: str, want: Any) -> str:
    flag = SETTING_FLAGS.get(key, key)
    if key == "work_stealing":
        return "asp plan without --no-work-stealing" if want else "asp plan --no-work-stealing"
    if want is None:
        return f"asp plan without {flag}"
    return f"asp plan {flag} {want}"


def plan_format(path: PathLike, fmt: Optional[str] = None) -> str:
    """'parquet' or 'jsonl', from `fmt` or the file extension."""
    if fmt:
        if fmt not in ("parquet", "jsonl"):
            raise InputError(f"unknown plan format {fmt!r} (use parquet or jsonl)", path=str(path))
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    raise InputError("plan file must end in .parquet or .jsonl", path=str(path))


class DispatchPlan:
    """A loaded or freshly built plan. Columns are numpy arrays; `header` is the provenance mapping."""

    def __init__(self, header: Dict[str, Any], columns: Dict[str, np.ndarray], path: str = "") -> None:
        self.header = dict(header)
        self.path = path
        self.cols = {k: np.asarray(columns[k]) for k in COLUMNS}
        for k in _INT_COLS:
            self.cols[k] = self.cols[k].astype(np.int64)
        for k in _FLOAT_COLS:
            self.cols[k] = self.cols[k].astype(np.float64)
        self.cols["prompt_id"] = self.cols["prompt_id"].astype(object)
        self._check_consistency()
        self._index_rows()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_assignments(cls, prompts: PromptSet, iteration_starts: List[int], assignments: List[Assignment],
                         pred_median: np.ndarray, pred_group_max: np.ndarray, header: Dict[str, Any]
                         ) -> "DispatchPlan":
        """Assemble a plan from one Assignment per iteration (indices local to each iteration's rows).

        `pred_median`/`pred_group_max` are per dataset row. `header` is provenance; schema version,
        fingerprint and shape fields are filled in here.
        """
        starts = [int(s) for s in iteration_starts]
        if len(starts) != len(assignments) + 1 or starts[0] != 0 or starts[-1] != len(prompts):
            raise ValueError("iteration_starts must run from 0 to len(prompts) with one entry per iteration + 1")
        parts: Dict[str, List[np.ndarray]] = {k: [] for k in COLUMNS}
        for it, a in enumerate(assignments):
            lo, hi = starts[it], starts[it + 1]
            a.validate(hi - lo)
            for j, order in enumerate(a.orders):
                local = np.asarray(order, dtype=np.int64)
                rows = local + lo
                parts["iteration"].append(np.full(len(local), it, dtype=np.int64))
                parts["instance"].append(np.full(len(local), j, dtype=np.int64))
                parts["position"].append(np.arange(len(local), dtype=np.int64))
                parts["row"].append(rows)
                parts["prompt_id"].append(np.asarray(prompts.prompt_ids, dtype=object)[rows])
                parts["pred_median"].append(np.asarray(pred_median, dtype=np.float64)[rows])
                parts["pred_group_max"].append(np.asarray(pred_group_max, dtype=np.float64)[rows])
                parts["minibatch"].append(np.asarray(a.minibatch, dtype=np.int64)[local])
        cols = {k: (np.concatenate(v) if v else np.zeros(0, dtype=object if k == "prompt_id" else np.float64))
                for k, v in parts.items()}
        instances = max((len(a.orders) for a in assignments), default=0)
        head = dict(header)
        head.update({
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "dataset_fingerprint": prompts.fingerprint(),
            "dataset_origin": prompts.origin,
            "num_groups": len(prompts),
            "n": prompts.n,
            "instances": int(head.get("instances", instances)),
            "iteration_starts": starts,
            # iterations dispatched from one shared queue in the plan's order (Assignment.shared)
            "shared_iterations": [it for it, a in enumerate(assignments) if a.shared],
            # dataset rows of the groups the plan isolated (Assignment.isolated): while one runs, its instance
            # steals nothing
            "isolated_rows": sorted(int(g) + starts[it] for it, a in enumerate(assignments) for g in a.isolated),
        })
        head["plan_fingerprint"] = plan_fingerprint(head)
        return cls(head, cols)

    # ------------------------------------------------------------------ checks
    def _check_consistency(self) -> None:
        h, c = self.header, self.cols
        where = self.path or "<plan>"
        starts = h.get("iteration_starts")
        if not isinstance(starts, list) or len(starts) < 1:
            raise InputError("header lacks iteration_starts", path=where, key="iteration_starts")
        G = int(h.get("num_groups", -1))
        if starts[0] != 0 or starts[-1] != G or any(b < a for a, b in zip(starts, starts[1:])):
            raise InputError("iteration_starts must rise from 0 to num_groups", path=where, key="iteration_starts")
        rows = c["row"]
        if len(rows) != G or (G and (np.sort(rows) != np.arange(G)).any()):
            raise InputError(f"plan must place each of {G} dataset rows exactly once", path=where, key="row")
        it_of_row = np.searchsorted(np.asarray(starts[1:]), rows, side="right")
        if (it_of_row != c["iteration"]).any():
            raise InputError("a row sits outside its iteration's range", path=where, key="iteration")
        m = int(h.get("instances", 0))
        if G and (c["instance"].min() < 0 or c["instance"].max() >= m):
            raise InputError(f"instance index outside 0..{m - 1}", path=where, key="instance")
        shared = h.get("shared_iterations", [])
        if not isinstance(shared, list) or any(not isinstance(i, int) or not 0 <= i < len(starts) - 1
                                                for i in shared):
            raise InputError(f"shared_iterations must list iteration indices in 0..{len(starts) - 2}",
                             path=where, key="shared_iterations")
        isolated = h.get("isolated_rows", [])
        if not isinstance(isolated, list) or any(not isinstance(r, int) or not 0 <= r < G for r in isolated):
            raise InputError(f"isolated_rows must list dataset rows in 0..{G - 1}", path=where, key="isolated_rows")

    def check_dataset(self, prompts: PromptSet) -> None:
        """Refuse a plan built for another dataset (ids, prompt lengths, n or order differ)."""
        want = self.header.get("dataset_fingerprint")
        got = prompts.fingerprint()
        if want != got:
            raise PlanMismatchError(
                f"plan {self.path or '<plan>'} was built for dataset fingerprint {want} "
                f"({self.header.get('dataset_origin') or 'unknown file'}, {self.header.get('num_groups')} groups, "
                f"n={self.header.get('n')}), but {prompts.origin or 'the dataset'} has fingerprint {got} "
                f"({len(prompts)} groups, n={prompts.n}); rebuild the plan with `asp plan --dataset ...`")

    def check_settings(self, expected: Mapping[str, Any], keys: Optional[Mapping[str, str]] = None) -> List[str]:
        """Refuse a plan built with other settings than `expected` (setting -> the run's value; see SETTINGS),
        naming the first that differs, both values and the `asp plan` line that rebuilds it. `keys` names the
        run's own key of each setting in the message (asp.slots, ...). Returns the settings the header does not
        record (a header made by hand or by code that fills a partial one): those are not checked, and the
        caller says so. `groups_per_iteration` compares the windows as cut: both sides capped at num_groups."""
        unchecked = []
        for key, want in expected.items():
            if key not in self.header:
                unchecked.append(key)
                continue
            have = self.header[key]
            if key == "groups_per_iteration" and have is not None and want is not None:
                have, want = min(int(have), self.num_groups), min(int(want), self.num_groups)
            if have != want:
                run_key = (keys or {}).get(key, key)
                raise PlanMismatchError(
                    f"plan {self.path or '<plan>'} was built with {key}={have!r}, but the run has "
                    f"{run_key}={want!r}; rebuild the plan for this run (`{_rebuild_hint(key, want)}`)")
        return unchecked

    # ------------------------------------------------------------------ indexing
    def _index_rows(self) -> None:
        c = self.cols
        # Sort once by (iteration, instance, position) so queues are contiguous slices.
        key = np.lexsort((c["position"], c["instance"], c["iteration"]))
        self.cols = {k: v[key] for k, v in c.items()}
        c = self.cols
        m = self.instances
        cell = c["iteration"] * m + c["instance"]
        self._cell_bounds = np.searchsorted(cell, np.arange(self.num_iterations * m + 1))
        self._by_id: Dict[str, int] = {}
        for i, pid in enumerate(c["prompt_id"].tolist()):
            self._by_id.setdefault(str(pid), i)

    @property
    def fingerprint(self) -> str:
        return str(self.header["dataset_fingerprint"])

    @property
    def instances(self) -> int:
        return int(self.header["instances"])

    @property
    def num_iterations(self) -> int:
        return len(self.header["iteration_starts"]) - 1

    @property
    def num_groups(self) -> int:
        return int(self.header["num_groups"])

    def iterations(self) -> List[int]:
        """Iteration indices in order (0..I-1)."""
        return list(range(self.num_iterations))

    def _cell(self, iteration: int, instance: int) -> slice:
        if not 0 <= iteration < self.num_iterations:
            raise IndexError(f"iteration {iteration} outside 0..{self.num_iterations - 1}")
        if not 0 <= instance < self.instances:
            raise IndexError(f"instance {instance} outside 0..{self.instances - 1}")
        k = iteration * self.instances + instance
        return slice(int(self._cell_bounds[k]), int(self._cell_bounds[k + 1]))

    def instance_queue(self, iteration: int, instance: int) -> List[str]:
        """Prompt ids of one instance's queue in one iteration, in plan (dispatch) order."""
        return [str(p) for p in self.cols["prompt_id"][self._cell(iteration, instance)]]

    def instance_rows(self, iteration: int, instance: int) -> np.ndarray:
        """Dataset rows of one instance's queue, in plan order."""
        return self.cols["row"][self._cell(iteration, instance)].copy()

    def iteration_rows(self, iteration: int) -> np.ndarray:
        """Dataset rows of an iteration, in the order of its PromptSet (Assignment indices refer to these)."""
        s = self.header["iteration_starts"]
        return np.arange(s[iteration], s[iteration + 1], dtype=np.int64)

    def iteration_prompts(self, iteration: int, prompts: PromptSet) -> PromptSet:
        """The iteration's PromptSet (rows of `prompts`), after checking the dataset fingerprint."""
        self.check_dataset(prompts)
        return prompts.subset(self.iteration_rows(iteration))

    def assignment(self, iteration: int) -> Assignment:
        """The iteration as an Assignment: group indices into that iteration's PromptSet rows."""
        start = self.header["iteration_starts"][iteration]
        lo, hi = self.header["iteration_starts"][iteration], self.header["iteration_starts"][iteration + 1]
        orders = [self.cols["row"][self._cell(iteration, j)] - start for j in range(self.instances)]
        tags = np.full(hi - lo, -1, dtype=np.int64)
        sl = slice(int(self._cell_bounds[iteration * self.instances]),
                   int(self._cell_bounds[(iteration + 1) * self.instances]))
        tags[self.cols["row"][sl] - start] = self.cols["minibatch"][sl]
        params = self.iteration_params(iteration)
        a = Assignment(orders=orders, minibatch=tags, planner=str(self.header.get("planner", "")), params=params,
                       shared=self.is_shared(iteration), isolated=self.isolated_rows(iteration) - start)
        a.validate(hi - lo)
        return a

    def is_shared(self, iteration: int) -> bool:
        """Whether the iteration's groups wait in one shared queue (read position by position across the
        instances' queues) for the least-loaded instance, instead of in per-instance queues."""
        return int(iteration) in set(self.header.get("shared_iterations") or [])

    def isolated_rows(self, iteration: int) -> np.ndarray:
        """Dataset rows of the iteration's isolated groups (`Assignment.isolated`): while one of them runs, its
        instance steals nothing. Plans written before isolation existed have none."""
        lo, hi = self.header["iteration_starts"][iteration], self.header["iteration_starts"][iteration + 1]
        rows = np.asarray(self.header.get("isolated_rows") or [], dtype=np.int64)
        return rows[(rows >= lo) & (rows < hi)]

    def isolated_ids(self, iteration: int) -> List[str]:
        """Prompt ids of the iteration's isolated groups."""
        ids = np.asarray(self.cols["prompt_id"])[np.argsort(self.cols["row"])]
        return [str(ids[r]) for r in self.isolated_rows(iteration)]

    def shared_queue(self, iteration: int) -> List[str]:
        """The prompt ids of a shared iteration in the order its queue hands them out."""
        from mindspeed_asp.core.policy import shared_queue_order

        return shared_queue_order([self.instance_queue(iteration, j) for j in range(self.instances)])

    def iteration_params(self, iteration: int) -> Dict[str, float]:
        per = self.header.get("planner_params") or []
        return dict(per[iteration]) if iteration < len(per) else {}

    def _lookup(self, prompt_id: str) -> int:
        try:
            return self._by_id[str(prompt_id)]
        except KeyError:
            raise KeyError(f"prompt id {prompt_id!r} is not in plan {self.path or '<plan>'}") from None

    def minibatch_of(self, prompt_id: str) -> int:
        """Minibatch tag of a prompt group within its iteration (-1 = untagged, arrival order)."""
        return int(self.cols["minibatch"][self._lookup(prompt_id)])

    def iteration_of(self, prompt_id: str) -> int:
        return int(self.cols["iteration"][self._lookup(prompt_id)])

    def predicted(self, prompt_id: str) -> Dict[str, float]:
        i = self._lookup(prompt_id)
        return {"median": float(self.cols["pred_median"][i]), "group_max": float(self.cols["pred_group_max"][i])}

    # ------------------------------------------------------------------ files
    def save(self, path: PathLike, fmt: Optional[str] = None) -> Path:
        """Write the plan as Parquet (header in schema metadata) or JSON Lines (header line + rows), atomically:
        an interrupted save leaves the previous plan, never part of a new one."""
        path = Path(path)
        kind = plan_format(path, fmt)
        header = json.dumps(self.header, sort_keys=True, default=_json_default)
        if kind == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            arrays = {k: pa.array(self.cols[k].tolist() if k == "prompt_id" else self.cols[k],
                                  type=pa.string() if k == "prompt_id" else None) for k in COLUMNS}
            table = pa.table(arrays).replace_schema_metadata({META_KEY: header.encode()})
            with atomic_path(path) as tmp:
                pq.write_table(table, str(tmp))
        else:
            with atomic_open(path) as fh:
                fh.write(header + "\n")
                cols = {k: self.cols[k].tolist() for k in COLUMNS}
                for i in range(len(cols["row"])):
                    fh.write(json.dumps({k: cols[k][i] for k in COLUMNS}) + "\n")
        return path

    @classmethod
    def load(cls, path: PathLike, prompts: Optional[PromptSet] = None, fmt: Optional[str] = None
             ) -> "DispatchPlan":
        """Read a plan; with `prompts`, refuse it unless it was built for exactly that dataset."""
        path = Path(path)
        if not path.is_file():
            raise InputError("plan file not found", path=str(path))
        kind = plan_format(path, fmt)
        header, cols = (_read_parquet(path) if kind == "parquet" else _read_jsonl(path))
        _check_header(header, str(path))
        plan = cls(header, cols, path=str(path))
        if prompts is not None:
            plan.check_dataset(prompts)
        return plan


def load_plan(path: PathLike, prompts: Optional[PromptSet] = None) -> DispatchPlan:
    """Shorthand for `DispatchPlan.load`."""
    return DispatchPlan.load(path, prompts)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def _check_header(header: Any, where: str) -> None:
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise InputError("not a mindspeed-asp dispatch plan (missing plan header)", path=where)
    version = header.get("schema_version")
    if version != SCHEMA_VERSION:
        raise PlanMismatchError(
            f"{where}: plan schema version {version!r} is not supported (this mindspeed-asp reads version "
            f"{SCHEMA_VERSION}); rebuild the plan with this version's `asp plan`")
    for key in ("dataset_fingerprint", "num_groups", "instances", "iteration_starts"):
        if key not in header:
            raise InputError("plan header lacks a required field", path=where, key=key)
    for key in ("num_groups", "instances"):
        v = header[key]
        if isinstance(v, bool) or not isinstance(v, int) or not (0 if key == "num_groups" else 1) <= v <= MAX_COUNT:
            raise InputError(f"expected an integer in {0 if key == 'num_groups' else 1} .. {MAX_COUNT}, got {v!r}",
                             path=where, key=key)
    starts = header["iteration_starts"]
    if not isinstance(starts, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in starts):
        raise InputError("iteration_starts must be a list of integers", path=where, key="iteration_starts")
    # Plans written before plan_fingerprint existed have none: their recorded settings are still compared by
    # check_settings (they have held them since schema version 1), only an edit of the header goes unnoticed.
    stored = header.get("plan_fingerprint")
    if stored is not None and stored != plan_fingerprint(header):
        raise PlanMismatchError(
            f"{where}: the header's settings ({', '.join(k for k in SETTINGS if k in header)}) no longer hash to "
            f"its plan_fingerprint {stored} (they give {plan_fingerprint(header)}): the header was edited after "
            "`asp plan` wrote it; rebuild the plan with `asp plan` instead of editing it")


def _read_parquet(path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"cannot read Parquet: {exc}", path=str(path)) from None
    meta = table.schema.metadata or {}
    if META_KEY not in meta:
        raise InputError("not a mindspeed-asp dispatch plan (no plan header in the Parquet metadata)",
                         path=str(path))
    try:
        text = meta[META_KEY].decode()
    except UnicodeDecodeError:
        raise InputError("plan header is not UTF-8 text", path=str(path), key=META_KEY.decode()) from None
    header = loads(text, path, line=None, key=META_KEY.decode())  # invalid JSON, a key given twice: named
    _check_header(header, str(path))
    missing = [k for k in COLUMNS if k not in table.column_names]
    if missing:
        raise InputError("plan table lacks a column", path=str(path), key=missing[0])
    cols = {k: np.asarray(table.column(k).to_numpy(zero_copy_only=False)) for k in COLUMNS}
    for k in COLUMNS:
        if table.column(k).null_count:
            row = int(np.flatnonzero(np.asarray(table.column(k).is_null()))[0])
            raise InputError(f"row {row + 1}: null value", path=str(path), key=k)
    for k in _INT_COLS:
        if cols[k].dtype.kind not in "iu":
            raise InputError(f"expected an integer column, got {cols[k].dtype}", path=str(path), key=k)
    for k in _FLOAT_COLS:
        if cols[k].dtype.kind not in "iuf":
            raise InputError(f"expected a numeric column, got {cols[k].dtype}", path=str(path), key=k)
    _check_values(cols, str(path), lines=None)
    return header, cols


def _read_jsonl(path: Path):
    header = None
    rows: Dict[str, list] = {k: [] for k in COLUMNS}
    lines: List[int] = []
    for lineno, rec in iter_jsonl_objects(path):  # bad JSON, a non-object or non-UTF-8 names the line
        if header is None:
            header = rec
            _check_header(header, str(path))
            continue
        for k in COLUMNS:
            if k not in rec:
                raise InputError("plan row lacks a field", path=str(path), line=lineno, key=k)
            v = rec[k]
            if k in _INT_COLS and (isinstance(v, bool) or not isinstance(v, int)):
                raise InputError(f"expected an integer, got {v!r}", path=str(path), line=lineno, key=k)
            if k in _FLOAT_COLS and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise InputError(f"expected a number, got {v!r}", path=str(path), line=lineno, key=k)
            if k == "prompt_id" and not isinstance(v, str):
                raise InputError(f"expected a string, got {v!r}", path=str(path), line=lineno, key=k)
            if k in _INT_COLS and not _INT_MIN[k] <= v <= MAX_COUNT:  # before numpy: a huge one overflows int64
                raise InputError(_range_message(k, v), path=str(path), line=lineno, key=k)
            rows[k].append(v)
        lines.append(lineno)
    if header is None:
        raise InputError("empty plan file", path=str(path))
    cols = {k: np.asarray(v, dtype=object if k == "prompt_id" else None) for k, v in rows.items()}
    for k in _INT_COLS:
        cols[k] = cols[k].astype(np.int64) if len(cols[k]) else np.zeros(0, dtype=np.int64)
    for k in _FLOAT_COLS:
        cols[k] = cols[k].astype(np.float64) if len(cols[k]) else np.zeros(0)
    _check_values(cols, str(path), lines=lines)
    return header, cols


def _range_message(key: str, value: Any) -> str:
    if key == "minibatch":
        return f"minibatch tag {value} is out of range: a tag is >= 0, or -1 for an untagged group"
    return f"{key} {value} is out of range: {_INT_MIN[key]} .. {MAX_COUNT}"


def _check_values(cols: Dict[str, np.ndarray], where: str, lines: Optional[Sequence[int]]) -> None:
    """Refuse a value no plan holds: an index or tag out of range, a prediction that is NaN, infinite or
    negative (the dispatcher ranks groups by them). Names the column and the line (`lines`, JSON Lines) or
    the row (Parquet)."""
    def refuse(key: str, i: int, message: str) -> None:
        if lines is not None:
            raise InputError(message, path=where, line=int(lines[i]), key=key)
        raise InputError(f"row {i + 1}: {message}", path=where, key=key)

    for k in _INT_COLS:
        v = np.asarray(cols[k])
        bad = np.flatnonzero((v < _INT_MIN[k]) | (v > MAX_COUNT))
        if len(bad):
            refuse(k, int(bad[0]), _range_message(k, int(v[bad[0]])))
    for k in _FLOAT_COLS:
        v = np.asarray(cols[k], dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(v) | (v < 0))
        if len(bad):
            refuse(k, int(bad[0]), f"prediction {float(v[bad[0]])!r} is not a finite number >= 0")
