"""ASP's selection cannot lose to its own candidates: with exact lengths (an oracle estimate) its plan's
simulated end-to-end time is <= every simple baseline's, in the regime the comparison runs (max_lag, rho,
work stealing, KV budget), whether the whole window was scored or a subsample whose best few were re-scored
on the whole window. Also: the subsample proxy keeps the KV budget in proportion to its slots, and the
isolation balance gives a dominant group an instance of its own."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from mindspeed_asp.core.fluid import group_moments
from mindspeed_asp.scheduler import asp_planner
from mindspeed_asp.scheduler.asp_planner import SCOPES, dominant_groups, isolate_balance
from mindspeed_asp.scheduler.planners import get_planner
from mindspeed_asp.sim.pipeline import simulate_pipeline
from mindspeed_asp.core.problem import InstanceSpec, PlanningProblem

from factories import length_estimate, oracle_estimate, planning_problem, prompt_set, rho_trainer

BASELINES = ("sorted_desc", "lpt", "verl_kk", "round_robin", "fifo", "sorted_asc", "least_loaded")


def window(G: int, seed: int, *, m: int = 4, slots: int = 16, n: int = 4, median: float = 300.0,
           cap: int = 4096, kv_budget=None, rho: float = 1.0, max_lag: int = 1, minibatch: int = 4):
    """A long-tailed window with an oracle estimate (true lengths) and the matching true lengths."""
    rng = np.random.default_rng(seed)
    mu = rng.lognormal(np.log(median), 1.0, G)
    L = np.clip(np.rint(mu[:, None] * rng.lognormal(0, 0.6, (G, n))), 1, cap)
    P = rng.integers(20, 200, G)
    p = planning_problem(prompt_set(P, n, prefix="w"), oracle_estimate(L), instances=m, slots=slots,
                         minibatch=minibatch, max_new_tokens=cap, kv_budget=kv_budget, rho=rho, seed=seed,
                         max_lag=max_lag, work_stealing=True)
    return p, L.astype(np.int64)


def e2e(problem: PlanningProblem, L: np.ndarray, name: str) -> float:
    """Simulated e2e time of `name`'s plan, as a comparison runs it (trainer from rho and the true R_LB,
    every planner given np.random.default_rng(seed))."""
    tr, _ = rho_trainer(problem, L, problem.rho)
    a = get_planner(name)(problem, np.random.default_rng(problem.seed))
    return simulate_pipeline(problem, a, L, mode="stream", max_lag=problem.max_lag, trainer=tr,
                             work_stealing=problem.work_stealing).metrics["time/iteration"]


@pytest.mark.parametrize("rho,max_lag,kv", [(0.3, 1, None), (1.5, 2, None), (1.0, 31, None), (1.5, 1, "tight"),
                                            (0.3, 2, "tight")])
def test_oracle_asp_is_never_behind_a_baseline_on_the_whole_window(rho, max_lag, kv):
    p, L = window(128, seed=int(10 * rho) + max_lag, rho=rho, max_lag=max_lag)
    if kv == "tight":  # a few long sequences fill an instance's KV: preemptions happen
        p = replace(p, spec=InstanceSpec(p.spec.slots, int((np.asarray(p.prompts.prompt_lens)[:, None]
                                                               + L).max()) * 3))
    asp = e2e(p, L, "oracle_asp")
    a = get_planner("oracle_asp")(p, np.random.default_rng(p.seed))
    assert a.params["selection_scope"] == SCOPES["full"]
    assert a.params["pred_e2e_mean"] == pytest.approx(asp, rel=1e-9)  # predicted == simulated: same run
    for name in BASELINES:
        assert asp <= e2e(p, L, name) * (1 + 1e-9), name


def test_subsample_then_whole_window_keeps_the_guarantee(monkeypatch):
    p, L = window(320, seed=7, rho=1.5, max_lag=2, minibatch=8)
    seqs = 320 * 4
    # over budget for the whole candidate set, enough for the subsample's top 3 plus the 6 baselines
    monkeypatch.setattr(asp_planner, "SIM_SEQ_FULL", seqs * 9)
    a = get_planner("oracle_asp")(p, np.random.default_rng(p.seed))
    assert a.params["selection_scope"] == SCOPES["subsample+full_top"]
    assert a.params["selection_groups"] == asp_planner.SELECT_GROUPS
    asp = e2e(p, L, "oracle_asp")
    assert a.params["pred_e2e_mean"] == pytest.approx(asp, rel=1e-9)
    for name in BASELINES:
        assert asp <= e2e(p, L, name) * (1 + 1e-9), name


def test_the_proxy_keeps_kv_per_slot():
    p, _ = window(800, seed=3, m=8, slots=64, kv_budget=600_000)
    sub = asp_planner._selection_problem(p, np.random.default_rng(0))
    assert len(sub.prompts) == asp_planner.SELECT_GROUPS and sub.spec.slots < p.spec.slots
    assert sub.spec.kv_budget / sub.spec.slots == pytest.approx(p.spec.kv_budget / p.spec.slots, rel=0.05)
    heaviest = int(np.argmax(group_moments(p).work))
    assert f"w{heaviest}" in set(sub.prompts.prompt_ids)  # the stratified subsample keeps the heaviest group


def test_isolation_gives_a_dominant_group_its_own_instance():
    # tiny decodes with one long outlier: its solo time is most of an instance's horizon
    rng = np.random.default_rng(5)
    G, n = 400, 8
    L = np.clip(np.rint(rng.lognormal(np.log(13), 0.7, (G, n))), 1, 2000)
    L[17, :] = np.clip(rng.normal(1500, 200, n), 1, 1900)
    P = rng.integers(100, 600, G)
    p = planning_problem(prompt_set(P, n), oracle_estimate(L), instances=8, slots=64, minibatch=16,
                         max_new_tokens=2000, seed=0)
    gm = group_moments(p)
    assert dominant_groups(gm, p).tolist() == [17]
    owner, info = isolate_balance(gm, p)
    mine = owner == owner[17]
    # the long group's instance carries less of the rest than any other instance
    per_inst = np.bincount(owner, weights=gm.work, minlength=8)
    assert gm.work[mine].sum() - gm.work[17] < np.delete(per_inst, owner[17]).min()


@pytest.mark.parametrize("seed", [5, 7])
def test_an_isolated_dominant_group_lets_the_rollout_reach_the_solo_bound(seed):
    """With exact lengths, ASP isolates the long outlier of a tiny-decode window, and its instance steals
    nothing while the outlier runs, so the rollout ends at the tightened R_LB (the outlier's solo time); the
    same plan whose instance may steal beside it ends later (the stolen sequences slow every step)."""
    from mindspeed_asp.sim.train_time import TrainerModel

    rng = np.random.default_rng(seed)
    G, n = 400, 8
    L = np.clip(np.rint(rng.lognormal(np.log(13), 0.7, (G, n))), 1, 2000).astype(np.int64)
    L[17, :] = np.clip(rng.normal(1500, 200, n), 1, 1900)
    # the lengths are int64 here, and so are the estimate's samples (oracle_estimate would make them float64)
    est = length_estimate(np.median(L, 1), L.max(1), samples=L, estimator="oracle")
    p = planning_problem(prompt_set(rng.integers(100, 600, G), n), est, instances=8, slots=64, minibatch=16,
                         max_new_tokens=2000, seed=0, rho=0.1, max_lag=10 ** 6,
                         work_stealing=True)  # rollout only: no lag gate
    a = get_planner("asp")(p, np.random.default_rng(0))
    assert 17 in a.isolated.tolist()
    trainer = TrainerModel(alpha=0.0, overhead=0.0, minibatch=16)
    iso = simulate_pipeline(p, a, L, mode="stock", max_lag=0, trainer=trainer, work_stealing=True)
    free = simulate_pipeline(p, replace(a, isolated=np.zeros(0, dtype=np.int64)), L, mode="stock", max_lag=0,
                             trainer=trainer, work_stealing=True)
    assert iso.above["time/rollout"] < 1.0  # percent above R_LB
    assert free.metrics["time/rollout"] > 1.02 * iso.metrics["time/rollout"]


def test_isolation_takes_at_most_one_dominant_group_per_instance():
    """Twelve long outliers over 8 instances: the 8 with the longest solo time are isolated, one per instance;
    the other four are placed as ordinary groups (stacking them would leave no instance free to steal)."""
    rng = np.random.default_rng(3)
    G, n, m = 400, 8, 8
    L = np.clip(np.rint(rng.lognormal(np.log(13), 0.7, (G, n))), 1, 2000)
    outliers = np.arange(20, 32)
    L[outliers, :] = np.linspace(1800, 1200, len(outliers))[:, None]
    p = planning_problem(prompt_set(np.full(G, 300), n), oracle_estimate(L), instances=m, slots=64, minibatch=16,
                         max_new_tokens=2000, seed=0)
    gm = group_moments(p)
    dom = dominant_groups(gm, p)
    assert dom.tolist() == outliers[:m].tolist()
    owner, _ = isolate_balance(gm, p)
    assert len(set(owner[dom].tolist())) == m
