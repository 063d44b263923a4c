"""Build a DispatchPlan over an epoch: estimate once, cut iteration windows, plan each, record provenance.

Why windows: a training iteration consumes `groups_per_iteration` prompts (MindSpeed-RL's global batch), and
the instances finish one iteration's groups before the next iteration's are dispatched in stock mode, so each
window is an independent planning problem. The whole epoch is estimated in one vectorised call, then sliced.
"""
from __future__ import annotations

import datetime as _dt
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional

import numpy as np

from mindspeed_asp import __version__
from mindspeed_asp.core.fluid import group_moments, instance_times, rollout_lower_bound
from mindspeed_asp.scheduler.plan_file import DispatchPlan
from mindspeed_asp.scheduler.asp_planner import fixed_choice, plan_asp
from mindspeed_asp.scheduler.planners import get_planner, is_oracle_estimate, needs_oracle
from mindspeed_asp.core.problem import (Assignment, CostModel, InstanceSpec, LengthEstimate, PlanningProblem,
                                           PromptSet)


ASP_FAMILY = ("asp", "oracle_asp")


def iteration_starts(num_groups: int, groups_per_iteration: Optional[int]) -> List[int]:
    """Window boundaries: consecutive dataset slices of `groups_per_iteration` (the last may be shorter)."""
    if num_groups <= 0:
        return [0]
    size = num_groups if not groups_per_iteration else int(groups_per_iteration)
    if size < 1:
        raise ValueError("groups_per_iteration must be >= 1")
    return list(range(0, num_groups, size)) + [num_groups]


@dataclass
class IterationSummary:
    """Predicted figures of one planned window (fluid model, predicted lengths)."""

    groups: int
    makespan: float  # predicted rollout makespan, seconds
    bound: float  # R_LB under the same predictions
    max_over_mean: float  # predicted per-instance busy time, max / mean

    def as_dict(self) -> Dict[str, float]:
        return {"groups": self.groups, "makespan": self.makespan, "bound": self.bound,
                "max_over_mean": self.max_over_mean}


def summarize(problem: PlanningProblem, assignment: Assignment) -> IterationSummary:
    gm = group_moments(problem)
    G = len(gm.work)
    owner = np.empty(G, dtype=np.int64)
    for j, o in enumerate(assignment.orders):
        owner[np.asarray(o, dtype=np.int64)] = j
    t = instance_times(owner, gm, problem.instances, problem.cost, problem.spec.slots) if G else np.zeros(1)
    mean = float(t.mean()) if len(t) else 0.0
    return IterationSummary(groups=G, makespan=float(t.max()), bound=rollout_lower_bound(gm, problem.instances,
                                                                                           problem.cost),
                            max_over_mean=float(t.max() / mean) if mean > 0 else 1.0)


@dataclass
class BuildResult:
    plan: DispatchPlan
    estimate: LengthEstimate
    summaries: List[IterationSummary] = field(default_factory=list)


def build_plan(prompts: PromptSet, estimate: LengthEstimate, *, instances: int, slots: int, minibatch: int,
               max_new_tokens: int, planner: str = "asp", groups_per_iteration: Optional[int] = None,
               cost: Optional[CostModel] = None, rho: float = 1.0, kv_budget: Optional[int] = None,
               seed: int = 0, provenance: Optional[Dict[str, Any]] = None,
               progress: Optional[bool] = None, reselect_every: int = 8, max_lag: int = 1,
               work_stealing: bool = True) -> BuildResult:
    """Plan every iteration window of `prompts` with `planner` and return the plan with provenance.

    `estimate` covers all rows of `prompts` (from `estimate_lengths` or any estimator); an `oracle_*` planner
    must be given an oracle's estimate. `progress` None shows a tqdm bar on stderr for large inputs.
    For the ASP planners the scenario search of (theta, order rule, eps) runs on every `reselect_every`-th
    window and the windows in between reuse its choice (windows of one epoch are alike; this keeps a 10^5-group
    epoch in seconds); 0 searches on every window. `max_lag` and `work_stealing` are the run's (asp.max_lag,
    asp.work_stealing): the ASP planners score their candidates in that regime.
    """
    if len(estimate) != len(prompts):
        raise ValueError(f"estimate has {len(estimate)} groups, dataset has {len(prompts)}")
    if instances < 1 or slots < 1 or minibatch < 1:
        raise ValueError("instances, slots and minibatch must be >= 1")
    if max_lag < 0:
        raise ValueError("max_lag must be >= 0")
    cost = cost or CostModel()
    fn = get_planner(planner)
    starts = iteration_starts(len(prompts), groups_per_iteration)
    spec = InstanceSpec(slots=int(slots), kv_budget=kv_budget)
    rng = np.random.default_rng(seed)
    windows = range(len(starts) - 1)
    if progress is None:
        progress = len(prompts) * prompts.n >= 200_000 or len(windows) >= 50
    if progress:
        from tqdm.auto import tqdm

        windows = tqdm(windows, desc=f"asp plan ({planner})", unit="iter", file=sys.stderr)
    assignments: List[Assignment] = []
    summaries: List[IterationSummary] = []
    chosen: Optional[Dict[str, Any]] = None
    for it in windows:
        rows = np.arange(starts[it], starts[it + 1])
        problem = PlanningProblem(prompts=prompts.subset(rows), estimate=estimate.subset(rows),
                                  instances=int(instances), spec=spec, minibatch=int(minibatch), cost=cost,
                                  max_new_tokens=int(max_new_tokens), rho=float(rho),
                                  seed=int(rng.integers(1 << 31)), max_lag=int(max_lag),
                                  work_stealing=bool(work_stealing))
        if planner in ASP_FAMILY and reselect_every and it % reselect_every and chosen is not None:
            if planner.startswith("oracle_") and not is_oracle_estimate(problem):
                fn(problem, rng)  # raises the oracle planner's own error
            a = plan_asp(problem, rng, name=planner, **chosen)
            a.params["reused_from"] = float(it - it % reselect_every)
        else:
            a = fn(problem, rng)
            if planner in ASP_FAMILY and a.params.get("scenarios", 0.0) > 0:
                chosen = fixed_choice(a.params)
        a.validate(len(rows))
        assignments.append(a)
        summaries.append(summarize(problem, a))
    header: Dict[str, Any] = {
        "planner": planner,
        "planner_params": [{k: float(v) for k, v in a.params.items()} for a in assignments],
        "estimator": estimate.estimator,
        "estimator_params": {k: float(v) for k, v in estimate.params.items()},
        "instances": int(instances),
        "slots": int(slots),
        "kv_budget": kv_budget,
        "minibatch_groups": int(minibatch),
        "groups_per_iteration": int(groups_per_iteration) if groups_per_iteration else len(prompts),
        "max_new_tokens": int(max_new_tokens),
        "max_lag": int(max_lag),
        "work_stealing": bool(work_stealing),
        "rho": float(rho),
        "seed": int(seed),
        "cost": {"a": cost.a, "b": cost.b, "c": cost.c, "p": cost.p, "source": cost.source},
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "package_version": __version__,
        "summary": [s.as_dict() for s in summaries],
    }
    if provenance:
        header["sources"] = dict(provenance)
    plan = DispatchPlan.from_assignments(prompts, starts, assignments, estimate.median, estimate.group_max,
                                         header)
    return BuildResult(plan=plan, estimate=estimate, summaries=summaries)


def estimate_lengths(prompts: PromptSet, history, max_new_tokens: int, planner: str = "asp",
                     estimator_section=None, true_lengths: Optional[np.ndarray] = None) -> LengthEstimate:
    """Length estimate for `planner`: an OracleEstimator's for `oracle_*` planners, the configured one else."""
    from mindspeed_asp.config import EstimatorSection
    from mindspeed_asp.scheduler.estimators import make_estimator

    section = estimator_section or EstimatorSection()
    if needs_oracle(planner):
        section = section.model_copy(update={"kind": "oracle"})
    estimator = make_estimator(section, true_lengths=true_lengths)
    est = estimator.estimate(prompts, history, int(max_new_tokens))
    if est.samples is None and history is not None and "pred_log_error" not in est.params:
        tau = prediction_log_error(history, prompts)
        if tau is not None:
            est = replace(est, params={**est.params, "pred_log_error": tau})
    return est


def prediction_log_error(history, prompts: PromptSet, min_prompts: int = 16) -> Optional[float]:
    """How far a prompt's median log-length moves between the history's last two epochs (standard deviation).

    The planner's scenarios use it as the uncertainty of each predicted median (scenarios.py); None when
    fewer than two epochs or `min_prompts` prompts with both epochs are known.
    """
    epochs = history.epochs() if len(history) else []
    if len(epochs) < 2:
        return None
    ids = [str(p) for p in prompts.prompt_ids]
    last = history.epoch_matrix(ids, epochs[-1], prompts.n).astype(np.float64)
    prev = history.epoch_matrix(ids, epochs[-2], prompts.n).astype(np.float64)
    ok = (last > 0).all(axis=1) & (prev > 0).all(axis=1)
    if ok.sum() < min_prompts:
        return None
    d = np.log(np.median(last[ok], axis=1)) - np.log(np.median(prev[ok], axis=1))
    return float(d.std())


def plan_epoch(prompts: PromptSet, history, *, planner: str = "asp", estimator_section=None,
               true_lengths: Optional[np.ndarray] = None, **kw: Any) -> BuildResult:
    """Estimate lengths from `history` and build the plan: the one call the CLI and the runtime need."""
    est = estimate_lengths(prompts, history, kw["max_new_tokens"], planner=planner,
                           estimator_section=estimator_section, true_lengths=true_lengths)
    return build_plan(prompts, est, planner=planner, **kw)
