"""The metric definitions of docs/design.md section 5, computed once for the simulator, the run recorder and
the sample queue: lag statistics, skewness, the tail share and the padding bubbles.

Why one module: a simulated run, a measured run and the queue's live counters are compared line by line, so
a percentile or a padding share computed two ways would make the comparison say nothing. Pure numpy: every
caller gives plain numbers (lags, busy times, token counts) and gets plain floats back.
"""
from __future__ import annotations

import math
from typing import Dict, Sequence, Tuple

import numpy as np

#: The lag percentile reported as `lag/p99`.
LAG_PERCENTILE = 99.0
#: `tail_share` and `bubble/after90` measure the time after this share of the work finished.
TAIL_FRACTION = 0.9


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank q-th percentile: the smallest value with at least q% of the values at or below it.

    Nearest rank (not interpolation) so a lag percentile is a lag some sample had; 0.0 when empty."""
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return 0.0
    return float(np.percentile(a, q, method="inverted_cdf"))


def lag_stats(lags: Sequence[int], max_lag: int) -> Dict[str, float]:
    """`lag/{mean,p99,max,frac_over_bound}` over per-sample lags (the trainer's version at the update minus
    the oldest version that produced the sample); zeros when no sample was trained."""
    a = np.asarray(lags, dtype=np.float64)
    if a.size == 0:
        return {"lag/mean": 0.0, "lag/p99": 0.0, "lag/max": 0.0, "lag/frac_over_bound": 0.0}
    return {"lag/mean": float(a.mean()), "lag/p99": percentile(a, LAG_PERCENTILE), "lag/max": float(a.max()),
            "lag/frac_over_bound": float(np.mean(a > max_lag))}


def lag_histogram(lags: Sequence[int]) -> Dict[str, int]:
    """How many samples had each lag, keyed by the lag as a string (a JSON object)."""
    values, counts = np.unique(np.asarray(lags, dtype=np.int64), return_counts=True)
    return {str(int(v)): int(c) for v, c in zip(values, counts)}


def skewness(busy: Sequence[float]) -> float:
    """`bubble/skewness`: 1 - mean_j(T_j) / R with R = max_j T_j, the share of instance time idle at the end."""
    b = np.asarray(busy, dtype=np.float64)
    R = float(b.max()) if b.size else 0.0
    return 1.0 - float(b.mean()) / R if R > 0 else 0.0


def tail_share(finish: Sequence[float], start: float = 0.0) -> float:
    """Share of the span [start, last finish] that comes after 90% of the items (sequences or groups)
    finished: the long tail a skewed rollout waits for."""
    f = np.sort(np.asarray(finish, dtype=np.float64))
    if f.size == 0:
        return 0.0
    span = f[-1] - start
    t90 = f[max(0, math.ceil(TAIL_FRACTION * f.size) - 1)]
    return float((f[-1] - t90) / span) if span > 0 else 0.0


def idle_share(used: float, capacity: float) -> float:
    """1 - used / capacity, clipped at 0: the share of slot capacity (slot-steps or slot-seconds) left idle."""
    return max(0.0, 1.0 - float(used) / float(capacity)) if capacity > 0 else 0.0


def generation_padding(total_tokens: float, slots: int, steps: Sequence[float]) -> float:
    """`bubble/padding` in generation: idle slot-steps, 1 - sum(L) / (B * sum_j S_j)."""
    return idle_share(total_tokens, float(slots) * float(np.sum(steps)))


def micro_batch_padding(lengths: Sequence[float]) -> Tuple[float, float]:
    """(padded tokens, real tokens) of one micro-batch right-padded to its longest sequence."""
    a = np.asarray(lengths, dtype=np.float64)
    if a.size == 0:
        return 0.0, 0.0
    real = float(a.sum())
    return float(a.max()) * a.size - real, real


def padding_share(padded: float, real: float) -> float:
    """`bubble/padding_train`: padded tokens over padded plus real tokens."""
    total = padded + real
    return padded / total if total > 0 else 0.0
