"""Read MindSpeed-RL training logs so stock runs and ASP runs compare line by line in `asp compare`.

MindSpeed-RL's `Loggers.handle_msg` prints one line per iteration:
`[2026-04-22 10:00:00] iteration: 3 / 500 | timing/all : 73.1234 | e2e_tps : 220.0000 | actor/lr : 1.000000e-06`
(often behind a logging prefix such as `2026-04-22 10:00:00,123 - INFO - `, or Ray's `(train pid=123)`).
ASP's trainer logs through the same logger with the same names plus the ASP metrics, so this one reader
serves both kinds of run.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Dict, List, Optional

from mindspeed_asp.errors import InputError

_ITER = re.compile(r"iteration:\s*(\d+)\s*/\s*(\d+)\s*\|(.*)$")
_NUM = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$|^[-+]?(?:nan|inf|infinity)$", re.IGNORECASE)

# The headline numbers `asp compare` sets side by side (MindSpeed-RL names, docs/design.md#metrics).
HEADLINE = ("e2e_tps", "vllm_tps", "update_tps", "timing/all", "timing/rollout", "timing/update",
            "response_length/mean", "response_length/max", "prompt_length/mean", "grpo/score/mean")


def parse_line(line: str) -> Optional[Dict[str, Any]]:
    """One iteration record {'iteration', 'train_iters', metrics...} from a log line, or None."""
    m = _ITER.search(line)
    if not m:
        return None
    rec: Dict[str, Any] = {"iteration": int(m.group(1)), "train_iters": int(m.group(2))}
    for field in m.group(3).split("|"):
        if ":" not in field:
            continue
        key, _, raw = field.rpartition(" : ") if " : " in field else field.partition(":")
        key, raw = key.strip(), raw.strip()
        if key and _NUM.match(raw):
            rec[key] = float(raw)
    return rec


def read_iterations(path: str | Path) -> List[Dict[str, Any]]:
    """Iteration records of the last run in the file (a restarted run resets the iteration counter)."""
    p = Path(path)
    if not p.is_file():
        raise InputError("MindSpeed-RL log not found", path=str(p))
    runs: List[Dict[int, Dict[str, Any]]] = [{}]
    last = 0
    with p.open(errors="replace") as fh:
        for line in fh:
            rec = parse_line(line)
            if rec is None:
                continue
            if rec["iteration"] < last and runs[-1]:
                runs.append({})
            last = rec["iteration"]
            runs[-1][rec["iteration"]] = rec  # a repeated iteration line (several ranks) keeps the last
    if not runs[-1]:
        raise InputError("no 'iteration: i / N | key : value' lines (is this a MindSpeed-RL training log?)",
                         path=str(p))
    return [runs[-1][k] for k in sorted(runs[-1])]


def _mean(values: List[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(sum(finite) / len(finite)) if finite else float("nan")


def read_training_log(path: str | Path, skip_first: int = 0) -> Dict[str, Any]:
    """Summary of a MindSpeed-RL (or ASP-on-MindSpeed-RL) training log for `asp compare`.

    Every numeric key is averaged over the iterations after the first `skip_first` (warm-up); the summary keeps
    MindSpeed-RL's metric names at top level, adds `time/iteration` etc. under the names of docs/design.md#metrics, and
    `per_iteration` holds the raw records.
    """
    records = read_iterations(path)
    used = records[skip_first:] if len(records) > skip_first else records[-1:]
    keys: List[str] = []
    for r in used:
        keys.extend(k for k in r if k not in keys and k not in ("iteration", "train_iters"))
    summary: Dict[str, Any] = {
        "source": "mindspeed_rl_log", "path": str(path),
        "iterations": len(records), "iterations_used": len(used), "skip_first": skip_first,
        "train_iters": records[-1]["train_iters"], "last_iteration": records[-1]["iteration"],
    }
    for k in keys:
        summary[k] = _mean([r[k] for r in used if k in r])
    aliases = {"time/iteration": "timing/all", "time/rollout": "timing/rollout", "time/train": "timing/update",
               "throughput/e2e_tps": "e2e_tps"}
    for new, old in aliases.items():
        if old in summary and new not in summary:
            summary[new] = summary[old]
    scores = [r["grpo/score/mean"] for r in records if "grpo/score/mean" in r]
    if scores:  # the runtime's reward/final: mean over the last quarter of the run
        k = max(1, len(scores) // 4)
        summary["reward/first"], summary["reward/final"] = scores[0], _mean(scores[-k:])
    summary["mode"] = "asp (mindspeed-rl)" if "asp/policy_version" in summary or "lag/mean" in summary \
        else "mindspeed-rl"
    summary["headline"] = {k: summary[k] for k in HEADLINE if k in summary}
    summary["per_iteration"] = records
    return summary


def looks_like_training_log(path: str | Path, probe_lines: int = 2000) -> bool:
    """True when the file holds at least one MindSpeed-RL iteration line (for `asp compare`'s loader)."""
    p = Path(path)
    if not p.is_file():
        return False
    with p.open(errors="replace") as fh:
        for i, line in enumerate(fh):
            if i >= probe_lines:
                break
            if _ITER.search(line):
                return True
    return False


# The name `asp compare` probes for (mindspeed_asp/commands/compare.py); same function.
read_log_summary = read_training_log
