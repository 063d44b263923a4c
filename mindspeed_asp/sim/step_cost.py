"""Step costs for the instance simulator: a measured step-time table and the interval sums the event loop jumps with.

Why a module of its own: the event loop (engine.py) only asks two questions of a cost model, "how long do D
steps at n active sequences and kv resident tokens take" and "how many steps until t seconds have passed"; how
they are answered (a closed form for the linear `CostModel`, one vectorised numpy sum for a table) is independent
of the scheduling the engine models, and the lower bounds (metrics.py) ask the same questions.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from mindspeed_asp.core.problem import CostModel

__all__ = ["TabulatedCost", "make_intervals"]


class TabulatedCost:
    """Step time interpolated in a measured table over (active sequences, KV tokens), seconds.

    Why: vLLM's step time is flat up to a knee and then compute bound, which the linear model misses. The
    table is a grid `time[i, j]` at `active[i]`, `kv[j]` (both increasing); outside the grid the edge values
    are held (no extrapolation). `p` is the per-prefill-token cost added on top.
    """

    def __init__(self, active: Sequence[float], kv: Sequence[float], time: np.ndarray, p: float = 0.0,
                 source: str = "table") -> None:
        from scipy.interpolate import RegularGridInterpolator

        self.active = np.asarray(active, dtype=np.float64)
        self.kv = np.asarray(kv, dtype=np.float64)
        self.time = np.asarray(time, dtype=np.float64)
        if self.time.shape != (len(self.active), len(self.kv)):
            raise ValueError(f"table shape {self.time.shape} != (len(active), len(kv)) = "
                             f"({len(self.active)}, {len(self.kv)})")
        if np.any(np.diff(self.active) <= 0) or np.any(np.diff(self.kv) <= 0):
            raise ValueError("table axes must be strictly increasing")
        self.p = float(p)
        self.source = source
        self._interp = RegularGridInterpolator((self.active, self.kv), self.time, method="linear",
                                               bounds_error=False, fill_value=None)

    def step_time(self, active, kv_tokens, prefill_tokens=0.0):
        act = np.clip(np.asarray(active, dtype=np.float64), self.active[0], self.active[-1])
        kv = np.clip(np.asarray(kv_tokens, dtype=np.float64), self.kv[0], self.kv[-1])
        act, kv = np.broadcast_arrays(act, kv)
        out = self._interp(np.stack([act.ravel(), kv.ravel()], axis=1)).reshape(act.shape)
        return out + self.p * np.asarray(prefill_tokens, dtype=np.float64)


class _LinearIntervals:
    """Closed-form sums of `a + b*n + c*(K + n*d)` over d = 0..D-1 steps, plus the prefill of the first step."""

    def __init__(self, cost: CostModel, scale: float = 1.0) -> None:
        self.a, self.b, self.c, self.p = (cost.a * scale, cost.b * scale, cost.c * scale, cost.p * scale)

    def interval(self, n: int, kv: float, steps: int, prefill: float) -> float:
        d = float(steps)
        return d * (self.a + self.b * n) + self.c * (d * kv + n * d * (d - 1.0) / 2.0) + self.p * prefill

    def steps_to_reach(self, n: int, kv: float, prefill: float, t: float) -> int:
        """Smallest D >= 1 with interval(n, kv, D, prefill) >= t."""
        qa = self.c * n / 2.0
        qb = self.a + self.b * n + self.c * kv - self.c * n / 2.0
        qc = self.p * prefill - t
        if qa > 0.0:
            disc = max(qb * qb - 4.0 * qa * qc, 0.0)
            d = (-qb + math.sqrt(disc)) / (2.0 * qa)
        else:
            d = -qc / qb if qb > 0 else 1.0
        d = max(1, int(math.ceil(d - 1e-9)))
        while d > 1 and self.interval(n, kv, d - 1, prefill) >= t:
            d -= 1
        while self.interval(n, kv, d, prefill) < t:
            d += 1
        return d


class _TableIntervals:
    """Interval sums for any vectorised `step_time(active, kv, prefill)` (one numpy sum per interval)."""

    def __init__(self, cost, scale: float = 1.0) -> None:
        self.cost = cost
        self.scale = scale
        self.p = float(getattr(cost, "p", 0.0)) * scale

    def _steps(self, n: int, kv: float, steps: int) -> np.ndarray:
        d = np.arange(steps, dtype=np.float64)
        return self.scale * np.asarray(self.cost.step_time(np.full(steps, float(n)), kv + n * d, 0.0))

    def interval(self, n: int, kv: float, steps: int, prefill: float) -> float:
        if steps <= 0:
            return 0.0
        return float(self._steps(n, kv, steps).sum()) + self.p * prefill

    def steps_to_reach(self, n: int, kv: float, prefill: float, t: float) -> int:
        horizon = 64
        while True:
            cum = np.cumsum(self._steps(n, kv, horizon)) + self.p * prefill
            idx = int(np.searchsorted(cum, t, side="left"))
            if idx < horizon:
                return idx + 1
            horizon *= 4


def make_intervals(cost, scale: float = 1.0):
    """Interval-time helper for a cost object: closed form for the linear CostModel, sums otherwise."""
    if isinstance(cost, CostModel):
        return _LinearIntervals(cost, scale)
    if not hasattr(cost, "step_time"):
        raise TypeError(f"cost {cost!r} has no step_time(active, kv, prefill)")
    return _TableIntervals(cost, scale)
