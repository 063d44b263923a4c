"""PNG plots of one run from its trace.json: instance Gantt chart, queue occupancy, lag histogram, rewards.

Uses matplotlib's Agg backend (no display on clusters or CI). Each plot answers one question: where did the
instances idle (Gantt), did finished work reach the trainer smoothly (queue), how stale were trained samples
(lag), did learning progress (reward).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

from mindspeed_asp.utils.plotting import pyplot, save_figure
from mindspeed_asp.runtime.run_recorder import TRACE_FILE


def plot_run(run_dir: str | Path) -> List[Path]:
    """Write gantt.png, queue.png, lag_hist.png and reward.png into `run_dir`; returns the paths."""
    run_dir = Path(run_dir)
    trace = json.loads((run_dir / TRACE_FILE).read_text())
    plt = pyplot()
    out = [_gantt(plt, trace, run_dir / "gantt.png"), _queue(plt, trace, run_dir / "queue.png"),
           _lag(plt, trace, run_dir / "lag_hist.png"), _reward(plt, trace, run_dir / "reward.png")]
    return out


def _title(trace: Dict, what: str) -> str:
    return f"{what} ({trace.get('mode')}, {trace.get('instances')} instances, max_lag {trace.get('max_lag')})"


def _gantt(plt, trace: Dict, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.6 * trace["instances"]))
    cmap = plt.get_cmap("viridis")
    versions = [g["version"] for g in trace["groups"]] or [0]
    vmax = max(1, max(versions))
    for g in trace["groups"]:
        ax.barh(g["instance"], g["end"] - g["start"], left=g["start"], height=0.8,
                color=cmap(g["version"] / vmax), edgecolor="black", linewidth=0.3)
    for s in trace.get("steps", []):
        ax.axvline(s["t_end"], color="red", linewidth=0.5, alpha=0.5)
    ax.set_yticks(range(trace["instances"]))
    ax.set_yticklabels([f"instance {j}" for j in range(trace["instances"])])
    ax.set_xlabel("seconds (red lines: optimizer updates; colour: policy version)")
    ax.set_title(_title(trace, "Rollout Gantt chart"))
    return save_figure(fig, path, dpi=100)


def _queue(plt, trace: Dict, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 3))
    q = trace.get("queue", [])
    if q:
        ax.step([t for t, _ in q], [v for _, v in q], where="post")
    for a, b in trace.get("trainer_idle", []):
        ax.axvspan(a, b, color="orange", alpha=0.3)
    ax.set_xlabel("seconds (orange: trainer starved while rollout active)")
    ax.set_ylabel("finished groups queued")
    ax.set_title(_title(trace, "Sample queue occupancy"))
    return save_figure(fig, path, dpi=100)


def _lag(plt, trace: Dict, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5, 3))
    lags = trace.get("lags", [])
    top = max(lags + [trace.get("max_lag") or 0])
    ax.hist(lags, bins=[x - 0.5 for x in range(top + 2)], rwidth=0.8)
    ax.axvline((trace.get("max_lag") or 0) + 0.5, color="red", linestyle="--", label="max_lag")
    ax.set_xlabel("policy lag of trained samples (updates)")
    ax.set_ylabel("samples")
    ax.legend()
    ax.set_title(_title(trace, "Lag"), fontsize=8)
    return save_figure(fig, path, dpi=100)


def _reward(plt, trace: Dict, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 3))
    steps = [s for s in trace.get("steps", []) if "reward/mean" in s]
    ax.plot([s["step"] for s in steps], [s["reward/mean"] for s in steps], marker="o")
    ax.set_xlabel("optimizer update")
    ax.set_ylabel("mean reward of trained samples")
    ax.set_title(_title(trace, "Reward"), fontsize=8)
    return save_figure(fig, path, dpi=100)

