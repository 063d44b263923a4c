"""The ASP planner scores its candidates in the regime the plan runs in (max_lag, work stealing), and its
candidate set holds baseline orders, so with exact lengths it is never worse than them on its own scenario."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from mindspeed_asp.scheduler import asp_planner, baselines
from mindspeed_asp.scheduler.asp_planner import BASELINE_THETA, ORDER_RULES, _score, plan_asp
from mindspeed_asp.scheduler.build import build_plan
from mindspeed_asp.sim.pipeline import simulate_pipeline
from mindspeed_asp.sim.train_time import TrainerModel

from factories import skewed_problem


def _direct(problem, cand, lengths, rho):
    """The scoring simulation written out: what _score must compute for one candidate and scenario."""
    from mindspeed_asp.core.fluid import group_moments, rollout_lower_bound

    gm = group_moments(problem)
    train_total = rho * rollout_lower_bound(gm, problem.instances, problem.cost)
    plen = np.asarray(problem.prompts.prompt_lens, dtype=np.float64)
    tokens = float((lengths.sum(axis=1) + problem.prompts.n * plen).sum())
    tr = TrainerModel(alpha=train_total / tokens, overhead=0.0, minibatch=problem.minibatch)
    return simulate_pipeline(problem, cand, lengths, mode="stream", max_lag=problem.max_lag, trainer=tr,
                             with_bounds=False, work_stealing=problem.work_stealing).metrics["time/iteration"]


def test_score_uses_the_problems_max_lag_and_stealing():
    p = skewed_problem(96, m=4, slots=32, minibatch=4, seed=5, oracle=True)
    truth = np.asarray(p.estimate.samples)
    # a skewed candidate: instance 0 holds half the groups, so stealing and the lag bound both matter
    orders = [np.arange(0, 48), np.arange(48, 64), np.arange(64, 80), np.arange(80, 96)]
    cand = baselines._untagged(orders, 96, "skewed")
    got = {}
    for lag in (1, 8):
        for steal in (False, True):
            q = replace(p, max_lag=lag, work_stealing=steal)
            sc, how, k, lengths = _score(q, [cand], np.random.default_rng(0))
            assert how == 2.0 and k == 1 and np.array_equal(lengths[0], np.minimum(truth, q.max_new_tokens))
            assert sc[0][0] == pytest.approx(_direct(q, cand, lengths[0], q.rho), rel=1e-12)
            got[lag, steal] = sc[0][0]
    assert got[1, False] > got[8, False]  # a tight bound costs time: the score must see it
    assert got[8, True] < got[8, False]  # stealing absorbs the skew: the score must see it


def test_plan_asp_never_loses_to_the_baseline_orders_it_scores_with_exact_lengths():
    for rho, lag in ((1.5, 15), (0.3, 1)):
        p = replace(skewed_problem(128, m=4, slots=32, minibatch=8, seed=11, oracle=True, rho=rho), max_lag=lag)
        a = plan_asp(p, np.random.default_rng(0))
        assert a.params["scored_max_lag"] == lag and a.params["scored_work_stealing"] == 1.0
        truth = np.asarray(p.estimate.samples)
        mine = _direct(p, a, truth, rho)
        for rule in asp_planner.BASELINE_ORDERS:
            if rule == "verl_kk":
                continue  # random order inside instances: another draw than the one scored
            b = asp_planner.baseline_candidate(p, rule, np.random.default_rng(0), "b")
            assert mine <= _direct(p, b, truth, rho) * (1 + 1e-9)


def test_a_winning_baseline_order_is_recorded_and_reused_by_later_windows():
    p = skewed_problem(64, m=4, slots=32, minibatch=4, seed=2, oracle=True)
    a = plan_asp(p, np.random.default_rng(0), rules=("sorted_asc",))  # one candidate: no search
    ref = baselines.plan_sorted_asc(p, np.random.default_rng(0))
    assert all(np.array_equal(x, y) for x, y in zip(a.orders, ref.orders))
    assert a.params["order_rule"] == ORDER_RULES["sorted_asc"] and a.params["theta"] == BASELINE_THETA
    assert (a.minibatch >= 0).all()  # ASP's stratified tags ride on the baseline order
    again = plan_asp(p, np.random.default_rng(1), **asp_planner.fixed_choice(a.params))
    assert all(np.array_equal(x, y) for x, y in zip(a.orders, again.orders))
    with pytest.raises(ValueError, match="unknown order rule"):
        plan_asp(p, np.random.default_rng(0), rules=("nope", "curve"))


def test_build_plan_passes_max_lag_and_stealing_to_every_window():
    p = skewed_problem(48, m=2, slots=16, minibatch=4, seed=4)
    res = build_plan(p.prompts, p.estimate, instances=2, slots=16, minibatch=4, max_new_tokens=p.max_new_tokens,
                     groups_per_iteration=24, max_lag=3, work_stealing=False, reselect_every=0)
    assert res.plan.header["max_lag"] == 3 and res.plan.header["work_stealing"] is False
    for params in res.plan.header["planner_params"]:
        assert params["scored_max_lag"] == 3.0 and params["scored_work_stealing"] == 0.0
    with pytest.raises(ValueError, match="max_lag"):
        build_plan(p.prompts, p.estimate, instances=2, slots=16, minibatch=4, max_new_tokens=p.max_new_tokens,
                   max_lag=-1)
    json.dumps(res.plan.header["planner_params"], allow_nan=False)  # no NaN in the plan header
