"""The rollout lower bound R_LB (docs/design.md#lower-bounds): its new terms by hand, the planner's and the
simulator's versions agree on exact lengths, and no simulated plan ever ends below it."""
from __future__ import annotations

import numpy as np
import pytest

from mindspeed_asp.core.fluid import bound_terms, group_moments, rollout_lower_bound
from mindspeed_asp.scheduler.planners import get_planner
from mindspeed_asp.sim import bounds as mx
from mindspeed_asp.sim.engine import simulate_instances
from mindspeed_asp.sim.pipeline import simulate_pipeline
from mindspeed_asp.sim.train_time import TrainerModel
from mindspeed_asp.core.problem import CostModel, InstanceSpec, PlanningProblem

from factories import oracle_estimate, planning_problem, prompt_set


def oracle_problem(L: np.ndarray, P: np.ndarray, m: int, spec: InstanceSpec, cost: CostModel) -> PlanningProblem:
    return planning_problem(prompt_set(P, L.shape[1], prefix="b"), oracle_estimate(L), instances=m,
                            slots=spec.slots, kv_budget=spec.kv_budget, minibatch=2, cost=cost,
                            max_new_tokens=int(L.max()), seed=0)


def test_anchor_term_by_hand():
    # one long group (solo 10) and work 24 elsewhere on 3 instances; the cheapest marginal cost of work
    # beside the long group is phi = f/w = 0.5
    work = np.array([1.0, 6.0, 6.0, 6.0, 6.0])
    fixed = np.array([0.5, 3.0, 3.0, 3.0, 3.0])
    solo = np.array([10.0, 4.0, 4.0, 4.0, 4.0])
    t = bound_terms(work, fixed, solo, 3)
    assert t["work_bound"] == pytest.approx(25 / 3) and t["solo_bound"] == 10.0
    # anchor for group 0: rest W' = 24, (m-1) s = 20 -> x = 4 / (1 + 2*0.5) = 2 -> 10 + 0.5*2 = 11
    assert t["anchor_bound"] == pytest.approx(11.0)
    assert t["pair_bound"] == 12.0 and t["R_LB"] == 12.0  # four groups of 6 on 3 instances: two share one
    # six groups of work 5 (fixed 2.5) beside it: x = (30 - 2*10) / (1 + 2*0.5) = 5 -> 10 + 0.5*5 = 12.5,
    # above work/m = 31/3 and the pair 5 + 5: the anchor term binds
    t2 = bound_terms(np.array([1.0] + [5.0] * 6), np.array([0.5] + [2.5] * 6), np.array([10.0] + [4.0] * 6), 3)
    assert t2["anchor_bound"] == pytest.approx(12.5) and t2["R_LB"] == pytest.approx(12.5)
    one = bound_terms(work, fixed, solo, 1)  # one instance: the long group plus everyone's fixed part
    assert one["anchor_bound"] == pytest.approx(10.0 + 12.0)


def test_group_solo_exceeds_sequence_solo_and_is_exact_for_a_lone_group():
    c = CostModel(a=1e-2, b=1e-3, c=1e-5, p=1e-4)
    L = np.array([[500, 300, 20]])
    P = np.array([40])
    b = mx.rollout_lower_bound(L, P, 2, InstanceSpec(slots=8), c)
    seq_solo = float(c.solo_time(np.array(500.0), np.array(40.0)))
    assert b["rollout/solo_bound"] > seq_solo
    tr = simulate_instances([np.array([0]), np.array([], dtype=int)], L, P, InstanceSpec(slots=8), c)
    assert b["rollout/R_LB"] == pytest.approx(tr.busy.max(), rel=1e-12)  # the whole group alone: exact


def test_planner_and_simulator_bounds_agree_on_exact_lengths():
    rng = np.random.default_rng(3)
    c = CostModel()
    for kv in (None, 40_000):
        L = np.clip(np.rint(rng.lognormal(np.log(400), 1.0, (60, 4))), 1, 4000)
        P = rng.integers(20, 300, 60)
        spec = InstanceSpec(slots=16, kv_budget=kv)
        p = oracle_problem(L, P, 4, spec, c)
        ref = mx.rollout_lower_bound(L, P, 4, spec, c)["rollout/R_LB"]
        assert rollout_lower_bound(group_moments(p), 4, c, kv_budget=kv) == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize("case", range(12))
def test_no_simulated_plan_beats_the_bound(case):
    rng = np.random.default_rng(100 + case)
    c = CostModel(a=float(rng.choice([5.7e-3, 0.03])), b=float(rng.choice([2e-5, 1e-4])),
                  c=float(rng.choice([1.8e-7, 6e-8])), p=float(rng.choice([0.0, 1e-4])))
    G, n, m = int(rng.integers(6, 40)), int(rng.choice([1, 4])), int(rng.integers(1, 5))
    tiny = case % 3 == 0  # tiny decodes with one long outlier: the anchor term binds
    if tiny:
        L = np.clip(np.rint(rng.lognormal(np.log(13), 0.6, (G, n))), 1, 2000)
        L[int(rng.integers(G)), 0] = 1900
    else:
        L = np.clip(np.rint(rng.lognormal(np.log(200), 1.0, (G, n))), 1, 3000)
    P = rng.integers(1, 200, G)
    worst = int((P[:, None] + L).max()) + 1
    kv = [None, worst, 4 * worst][case % 3 if not tiny else 0]
    spec = InstanceSpec(slots=int(rng.choice([4, 16, 64])), kv_budget=kv)
    p = oracle_problem(L.astype(np.int64), P, m, spec, c)
    r_lb = mx.rollout_lower_bound(L, P, m, spec, c)["rollout/R_LB"]
    tr = TrainerModel(alpha=1e-7, overhead=0.0, minibatch=2)
    for name in ("oracle_asp", "lpt", "round_robin", "sorted_asc", "least_loaded", "stock"):
        a = get_planner(name)(p, np.random.default_rng(case))
        for steal in (False, True):
            res = simulate_pipeline(p, a, L.astype(np.int64), mode="stream", max_lag=1, trainer=tr,
                                    work_stealing=steal)
            assert res.metrics["rollout/makespan_busy"] >= r_lb * (1 - 1e-9), (name, steal)
