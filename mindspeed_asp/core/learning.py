"""How well a run learned, read from its per-update rows: the numbers a user weighs against throughput.

Pure numpy/scipy, so `asp compare`, the demo and the convergence benchmark read a run the same way:

- final reward: the mean over the last quarter of the updates (the summary's `reward/final`);
- updates and seconds to a target reward: the first update whose trailing mean over `window` updates reaches
  the target (one lucky minibatch does not count), timed from the run's first dispatch;
- mean with a 95% Student-t interval over seeds, and the two-sample Kolmogorov-Smirnov distance used for the
  length-bias check (trained response lengths of one mode against stock's).
"""
from __future__ import annotations

import math
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple

import numpy as np

#: trailing window (updates) of the smoothed reward used for "time to target"
TARGET_WINDOW = 3


def final_reward(rewards: Sequence[float]) -> float:
    """Mean reward over the last quarter of the updates (at least one)."""
    if not len(rewards):
        raise ValueError("no updates")
    k = max(1, len(rewards) // 4)
    return float(np.mean(rewards[-k:]))


def smoothed(values: Sequence[float], window: int = TARGET_WINDOW) -> np.ndarray:
    """Trailing mean over up to `window` values (the first values average what exists so far)."""
    v = np.asarray(values, dtype=np.float64)
    c = np.concatenate([[0.0], np.cumsum(v)])
    idx = np.arange(1, len(v) + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)


def updates_to_target(rewards: Sequence[float], target: float, window: int = TARGET_WINDOW) -> Optional[int]:
    """1-based number of updates until the trailing mean first reaches `target`; None if it never does.

    The trailing mean needs `window` updates before it counts, so a run cannot "reach" a target on its first,
    noisy minibatch.
    """
    s = smoothed(rewards, window)
    hits = np.nonzero(s[window - 1:] >= target)[0]
    return int(hits[0]) + window if len(hits) else None


def seconds_to_target(rewards: Sequence[float], t_end: Sequence[float], t_start: float, target: float,
                      window: int = TARGET_WINDOW) -> Optional[float]:
    """Seconds from `t_start` (the run's first dispatch) to the end of the update that reaches `target`."""
    k = updates_to_target(rewards, target, window)
    return None if k is None else float(t_end[k - 1] - t_start)


def mean_interval(xs: Sequence[float], level: float = 0.95) -> Tuple[float, float, float]:
    """(mean, low, high): Student-t interval of the mean over seeds; a single value has a zero-width interval."""
    from scipy import stats

    a = np.asarray([x for x in xs if x is not None and math.isfinite(x)], dtype=np.float64)
    if len(a) == 0:
        return (math.nan, math.nan, math.nan)
    m = float(a.mean())
    if len(a) == 1:
        return (m, m, m)
    half = float(stats.t.ppf(0.5 + level / 2, len(a) - 1) * a.std(ddof=1) / math.sqrt(len(a)))
    return (m, m - half, m + half)


def ks_distance(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sample Kolmogorov-Smirnov statistic (0: same distribution, 1: disjoint)."""
    from scipy import stats

    if not len(a) or not len(b):
        return math.nan
    return float(stats.ks_2samp(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)).statistic)


def learning_summary(rewards: Sequence[float], t_end: Sequence[float], t_start: float,
                     target: Optional[float]) -> Dict[str, Optional[float]]:
    """The summary keys a run reports about its learning: `learning/*` (None where the target is unset)."""
    out: Dict[str, Optional[float]] = {"learning/target_reward": target}
    if target is not None and len(rewards):
        k = updates_to_target(rewards, target)
        out["learning/updates_to_target"] = k
        out["learning/seconds_to_target"] = None if k is None else float(t_end[k - 1] - t_start)
    return out


def discarded_attempts(attempts: Sequence[Tuple[Hashable, float, bool]]) -> List[bool]:
    """For (gid, submit time, trained) attempts: True where an attempt was discarded as stale.

    An attempt is discarded when it was not trained and the same group was generated again later (the
    `regenerate` rule). The last attempt of a group that was never trained is a leftover of the run's end
    (or a `drop`, counted separately by the queue), not a regeneration.
    """
    last: Dict[Hashable, float] = {}
    for gid, submit, _ in attempts:
        last[gid] = max(last.get(gid, -math.inf), submit)
    return [not trained and submit < last[gid] for gid, submit, trained in attempts]


def length_starvation(attempts: Sequence[Tuple[Hashable, float, bool, Sequence[int]]],
                      edges: Optional[Sequence[float]] = None) -> Dict[str, Any]:
    """Does the stale rule discard long responses more often than short ones?

    `attempts` are (group key, submit, trained, sample lengths), one per generated group attempt. Attempts are
    binned by their mean response length into quartiles (`edges`: three cut points, default the attempts'
    own quartiles; pass stock's to compare runs); per bin, the share discarded (`discarded_attempts`). Also
    the mean length of what was generated and of what was trained, and their KS distance over samples.
    """
    if not attempts:
        return {"discarded_share": 0.0, "discarded_share_by_quartile": [], "generated_len_mean": math.nan,
                "trained_len_mean": math.nan, "ks_trained_vs_generated": math.nan}
    discarded = np.array(discarded_attempts([(g, s, t) for g, s, t, _ in attempts]))
    means = np.array([float(np.mean(L)) if len(L) else 0.0 for _, _, _, L in attempts])
    cuts = np.quantile(means, [0.25, 0.5, 0.75]) if edges is None else np.asarray(edges, dtype=np.float64)
    q = np.searchsorted(cuts, means, side="right")
    by_q = [float(discarded[q == i].mean()) if (q == i).any() else 0.0 for i in range(len(cuts) + 1)]
    generated = [x for _, _, _, L in attempts for x in L]
    trained = [x for _, _, t, L in attempts if t for x in L]
    return {"discarded_share": float(discarded.mean()), "discarded_share_by_quartile": by_q,
            "quartile_edges": [float(c) for c in cuts],
            "generated_len_mean": float(np.mean(generated)) if generated else math.nan,
            "trained_len_mean": float(np.mean(trained)) if trained else math.nan,
            "ks_trained_vs_generated": ks_distance(trained, generated)}
