"""PNG figures of simulated runs: instance Gantt chart, queue-occupancy curve, bubble breakdown.

Why pictures: a lone tail group on one instance, or a trainer that starves between bursts, is seen at a
glance in a Gantt chart or a queue curve and takes a page of numbers otherwise. matplotlib's Agg backend is
used so the figures render on a login node without a display.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np

from mindspeed_asp.utils.plotting import pyplot, save_figure



def gantt(results: Sequence, path: str | Path, max_groups_drawn: int = 20000) -> Path:
    """One panel per run: per instance, a bar per group from dispatch to finish, colour = group length.

    Also marks trainer updates (ticks above the instances). With more than `max_groups_drawn` groups a
    uniform subsample is drawn so the file stays small.
    """
    plt = pyplot()
    from matplotlib.collections import LineCollection

    results = list(results)
    fig, axes = plt.subplots(len(results), 1, figsize=(11, 2.2 + 0.9 * len(results) *
                                                      max(1, min(8, results[0].trace.busy.size) / 4)),
                             squeeze=False, sharex=True)
    tmax = max(float(r.metrics["time/iteration"]) for r in results)
    for ax, r in zip(axes[:, 0], results):
        tr = r.trace
        G = len(tr.group_finish)
        idx = np.arange(G)
        if G > max_groups_drawn:
            idx = np.linspace(0, G - 1, max_groups_drawn).astype(np.int64)
        inst = tr.group_instance[idx]
        start, fin = tr.group_dispatch[idx], tr.group_finish[idx]
        dur = fin - start
        m = int(tr.busy.size)
        # stack bars of one instance slightly so overlapping groups stay visible
        jitter = (idx % 7) / 7.0 * 0.7 - 0.35
        y = inst + jitter
        segs = np.stack([np.stack([start, y], 1), np.stack([fin, y], 1)], 1)
        norm = dur / (dur.max() if dur.max() > 0 else 1.0)
        lc = LineCollection(segs, colors=plt.cm.viridis(norm), linewidths=1.2)
        ax.add_collection(lc)
        for t0, t1 in zip(r.mb_start, r.mb_finish):
            ax.plot([t0, t1], [m + 0.2, m + 0.2], color="crimson", lw=3, solid_capstyle="butt")
        ax.axvline(r.metrics["time/rollout"], color="k", ls="--", lw=0.8)
        ax.set_ylim(-0.8, m + 0.6)
        ax.set_xlim(0, tmax * 1.01)
        ax.set_ylabel("instance")
        ax.set_title(f"{r.planner} ({r.mode}): iteration {r.metrics['time/iteration']:.1f} s, rollout "
                     f"{r.metrics['time/rollout']:.1f} s; red = trainer updates", fontsize=9)
    axes[-1, 0].set_xlabel("time (s)")
    return save_figure(fig, path, dpi=110)


def queue_occupancy(results: Sequence, minibatch: int, path: str | Path) -> Path:
    """Ready-queue occupancy (finished, untrained groups) over time per run, with the minibatch size M."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4))
    for r in results:
        ax.step(r.queue_t, r.queue_q, where="post", lw=1.1,
                label=f"{r.planner} ({r.mode}), sorting bubble {100 * r.metrics['bubble/sorting']:.1f}%")
    ax.axhline(minibatch, color="k", ls=":", lw=1, label=f"M = {minibatch} groups")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("groups waiting for the trainer")
    ax.legend(fontsize=8)
    return save_figure(fig, path, dpi=110)


BUBBLES = ("bubble/padding", "bubble/skewness", "bubble/sorting", "bubble/startup")


def bubble_breakdown(rows: Dict[str, Dict[str, float]], path: str | Path,
                     keys: Sequence[str] = BUBBLES) -> Path:
    """Grouped bars: per planner, each bubble metric in percent (rows: planner label -> metrics)."""
    plt = pyplot()
    labels: List[str] = list(rows)
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(labels) + 2), 4))
    width = 0.8 / len(keys)
    x = np.arange(len(labels))
    for i, k in enumerate(keys):
        vals = [100.0 * float(rows[lab].get(k, np.nan)) for lab in labels]
        ax.bar(x + (i - (len(keys) - 1) / 2) * width, vals, width, label=k)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("% of slot-steps / instance time / run time")
    ax.legend(fontsize=8)
    return save_figure(fig, path, dpi=110)


def lag_histogram(results: Sequence, max_lag: int, path: str | Path) -> Path:
    """Per run, the share of trained samples at each policy lag, with the bound marked."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.6))
    top = max([int(r.lags.max()) if len(r.lags) else 0 for r in results] + [max_lag])
    bins = np.arange(top + 2) - 0.5
    width = 0.8 / max(1, len(results))
    for i, r in enumerate(results):
        counts, _ = np.histogram(r.lags, bins=bins)
        share = counts / max(1, counts.sum())
        ax.bar(np.arange(top + 1) + (i - (len(results) - 1) / 2) * width, share, width,
               label=f"{r.planner} ({r.mode})")
    ax.axvline(max_lag + 0.5, color="crimson", ls="--", lw=1, label=f"max_lag = {max_lag}")
    ax.set_xlabel("policy lag of a trained sample (updates)")
    ax.set_ylabel("share of samples")
    ax.legend(fontsize=7)
    return save_figure(fig, path, dpi=110)
