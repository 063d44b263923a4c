"""The runtime's own cost model and rho, measured while it runs, for planning its later windows.

Why: a plan is only as good as the step cost and the trainer/rollout ratio it is scored with (docs/design.md#cost-model
and docs/design.md#arrival-smoothing). A default, GPU-like cost model and rho = 1 describe some other machine; the
engines the run actually drives report every step they take (`RolloutInstanceImpl.step_log`), and the trainer's update
times are measured by the driver. Two estimators, both plain numpy:

- `OnlineCostFit`: the engine steps seen so far -> `cost_model.fit_cost_model` (the same fit rule as
  `asp fit-cost`), refitted when enough new steps came in; until it has `min_steps` steps (or when the steps
  cannot be fitted) it answers the configured cost.
- `RhoMeter`: rho as the planner defines it (trainer seconds for a window = rho * R_LB of that window's
  rollout, `scheduler/asp_planner.py`): measured trainer seconds per update times updates per window, over
  R_LB of the windows whose groups all came back (observed lengths, the current fitted cost).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from mindspeed_asp.cost_model import CostFit, fit_cost_model
from mindspeed_asp.core.problem import CostModel, InstanceSpec

StepRow = Tuple[int, int, int, float]  # active sequences, KV tokens, prefill tokens, seconds


@dataclass
class CostEstimate:
    """The cost model to plan with and where it came from (`source`: "configured" or "online")."""

    cost: CostModel
    source: str
    steps: int = 0
    r2: float = float("nan")
    mean_rel: float = float("nan")

    def as_dict(self) -> Dict[str, object]:
        c = self.cost
        return {"a": c.a, "b": c.b, "c": c.c, "p": c.p, "source": self.source, "steps": self.steps,
                "r2": self.r2, "mean_rel": self.mean_rel}


class OnlineCostFit:
    """Fits `a + b*active + c*kv + p*prefill` to the engine steps of the run so far.

    `min_steps`: steps needed before the fit replaces the configured cost; `max_steps`: the most recent
    steps kept (old ones describe an engine state that may have changed, e.g. before a cache warmed up);
    `refit_every`: new steps that trigger a refit (fitting is cheap, but not free on a loaded CPU).
    """

    def __init__(self, default: CostModel, min_steps: int = 200, max_steps: int = 20000,
                 refit_every: int = 100) -> None:
        if min_steps < 4:
            raise ValueError(f"min_steps must be >= 4 (four coefficients), got {min_steps}")
        self.default = default
        self.min_steps = int(min_steps)
        self.max_steps = int(max_steps)
        self.refit_every = int(refit_every)
        self._rows: List[StepRow] = []
        self._at_fit = 0  # rows seen when the current fit was made
        self._seen = 0
        self._fit: Optional[CostFit] = None
        self.fit_error: Optional[str] = None

    def add_steps(self, rows: Iterable[Sequence[float]]) -> int:
        """Add engine steps; rows with no sequence or a non-positive time (idle polls) are skipped."""
        added = 0
        for r in rows:
            active, kv, prefill, sec = int(r[0]), int(r[1]), int(r[2]), float(r[3])
            if active <= 0 or not np.isfinite(sec) or sec <= 0:
                continue
            self._rows.append((active, kv, prefill, sec))
            added += 1
        self._seen += added
        if len(self._rows) > self.max_steps:
            del self._rows[:len(self._rows) - self.max_steps]
        return added

    @property
    def steps(self) -> int:
        return len(self._rows)

    def _refit(self) -> None:
        X = np.asarray(self._rows, dtype=np.float64)
        try:
            self._fit = fit_cost_model(X[:, 0], X[:, 1], X[:, 3], X[:, 2],
                                       source=f"online fit of {len(X)} engine steps of this run")
            self.fit_error = None
        except ValueError as exc:  # e.g. every step identical: keep the previous answer, say why
            self.fit_error = str(exc)
        self._at_fit = self._seen

    def estimate(self) -> CostEstimate:
        """The fitted cost once `min_steps` steps are in (refitted after `refit_every` new ones), else the
        configured one."""
        if len(self._rows) < self.min_steps:
            return CostEstimate(self.default, "configured", len(self._rows))
        if self._fit is None or self._seen - self._at_fit >= self.refit_every:
            self._refit()
        if self._fit is None:
            return CostEstimate(self.default, "configured", len(self._rows))
        return CostEstimate(self._fit.cost, "online", self._fit.samples, self._fit.r2, self._fit.mean_rel)


@dataclass
class RhoEstimate:
    """rho to plan with; `source` "configured" until a window and an update have been measured."""

    rho: float
    source: str
    updates: int = 0
    windows: int = 0
    train_s_per_update: float = float("nan")
    rollout_lb_s_per_window: float = float("nan")

    def as_dict(self) -> Dict[str, object]:
        return {"rho": self.rho, "source": self.source, "updates": self.updates, "windows": self.windows,
                "train_s_per_update": self.train_s_per_update,
                "rollout_lb_s_per_window": self.rollout_lb_s_per_window}


class RhoMeter:
    """rho = (trainer seconds per update x updates per window) / R_LB(window rollout), measured.

    `add_update(seconds)` per optimizer update; `add_window(lengths, prompt_lens)` once every group of a
    window came back (lengths [G, n] as generated). R_LB (`sim.bounds.rollout_lower_bound`) is taken at
    query time with the cost given then, so a refined cost fit re-prices the windows already seen.
    """

    def __init__(self, default: float, minibatch_groups: int, instances: int, slots: int) -> None:
        if default < 0:
            raise ValueError(f"rho must be >= 0, got {default}")
        if minibatch_groups < 1 or instances < 1 or slots < 1:
            raise ValueError("minibatch_groups, instances and slots must be >= 1")
        self.default = float(default)
        self.M = int(minibatch_groups)
        self.instances = int(instances)
        self.spec = InstanceSpec(slots=int(slots))
        self.train_s: List[float] = []
        self._windows: List[Tuple[np.ndarray, np.ndarray]] = []

    def add_update(self, seconds: float) -> None:
        if not np.isfinite(seconds) or seconds < 0:
            raise ValueError(f"update seconds must be finite and >= 0, got {seconds}")
        self.train_s.append(float(seconds))

    def add_window(self, lengths: np.ndarray, prompt_lens: np.ndarray) -> None:
        L = np.asarray(lengths, dtype=np.float64)
        P = np.asarray(prompt_lens, dtype=np.float64)
        if L.ndim != 2 or len(L) != len(P) or len(L) == 0:
            raise ValueError(f"window lengths must be [G, n] with G = len(prompt_lens) > 0, got {L.shape}")
        self._windows.append((L, P))

    def estimate(self, cost: CostModel) -> RhoEstimate:
        """The measured rho under `cost`, or the default while nothing was measured."""
        from mindspeed_asp.sim.bounds import rollout_lower_bound

        if not self.train_s or not self._windows:
            return RhoEstimate(self.default, "configured", len(self.train_s), len(self._windows))
        per_update = float(np.mean(self.train_s))
        train, lb = [], []
        for L, P in self._windows:
            r = rollout_lower_bound(L, P, self.instances, self.spec, cost)["rollout/R_LB"]
            if np.isfinite(r) and r > 0:
                train.append(per_update * len(L) / self.M)
                lb.append(r)
        if not lb:
            return RhoEstimate(self.default, "configured", len(self.train_s), len(self._windows))
        return RhoEstimate(float(np.sum(train) / np.sum(lb)), "measured", len(self.train_s), len(lb),
                           per_update, float(np.mean(lb)))
