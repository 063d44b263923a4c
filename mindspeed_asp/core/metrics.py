"""The metric definitions of docs/design.md#metrics, computed once for the simulator, the run recorder and
the sample queue: lag statistics, skewness, the tail share, the padding bubbles, `throughput/e2e_tps` with the
devices it divides by, and rho against stock's rollout.

Why one module: a simulated run, a measured run and the queue's live counters are compared line by line, so
a percentile or a padding share computed two ways would make the comparison say nothing. Pure numpy: every
caller gives plain numbers (lags, busy times, token counts) and gets plain floats back.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

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


# ------------------------------------------------------------------------------------ e2e_tps and devices
#: Name of the one `throughput/e2e_tps` definition (docs/design.md#e2e_tps), recorded beside every figure so
#: `asp compare` can tell it from figures computed another way (summaries written before it have none).
E2E_TPS_DEFINITION = "all_devices"
#: The same definition in words, for tables and notes.
E2E_TPS_TEXT = ("prompt+response tokens trained / (seconds x every device the run uses: rollout instances x "
                "devices per instance + trainer devices; a colocated run's devices once)")


@dataclass(frozen=True)
class DeviceCount:
    """The devices a run uses, as `throughput/e2e_tps` counts them (MindSpeed-RL's world size).

    A split run (separate rollout pool, the asynchronous modes) uses its rollout devices plus the trainer's; a
    colocated run (stock MindSpeed-RL: every device generates, then every device trains) counts each device
    once. Build it with `split_devices` or `colocated_devices`.
    """

    rollout: int
    trainer: int
    colocated: bool = False

    def __post_init__(self) -> None:
        if self.rollout < 0 or self.trainer < 0 or self.total < 1:
            raise ValueError(f"device counts must be >= 0 with at least one device, got rollout={self.rollout}, "
                             f"trainer={self.trainer}")

    @property
    def total(self) -> int:
        """The denominator of e2e_tps: rollout + trainer devices, or the shared devices once when colocated."""
        return max(self.rollout, self.trainer) if self.colocated else self.rollout + self.trainer

    @property
    def layout(self) -> str:
        return "colocated" if self.colocated else "split"

    def describe(self) -> str:
        """`9 (8 rollout + 1 trainer, split)` or `16 (colocated)`."""
        if self.colocated:
            return f"{self.total} (colocated)"
        return f"{self.total} ({self.rollout} rollout + {self.trainer} trainer, split)"

    def to_dict(self) -> Dict[str, Any]:
        """The summary's `devices` field: the counts and the definition they were used under."""
        return {"total": self.total, "rollout": self.rollout, "trainer": self.trainer, "layout": self.layout,
                "definition": E2E_TPS_DEFINITION}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "DeviceCount":
        return cls(rollout=int(d["rollout"]), trainer=int(d["trainer"]), colocated=d.get("layout") == "colocated")


def split_devices(instances: int, devices_per_instance: int = 1, trainer_devices: int = 0) -> DeviceCount:
    """A rollout pool of `instances` x `devices_per_instance` devices beside a trainer on `trainer_devices`."""
    if instances < 0 or devices_per_instance < 1 or trainer_devices < 0:
        raise ValueError(f"instances >= 0, devices_per_instance >= 1, trainer_devices >= 0; got {instances}, "
                         f"{devices_per_instance}, {trainer_devices}")
    return DeviceCount(rollout=instances * devices_per_instance, trainer=trainer_devices)


def colocated_devices(devices: int) -> DeviceCount:
    """`devices` devices that all generate and then all train (stock MindSpeed-RL): counted once."""
    return DeviceCount(rollout=devices, trainer=devices, colocated=True)


def e2e_tps(tokens: float, seconds: float, devices: Union[int, DeviceCount]) -> float:
    """`throughput/e2e_tps`: prompt+response tokens trained per second per device, over every device the run
    uses (`DeviceCount.total`), as MindSpeed-RL's `compute_tps`; 0.0 for an empty span."""
    n = devices.total if isinstance(devices, DeviceCount) else int(devices)
    if n < 1:
        raise ValueError(f"e2e_tps needs at least one device, got {n}")
    return float(tokens) / (n * float(seconds)) if seconds > 0 else 0.0


# ------------------------------------------------------------------------------------------------- rho
def rho_stock(train_seconds: float, stock_rollout_seconds: float) -> float:
    """rho against stock: trainer time per window over stock's measured rollout time of the same window (the
    rollout phase of a stock MindSpeed-RL iteration). The regime a user sees in stock's own timings."""
    if not stock_rollout_seconds > 0:
        raise ValueError(f"stock rollout time must be > 0, got {stock_rollout_seconds}")
    return float(train_seconds) / float(stock_rollout_seconds)


def rho_stock_from_rlb(rho: float, r_lb: float, stock_rollout_seconds: float) -> float:
    """Convert the simulator's rho (trainer time / the rollout lower bound R_LB of the inference cluster) to
    rho against stock's rollout: rho * R_LB / stock rollout. Stock's rollout is never under R_LB, so the
    stock-relative value is the smaller one."""
    if not (r_lb > 0 and stock_rollout_seconds > 0) or rho < 0:
        raise ValueError(f"need rho >= 0, R_LB > 0 and a stock rollout > 0; got {rho}, {r_lb}, "
                         f"{stock_rollout_seconds}")
    return float(rho) * float(r_lb) / float(stock_rollout_seconds)


def rho_rlb_from_stock(rho_stock_value: float, r_lb: float, stock_rollout_seconds: float) -> float:
    """The inverse of `rho_stock_from_rlb`: the simulator rho giving the same trainer time as a stock-relative
    rho."""
    if not (r_lb > 0 and stock_rollout_seconds > 0) or rho_stock_value < 0:
        raise ValueError(f"need rho_stock >= 0, R_LB > 0 and a stock rollout > 0; got {rho_stock_value}, "
                         f"{r_lb}, {stock_rollout_seconds}")
    return float(rho_stock_value) * float(stock_rollout_seconds) / float(r_lb)


def devices_of(summary: Mapping[str, Any]) -> Optional[DeviceCount]:
    """The DeviceCount a summary recorded under this definition (its `devices` field), None when it has none (its
    e2e_tps divided by the rollout instances only) or records another definition."""
    d = summary.get("devices")
    if not isinstance(d, Mapping) or d.get("definition") != E2E_TPS_DEFINITION:
        return None
    try:
        return DeviceCount.from_dict(d)
    except (KeyError, TypeError, ValueError):
        return None
