"""Registry of planners: name -> callable(PlanningProblem, np.random.Generator) -> Assignment.

An "oracle_*" planner is the same algorithm fed an OracleEstimator's LengthEstimate (true lengths), which
separates prediction error from algorithm error. The callable itself refuses an estimate that is not an
oracle's, so a comparison can never silently label predicted lengths as an oracle.
"""
from __future__ import annotations

from typing import Callable, Dict, List

import numpy as np

from mindspeed_asp.core.planner_names import ORACLE_OF, ORACLE_PREFIX, PLANNER_NAMES
from mindspeed_asp.scheduler import baselines
from mindspeed_asp.scheduler.asp_planner import plan_asp
from mindspeed_asp.core.problem import Assignment, PlanningProblem

Planner = Callable[[PlanningProblem, np.random.Generator], Assignment]


def _named(fn: Planner, name: str) -> Planner:
    def run(problem: PlanningProblem, rng: np.random.Generator) -> Assignment:
        a = fn(problem, rng)
        a.planner = name
        a.validate(len(problem.prompts))
        return a

    run.__name__ = f"plan_{name}"
    run.__doc__ = fn.__doc__
    return run


def is_oracle_estimate(problem: PlanningProblem) -> bool:
    """An oracle estimate carries the true per-sample lengths and names itself an oracle."""
    est = problem.estimate
    return est.samples is not None and "oracle" in (est.estimator or "").lower()


def _oracle(fn: Planner, name: str) -> Planner:
    inner = _named(fn, name)

    def run(problem: PlanningProblem, rng: np.random.Generator) -> Assignment:
        if not is_oracle_estimate(problem):
            raise ValueError(f"planner {name!r} needs an oracle LengthEstimate (true per-sample lengths, "
                             f"estimator 'oracle'); got estimator {problem.estimate.estimator!r}")
        return inner(problem, rng)

    run.__name__ = f"plan_{name}"
    run.__doc__ = f"{name}: {fn.__doc__ or ''} (fed true lengths)"
    return run


_BASE: Dict[str, Planner] = {
    "asp": plan_asp,
    "stock": baselines.plan_stock,
    "random": baselines.plan_random,
    "sorted_asc": baselines.plan_sorted_asc,
    "sorted_desc": baselines.plan_sorted_desc,
    "round_robin": baselines.plan_round_robin,
    "least_loaded": baselines.plan_least_loaded,
    "verl_kk": baselines.plan_verl_kk,
    "lpt": baselines.plan_lpt,
    "shared_desc": baselines.plan_shared_desc,
}

PLANNERS: Dict[str, Planner] = {name: _named(fn, name) for name, fn in _BASE.items()}
PLANNERS["dataset_order"] = _named(baselines.plan_stock, "dataset_order")  # alias of stock
# FIFO in docs/design.md#baselines: dataset order dealt round-robin to instances.
PLANNERS["fifo"] = _named(baselines.plan_round_robin, "fifo")
for _name in ORACLE_OF:
    PLANNERS[ORACLE_PREFIX + _name] = _oracle(_BASE[_name], ORACLE_PREFIX + _name)
if tuple(PLANNERS) != PLANNER_NAMES:  # the config validates against the names alone
    raise RuntimeError(f"planner registry {list(PLANNERS)} differs from mindspeed_asp.core.planner_names "
                       f"{list(PLANNER_NAMES)}; change both together")


def needs_oracle(name: str) -> bool:
    """True for planners that must be fed true lengths (the builder then uses an OracleEstimator)."""
    return name.startswith(ORACLE_PREFIX)


def planner_names() -> List[str]:
    return list(PLANNERS)


def get_planner(name: str) -> Planner:
    """The planner called `name`; a ValueError lists the known names otherwise."""
    try:
        return PLANNERS[name]
    except KeyError:
        raise ValueError(f"unknown planner {name!r}; choose one of: {', '.join(PLANNERS)}") from None
