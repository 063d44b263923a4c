"""`asp compare RUN...`: side-by-side table of runs with ratios against the first one.

A run is anything a loader can turn into a summary dict with docs/design.md#metrics names: a run directory
written by `asp train` (its summary.json), or a MindSpeed-RL training log file (through the integration's
log reader, when installed). Loaders are pluggable: `register_loader(predicate, loader)`.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from mindspeed_asp.errors import InputError
from mindspeed_asp.utils.jsonl import loads
from mindspeed_asp.core.metrics import E2E_TPS_TEXT, devices_of, rho_stock
from mindspeed_asp.utils.run_report import EVENTS, any_events, run_events
from mindspeed_asp.utils.textfile import read_text

Loader = Callable[[Path], Dict[str, Any]]
MSRL_SOURCE = "mindspeed-rl log"
_LOADERS: List[Tuple[Callable[[Path], bool], Loader]] = []

#: (column title, summary keys tried in order, ratio sense): +1 higher is better, -1 lower is better, 0 none.
Column = Tuple[str, Tuple[str, ...], int]

#: ASP run directories: docs/design.md#metrics names (MindSpeed-RL's names as fall-backs).
COLUMNS: List[Column] = [
    ("e2e_tps", ("throughput/e2e_tps", "e2e_tps"), +1),
    ("rollout tok/s", ("throughput/rollout_tps", "vllm_tps"), +1),
    ("iter s", ("time/iteration", "timing/all"), -1),
    ("pad", ("bubble/padding",), 0),
    ("skew", ("bubble/skewness",), 0),
    ("sort", ("bubble/sorting",), 0),
    ("lag mean", ("lag/mean",), 0),
    ("lag max", ("lag/max",), 0),
    ("reward", ("reward/final",), 0),
]

#: Appended when any run set a target reward (run.target_reward): how soon it was reached, in updates and in
#: seconds from the first dispatch (trailing mean of 3 updates; "-" = not reached). With the final reward at
#: equal updates this shows both sides of the trade-off: asynchronous runs are faster per update but each
#: update may learn less.
LEARNING_COLUMNS: List[Column] = [
    ("upd to R*", ("learning/updates_to_target",), 0),
    ("s to R*", ("learning/seconds_to_target",), -1),
]

#: Used as soon as one run is a MindSpeed-RL log, so stock MindSpeed-RL and ASP line up under MindSpeed-RL's
#: own metric names; an ASP run directory answers with its docs/design.md#metrics names.
MSRL_COLUMNS: List[Column] = [
    ("e2e_tps", ("e2e_tps", "throughput/e2e_tps"), +1),
    ("vllm_tps", ("vllm_tps", "throughput/rollout_tps"), +1),
    ("timing/all", ("timing/all", "time/iteration"), -1),
    ("timing/rollout", ("timing/rollout", "time/rollout"), -1),
    ("timing/update", ("timing/update", "time/train"), -1),
    ("resp len mean", ("response_length/mean", "length/trained_mean"), 0),
    ("resp len max", ("response_length/max",), 0),
    ("lag max", ("lag/max",), 0),
    ("reward", ("reward/final", "grpo/score/mean"), 0),
]


#: Appended when any run logged the off-policy correction: the reference trainer's `offpolicy/*` summary keys,
#: or the `asp/*` keys the MindSpeed-RL loss patch adds to MindSpeed-RL's actor metrics.
OFFPOLICY_COLUMNS: List[Column] = [
    ("tok lag", ("lag/token_weighted_mean",), 0),
    ("|prox-behav|", ("offpolicy/behav_prox_absdiff_mean", "asp/behav_prox_absdiff_mean"), 0),
    ("iw mean", ("offpolicy/iw_mean", "asp/iw_mean"), 0),
    ("iw max", ("offpolicy/iw_max", "asp/iw_max"), 0),
    ("iw capped", ("offpolicy/iw_frac_capped", "asp/iw_frac_capped"), 0),
    ("clip", ("offpolicy/clip_frac", "asp/clip_frac"), 0),
]


#: Appended when a stock run is among those compared: each run's train time per update over the stock run's
#: rollout time per update (rho against stock's measured rollout, docs/design.md#rho-and-rho_stock).
RHO_STOCK_KEY = "rho/stock"
RHO_COLUMNS: List[Column] = [("rho_stock", (RHO_STOCK_KEY,), 0)]


#: Appended when any run had an unusual event (an instance died, groups were re-dispatched, regenerated or
#: dropped as stale; steals are shown beside them): counts over the whole run, from `run_report.run_events`.
#: Omitted otherwise, so the ordinary table stays narrow.
EVENT_COLUMNS: List[Column] = [(title, (key,), 0) for key, title, _ in EVENTS]


def _value(run: Dict[str, Any], keys: Sequence[str]) -> Any:
    for key in keys:
        if run.get(key) is not None:
            return run[key]
    return None


def register_loader(predicate: Callable[[Path], bool], loader: Loader, first: bool = False) -> None:
    """Teach compare a new kind of run (e.g. MindSpeed-RL logs); earlier loaders win."""
    if first:
        _LOADERS.insert(0, (predicate, loader))
    else:
        _LOADERS.append((predicate, loader))


def load_run_dir(path: Path) -> Dict[str, Any]:
    """A run directory written by `asp train`/`asp demo`."""
    f = path / "summary.json"
    data = loads(read_text(f), f)  # names a line that is not UTF-8, invalid JSON or a key given twice
    if not isinstance(data, dict):
        raise InputError("summary must be a JSON object", path=str(f))
    data.setdefault("name", path.name)
    return data


def _mindspeed_log_loader() -> Optional[Loader]:
    """The MindSpeed-RL log reader (integrations.mindspeed_rl.log_reader), when that module is present."""
    try:
        from mindspeed_asp.integrations.mindspeed_rl.log_reader import read_training_log
    except ImportError:
        return None

    def load(p: Path) -> Dict[str, Any]:
        summary = read_training_log(p)
        summary.pop("per_iteration", None)
        summary.setdefault("name", p.name)
        summary.setdefault("mode", "mindspeed-rl log")
        summary["source"] = MSRL_SOURCE
        return summary

    return load


register_loader(lambda p: p.is_dir() and (p / "summary.json").is_file(), load_run_dir)


def load_run(path: str | Path) -> Dict[str, Any]:
    """Turn a run directory or a log file into a summary dict; errors name the path."""
    p = Path(path)
    if not p.exists():
        raise InputError("no such run directory or log file", path=str(p))
    for pred, loader in _LOADERS:
        if pred(p):
            return loader(p)
    if p.is_file():
        log_loader = _mindspeed_log_loader()
        if log_loader is not None:
            return log_loader(p)
        raise InputError("a file is read as a MindSpeed-RL log, but the log reader "
                         "(mindspeed_asp.integrations.mindspeed_rl.log_reader) is not available", path=str(p))
    raise InputError("not a run directory (no summary.json)", path=str(p))


def interrupted_mark(run: Dict[str, Any]) -> str:
    """` [interrupted k/N]` for a partial run (a summary written when SIGINT/SIGTERM stopped it), else ""."""
    if not run.get("interrupted"):
        return ""
    return f" [interrupted {run.get('steps', '?')}/{run.get('steps_planned', '?')}]"


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def _is_stock(run: Dict[str, Any]) -> bool:
    """A stock run: the runtime's stock mode or a stock MindSpeed-RL log (mode `mindspeed-rl`)."""
    return run.get("mode") in ("stock", "mindspeed-rl")


def with_rho_stock(runs: Sequence[Dict[str, Any]]) -> Tuple[List[Dict[str, Any]], Optional[str]]:
    """The runs with `rho/stock` added (train time per update / the first stock run's rollout time per update)
    and that stock run's name; unchanged and None without a stock run that measured its rollout."""
    stock = next((r for r in runs if _is_stock(r) and (r.get("time/rollout") or 0) > 0), None)
    if stock is None:
        return list(runs), None
    out = []
    for r in runs:
        train = r.get("time/train")
        out.append({**r, RHO_STOCK_KEY: rho_stock(train, stock["time/rollout"])}
                   if isinstance(train, (int, float)) else dict(r))
    return out, str(stock.get("name", "?"))


def devices_notes(runs: Sequence[Dict[str, Any]]) -> List[str]:
    """Which devices each run's e2e_tps divided by, and warnings where a figure was computed another way (a
    summary without a `devices` record divided by the rollout instances only)."""
    parts, old = [], []
    for r in runs:
        name = str(r.get("name", "?"))
        d = devices_of(r)
        if d is not None:
            parts.append(f"{name} {d.describe()}")
        elif r.get("source") == MSRL_SOURCE:
            n = r.get("asp/devices")  # logged by ASP's asynchronous fit; stock MindSpeed-RL logs no count
            parts.append(f"{name} {int(n)} (MindSpeed-RL's world size)" if isinstance(n, (int, float)) and n > 0
                         else f"{name} MindSpeed-RL's world size (not in the log)")
        else:
            parts.append(f"{name} unknown")
            old.append(name)
    notes = [f"e2e_tps = {E2E_TPS_TEXT}; devices: " + ", ".join(parts)]
    if old:
        notes.append("warning: " + ", ".join(old) + " recorded no devices (its e2e_tps divided by the rollout "
                     "instances only), so e2e_tps ratios with it are not like-for-like; re-run it or compare "
                     "iteration times")
    return notes


def compare_table(runs: Sequence[Dict[str, Any]],
                  columns: Optional[Sequence[Column]] = None) -> Tuple[List[str], List[List[str]]]:
    """Header and rows; ratio columns read `value (x ratio)` against the first run (x > 1 = better)."""
    runs = [{**r, **run_events(r)} for r in runs]  # the event counts, as EVENT_COLUMNS read them
    if columns is None:
        columns = MSRL_COLUMNS if any(r.get("source") == MSRL_SOURCE for r in runs) else COLUMNS
        if any(_value(r, keys) is not None for r in runs for _, keys, _ in OFFPOLICY_COLUMNS[1:]):
            columns = list(columns) + OFFPOLICY_COLUMNS
        if any(r.get("learning/target_reward") is not None for r in runs):
            columns = list(columns) + LEARNING_COLUMNS
        if any(r.get(RHO_STOCK_KEY) is not None for r in runs):
            columns = list(columns) + RHO_COLUMNS
        if any(any_events(r) for r in runs):
            columns = list(columns) + EVENT_COLUMNS
    header = ["run", "mode"] + [c[0] for c in columns]
    base = runs[0]
    rows = []
    for r in runs:
        row = [str(r.get("name", "?")) + interrupted_mark(r), str(r.get("mode", "?"))]
        for _, keys, sense in columns:
            v = _value(r, keys)
            cell = _fmt(v)
            b = _value(base, keys)
            if sense and r is not base and isinstance(v, (int, float)) and isinstance(b, (int, float)) \
                    and v > 0 and b > 0:
                ratio = v / b if sense > 0 else b / v
                cell += f" (x{ratio:.2f})"
            row.append(cell)
        rows.append(row)
    return header, rows


def format_table(header: List[str], rows: List[List[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def compare_runs(paths: Sequence[str | Path]) -> Tuple[str, List[Dict[str, Any]]]:
    """The printed table and the loaded summaries (used by `asp demo` too)."""
    runs, stock_name = with_rho_stock([load_run(p) for p in paths])
    header, rows = compare_table(runs)
    note = "ratios vs the first run, x > 1 is better (throughput higher, times lower)"
    if stock_name is not None:
        note += (f"; rho_stock = train s per update / the rollout s per update of stock run {stock_name} "
                 "(docs/design.md#rho-and-rho_stock)")
    targets = sorted({r["learning/target_reward"] for r in runs if r.get("learning/target_reward") is not None})
    if targets:
        note += ("; reward = mean of the last quarter of the updates; R* = target reward "
                 + "/".join(f"{t:g}" for t in targets) + " (trailing mean of 3 updates, '-' = not reached)")
    if any(r.get("interrupted") for r in runs):
        note += ("; [interrupted k/N] = stopped by a signal after k of N updates, its figures cover those k "
                 "(asp train --resume continues it)")
    return "\n".join([format_table(header, rows), note] + devices_notes(runs)), runs


def handler(args: argparse.Namespace) -> int:
    from mindspeed_asp.utils.atomic import check_output_file, write_json

    if args.json:
        check_output_file(args.json, key="--json")  # before reading the runs
    table, runs = compare_runs(args.runs)
    print(table)
    if args.json:
        write_json(args.json, runs, key="--json", indent=2)  # atomic: temp file + rename
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("compare", help="side-by-side table of runs (run dirs or MindSpeed-RL logs)",
                              description=__doc__)
    p.add_argument("runs", nargs="+", help="run directories (summary.json) or MindSpeed-RL log files")
    p.add_argument("--json", help="also write the loaded summaries as a JSON list")
    p.set_defaults(func=handler)
