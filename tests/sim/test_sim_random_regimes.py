"""Every registered planner through the simulator on small random problems: stale policy x KV budget
(none, tight, loose) x planner, each run to completion.

Why: a crash (stale policy "regenerate" + a KV budget + the ASP planner) can come from a combination no
test ran; here each planner the registry offers without an oracle, and oracle_asp fed an oracle estimate,
meets each stale policy and each KV level, and every run must train every group exactly once, keep its
metrics finite, and never end its rollout below the rollout lower bound R_LB (docs/design.md#lower-bounds).
"""
from __future__ import annotations

import itertools
from typing import Tuple

import numpy as np
import pytest

from mindspeed_asp.scheduler.planners import PLANNERS, get_planner, needs_oracle
from mindspeed_asp.sim.pipeline import STALE_POLICIES, simulate_pipeline
from mindspeed_asp.sim.train_time import TrainerModel
from mindspeed_asp.core.problem import CostModel, PlanningProblem

from factories import length_estimate, oracle_estimate, planning_problem, prompt_set, rho_trainer

COST = CostModel(a=0.030, b=1e-4, c=6e-8, p=1e-4)
KV_LEVELS = ("none", "tight", "loose")
RUN_PLANNERS = tuple(n for n in PLANNERS if not needs_oracle(n)) + ("oracle_asp",)


def make_case(seed: int, kv_level: str, oracle: bool) -> Tuple[PlanningProblem, np.ndarray, TrainerModel, float]:
    """A small random window: G groups of n samples, lognormal lengths with a few long outliers."""
    rng = np.random.default_rng(seed)
    G, n, m, B = int(rng.integers(10, 24)), int(rng.choice([2, 4])), int(rng.integers(2, 5)), int(rng.choice([4, 8]))
    cap = 256
    mu = rng.lognormal(np.log(30), 0.8, G)
    L = np.clip(np.rint(mu[:, None] * rng.lognormal(0, 0.5, (G, n))), 1, cap).astype(np.int64)
    P = rng.integers(4, 40, G)
    worst = int((P[:, None] + L).max()) + 1
    typical = int(np.median(P[:, None] + L))
    kv = {"none": None, "tight": max(worst, 2 * typical), "loose": max(worst, B * typical)}[kv_level]
    if oracle:
        est = oracle_estimate(L)
    else:
        noisy = np.median(L, 1) * rng.lognormal(0, 0.4, G)
        est = length_estimate(noisy, np.minimum(2 * noisy, cap), sigma=0.5, estimator="history")
    M = int(rng.integers(2, 6))
    max_lag = int(rng.integers(0, 3))
    rho = float(rng.choice([0.3, 1.0, 1.5]))
    problem = planning_problem(prompt_set(P, n, prefix="r"), est, instances=m, slots=B, kv_budget=kv, minibatch=M,
                               cost=COST, max_new_tokens=cap, rho=rho, seed=seed, max_lag=max_lag, work_stealing=True)
    trainer, r_lb = rho_trainer(problem, L, rho)
    return problem, L, trainer, r_lb


@pytest.mark.parametrize("policy,kv_level", list(itertools.product(STALE_POLICIES, KV_LEVELS)))
def test_every_planner_runs_to_completion(policy, kv_level):
    for k, name in enumerate(RUN_PLANNERS):
        seed = 1000 * STALE_POLICIES.index(policy) + 100 * KV_LEVELS.index(kv_level) + k
        problem, L, trainer, r_lb = make_case(seed, kv_level, oracle=needs_oracle(name))
        G = len(problem.prompts)
        a = get_planner(name)(problem, np.random.default_rng(seed))
        for mode in ("stream", "stock"):
            res = simulate_pipeline(problem, a, L, mode=mode, max_lag=problem.max_lag, trainer=trainer,
                                    stale_policy=policy, sync_time=0.05)
            trained = np.sort(res.mb_group_ids)
            dropped = res.metrics["lag/stale_dropped"] / problem.prompts.n
            assert len(trained) + dropped == G, (name, mode)
            assert len(np.unique(trained)) == len(trained), (name, mode)  # no group trained twice
            assert np.isfinite(res.trace.group_finish).all(), (name, mode)  # every group finished
            for key in ("time/iteration", "time/rollout", "throughput/e2e_tps", "rollout/preemptions",
                        "bubble/padding", "lag/max"):
                assert np.isfinite(res.metrics[key]), (name, mode, key)
            assert res.bounds["rollout/R_LB"] == pytest.approx(r_lb, rel=1e-12)
            # the bound holds for the busy time and for the rollout's wall time (pauses only add)
            assert res.metrics["rollout/makespan_busy"] >= r_lb * (1 - 1e-9), (name, mode, policy, kv_level)
            assert res.metrics["time/rollout"] >= r_lb * (1 - 1e-9), (name, mode)
