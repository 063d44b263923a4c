"""The simulated pipeline: lag bound, modes, lower bounds never beaten, oracle vs estimated twin."""
from typing import Optional, Tuple

import numpy as np
import pytest

from mindspeed_asp.core.problem import Assignment, CostModel, InstanceSpec, PlanningProblem
from mindspeed_asp.sim.pipeline import simulate_pipeline
from mindspeed_asp.sim.train_time import TrainerModel, alpha_for_rho, group_tokens

from factories import length_estimate, planning_problem, prompt_set, rho_trainer


def make_case(G: int = 96, n: int = 4, m: int = 3, seed: int = 0, median: float = 200.0, slots: int = 16,
              estimate_noise: Optional[float] = None) -> Tuple[PlanningProblem, np.ndarray]:
    """A lognormal window and its true lengths; the estimate is the truth, or the truth times a per-group
    lognormal error of `estimate_noise` (the estimated twin of the same window)."""
    rng = np.random.default_rng(seed)
    L = np.clip(np.exp(rng.normal(np.log(median), 0.9, (G, 1)) + rng.normal(0, 0.5, (G, n))), 1, 4000).astype(int)
    P = rng.integers(10, 100, G)
    est_len = L.astype(float)
    if estimate_noise is not None:
        est_len = est_len * np.exp(rng.normal(0, estimate_noise, (G, 1)))
    est = length_estimate(np.median(est_len, 1), est_len.max(1), sigma=0.5,
                          estimator="oracle" if estimate_noise is None else "noisy",
                          samples=est_len if estimate_noise is None else None)
    prob = planning_problem(prompt_set(P, n), est, instances=m, slots=slots, minibatch=8, max_new_tokens=4000)
    return prob, L


def trainer(prob: PlanningProblem, L: np.ndarray, rho: float = 1.0) -> TrainerModel:
    return rho_trainer(prob, L, rho)[0]


def random_assignment(G, m, rng, name="random"):
    perm = rng.permutation(G)
    return Assignment(orders=[perm[j::m] for j in range(m)], minibatch=np.full(G, -1), planner=name)


@pytest.mark.parametrize("max_lag", [0, 1, 2, 3])
def test_lag_never_exceeds_bound_and_every_sample_is_trained(max_lag):
    rng = np.random.default_rng(max_lag)
    prob, L = make_case(seed=max_lag)
    for rho in (0.3, 1.5):
        tr = trainer(prob, L, rho)
        for _ in range(3):
            res = simulate_pipeline(prob, random_assignment(96, 3, rng), L, mode="stream", max_lag=max_lag,
                                    trainer=tr, sync_time=0.05)
            assert len(res.lags) == L.size  # every sample trained exactly once
            assert res.lags.max() <= max_lag
            assert res.metrics["lag/max"] <= max_lag and res.metrics["lag/frac_over_bound"] == 0.0
            assert res.mb_groups.sum() == 96 and np.all(res.mb_groups[:-1] == 8)
            # the trainer never starts before its minibatch is ready, and updates do not overlap
            assert np.all(res.mb_start >= res.mb_ready - 1e-12)
            assert np.all(res.mb_start[1:] >= res.mb_sync_end[:-1] - 1e-12)


def test_max_lag_zero_is_synchronous_per_minibatch():
    prob, L = make_case(seed=5)
    res = simulate_pipeline(prob, random_assignment(96, 3, np.random.default_rng(0)), L, mode="stream",
                            max_lag=0, trainer=trainer(prob, L))
    assert np.all(res.lags == 0)
    # no group is dispatched while an update of an older version is pending: versions are 0..K-1, M each
    assert np.all(np.bincount(res.trace.group_version) == 8)


@pytest.mark.parametrize("max_lag", [1, 2])
def test_no_group_goes_stale_under_the_policy_and_both_stale_rules_agree(max_lag):
    # the policy's admission and waiting rules keep every group within its deadline: the stale rule (the
    # runtime's asp.stale_policy) never fires, so "drop" and "regenerate" simulate the same run
    prob, L = make_case(seed=6)
    a = random_assignment(96, 3, np.random.default_rng(1))
    tr = trainer(prob, L, 1.5)
    drop = simulate_pipeline(prob, a, L, mode="stream", max_lag=max_lag, trainer=tr, stale_policy="drop")
    regen = simulate_pipeline(prob, a, L, mode="stream", max_lag=max_lag, trainer=tr)  # default: regenerate
    for r in (drop, regen):
        assert len(r.lags) == L.size and r.lags.max() <= max_lag
        assert r.metrics["lag/regenerated_groups"] == 0 and r.metrics["lag/stale_dropped"] == 0
        assert r.trace.group_regenerated.sum() == 0
    assert np.array_equal(drop.mb_group_ids, regen.mb_group_ids)
    assert drop.metrics["time/iteration"] == regen.metrics["time/iteration"]
    assert sorted(regen.mb_group_ids.tolist()) == list(range(96))


def test_stale_policy_values_are_the_runtime_ones():
    prob, L = make_case(seed=6)
    a = random_assignment(96, 3, np.random.default_rng(1))
    with pytest.raises(ValueError, match="stale_policy"):
        simulate_pipeline(prob, a, L, mode="stream", max_lag=1, trainer=trainer(prob, L), stale_policy="wait")


def test_unbounded_lag_stream_matches_stock_rollout_and_beats_its_iteration():
    prob, L = make_case(seed=7)
    a = random_assignment(96, 3, np.random.default_rng(2))
    tr = trainer(prob, L, 1.0)
    # without stealing the ungated stream rollout is exactly stock's (same queues, nothing held)
    stream = simulate_pipeline(prob, a, L, mode="stream", max_lag=1000, trainer=tr, work_stealing=False)
    stock = simulate_pipeline(prob, a, L, mode="stock", max_lag=1000, trainer=tr)
    assert stream.metrics["time/rollout"] == pytest.approx(stock.metrics["time/rollout"], rel=1e-12)
    assert stock.metrics["rollout/steals"] == 0 and stream.metrics["rollout/steals"] == 0
    assert stream.metrics["time/iteration"] < stock.metrics["time/iteration"]
    assert stock.metrics["time/iteration"] == pytest.approx(
        stock.metrics["time/rollout"] + stock.metrics["time/train"], rel=1e-12)
    # stock trains minibatch k with version-0 samples: lag k
    assert stock.metrics["lag/max"] == tr.num_minibatches(96) - 1


def test_no_plan_beats_its_lower_bounds():
    rng = np.random.default_rng(11)
    prob, L = make_case(seed=11)
    for mode in ("stream", "stock"):
        for rho in (0.3, 1.0, 2.0):
            tr = trainer(prob, L, rho)
            for _ in range(4):
                res = simulate_pipeline(prob, random_assignment(96, 3, rng), L, mode=mode, max_lag=2, trainer=tr,
                                        sync_time=0.1)
                b = res.bounds
                assert res.metrics["rollout/makespan_busy"] >= b["rollout/R_LB"] * (1 - 1e-12)
                assert res.metrics["time/rollout"] >= b["rollout/R_LB"] * (1 - 1e-12)
                assert res.metrics["rollout/steps"] >= b["steps/LB"]
                key = "e2e/stream_LB" if mode == "stream" else "e2e/barrier_LB"
                assert res.metrics["time/iteration"] >= b[key] * (1 - 1e-12)
                assert res.metrics["time/first_minibatch"] >= b["e2e/first_minibatch_LB"] * (1 - 1e-12)
                assert all(v >= -1e-9 for v in res.above.values())


def test_sync_pauses_rollout_but_not_busy_time():
    prob, L = make_case(seed=12)
    a = random_assignment(96, 3, np.random.default_rng(3))
    tr = trainer(prob, L, 1.0)
    r0 = simulate_pipeline(prob, a, L, mode="stream", max_lag=1000, trainer=tr, sync_time=0.0)
    r1 = simulate_pipeline(prob, a, L, mode="stream", max_lag=1000, trainer=tr, sync_time=0.5)
    assert np.allclose(r0.trace.busy, r1.trace.busy)
    assert r1.metrics["time/rollout"] > r0.metrics["time/rollout"]
    assert r1.metrics["time/weight_sync"] == pytest.approx(0.5 * tr.num_minibatches(96))


def test_single_mode_needs_a_scaling_curve_and_uses_it():
    prob, L = make_case(seed=13)
    a = random_assignment(96, 3, np.random.default_rng(4))
    tr = trainer(prob, L, 0.5)
    with pytest.raises(ValueError, match="single_scaling"):
        simulate_pipeline(prob, a, L, mode="single", trainer=tr)
    slow = simulate_pipeline(prob, a, L, mode="single", trainer=tr, single_scaling=lambda m: 1.0)
    fast = simulate_pipeline(prob, a, L, mode="single", trainer=tr, single_scaling=lambda m: float(m))
    assert len(slow.trace.busy) == 1
    assert fast.metrics["time/rollout"] == pytest.approx(slow.metrics["time/rollout"] / 3, rel=1e-9)


def test_oracle_never_loses_to_its_estimated_twin_on_average():
    from mindspeed_asp.scheduler.planners import get_planner

    for name in ("lpt", "asp"):
        oracle, est = [], []
        for seed in range(4):
            prob_o, L = make_case(seed=20 + seed)
            prob_e, _ = make_case(seed=20 + seed, estimate_noise=0.8)
            tr = trainer(prob_o, L, 0.3)
            for prob, acc, pname in ((prob_o, oracle, f"oracle_{name}"), (prob_e, est, name)):
                a = get_planner(pname)(prob, np.random.default_rng(seed))
                acc.append(simulate_pipeline(prob, a, L, mode="stock", trainer=tr).metrics["time/rollout"])
        assert np.mean(oracle) <= np.mean(est), name


def test_alpha_for_rho_sets_total_train_time():
    prob, L = make_case(seed=14)
    tok = group_tokens(L, prob.prompts.prompt_lens).sum()
    alpha = alpha_for_rho(1.5, tok, 100.0, 12, overhead=0.5)
    assert alpha * tok + 12 * 0.5 == pytest.approx(150.0)
    with pytest.raises(ValueError):
        alpha_for_rho(0.1, tok, 10.0, 12, overhead=1.0)
    tr = TrainerModel(alpha=alpha, overhead=0.5, minibatch=8)
    res = simulate_pipeline(prob, random_assignment(96, 3, np.random.default_rng(5)), L, mode="stock", trainer=tr)
    assert res.metrics["time/train"] == pytest.approx(150.0)


def test_bad_arguments():
    prob, L = make_case(seed=15)
    a = random_assignment(96, 3, np.random.default_rng(6))
    tr = trainer(prob, L)
    with pytest.raises(ValueError, match="mode"):
        simulate_pipeline(prob, a, L, mode="async", trainer=tr)
    with pytest.raises(ValueError, match="shape"):
        simulate_pipeline(prob, a, L[:, :2], trainer=tr)
    with pytest.raises(ValueError, match="instance queues"):
        simulate_pipeline(prob, Assignment(orders=[np.arange(96)], minibatch=np.full(96, -1), planner="x"), L,
                          trainer=tr)


@pytest.mark.parametrize("policy", ["drop", "regenerate"])
def test_kv_budget_preemption_gate_and_sync_pause_together(policy):
    """All mechanisms at once: preemption under a KV budget, lag gating, weight-sync pauses, both stale rules."""
    from dataclasses import replace

    for seed in range(3):
        prob, L = make_case(G=60, n=4, m=2, seed=40 + seed, median=150.0)
        worst = int((L + prob.prompts.prompt_lens[:, None]).max())
        prob = replace(prob, spec=InstanceSpec(slots=16, kv_budget=max(worst + 2, 3000)))
        res = simulate_pipeline(prob, random_assignment(60, 2, np.random.default_rng(seed)), L, mode="stream",
                                max_lag=1, trainer=trainer(prob, L, 1.0), sync_time=0.2, stale_policy=policy)
        assert len(res.lags) == L.size and res.lags.max() <= 1
        assert np.all(res.trace.kv_peak <= prob.spec.kv_budget)
        assert res.trace.preemptions.sum() > 0  # the budget really binds
        assert res.metrics["time/iteration"] >= res.bounds["e2e/stream_LB"]
        assert res.metrics["rollout/steps"] >= res.bounds["steps/LB"]


def test_e2e_tps_divides_by_every_device_the_run_uses():
    """e2e_tps recomputed by hand from the run's tokens, its time and its devices (docs/design.md#e2e_tps):
    stream = instances x devices per instance + trainer devices; stock = the instances' devices once."""
    prob, L = make_case(seed=21)
    a = random_assignment(96, 3, np.random.default_rng(21))
    tr = trainer(prob, L)
    tokens = float((L + prob.prompts.prompt_lens[:, None]).sum())  # prompt + response of every trained sample
    cases = [("stream", {}, 3 * 1 + 1), ("stream", {"devices_per_instance": 2, "trainer_devices": 4}, 3 * 2 + 4),
             ("stream", {"devices_per_instance": 2}, 3 * 2 + 2), ("stock", {"devices_per_instance": 2}, 6),
             ("stock", {"trainer_devices": 1}, 4)]
    for mode, kw, devices in cases:
        res = simulate_pipeline(prob, a, L, mode=mode, max_lag=1, trainer=tr, **kw)
        t = res.metrics["time/iteration"]
        assert res.metrics["throughput/e2e_tps"] == pytest.approx(tokens / (devices * t)), (mode, kw)
        assert res.devices.total == devices and res.summary()["devices"]["total"] == devices
        assert res.summary()["devices"]["layout"] == ("colocated" if mode == "stock" and not kw.get(
            "trainer_devices") else "split")
        assert "throughput/perf_throughput" not in res.metrics  # folded into e2e_tps (same meaning)


def test_rho_stock_is_the_stock_runs_measured_train_over_rollout():
    """Given rho against stock's rollout, the converted simulator rho makes the simulated stock run's own
    train time / rollout time equal it; the simulator's rho (over R_LB) is the larger, since stock's rollout is
    never under R_LB (so a stock-relative 0.1 is a larger simulator rho)."""
    from mindspeed_asp.experiments import sweep

    cfg = sweep.SweepConfig(instances=8, slots=32, minibatch=8, rho_stock=0.1, max_lag=2,
                            cost=CostModel(a=0.03, b=1e-4, c=6e-8))
    wb = sweep.prepare("synthetic:prompts=64,n=4,median=1024,cap=8192", cfg, 3)
    rho, rho_s = sweep.resolve_rho(wb, cfg)
    assert rho_s == 0.1 and rho > rho_s and wb.stock_rollout >= wb.r_lb
    res, _ = sweep.run_planner(wb, "stock", "stock", cfg)
    assert res.metrics["time/train"] / res.metrics["time/rollout"] == pytest.approx(0.1, rel=1e-9)
    assert res.params["rho"] == pytest.approx(rho) and res.params["rho_stock"] == pytest.approx(0.1)
    # and from the old side: --rho 1.0 reports the stock-relative value R_LB / stock rollout
    cfg1 = sweep.SweepConfig(instances=8, slots=32, minibatch=8, rho=1.0, cost=cfg.cost)
    asp, _ = sweep.run_planner(wb, "asp", "stream", cfg1)
    assert asp.params["rho_stock"] == pytest.approx(wb.r_lb / wb.stock_rollout)


@pytest.mark.parametrize("dispatch,steal", [("plan", False), ("plan", True), ("fifo", False)])
def test_lag_budget_is_dealt_one_group_at_a_time_to_the_least_loaded_instance(dispatch, steal):
    """2 instances x 32 slots, n=4, minibatch 8 groups, max_lag 0: every version's budget of 8 groups is split
    4+4 as the runtime's dispatcher hands them out (fewest groups in flight first), never 8+0 with the first
    instance woken filling its 32 slots (docs/decisions/0003-simulator-takes-the-runtimes-dispatch.md)."""
    G, n, m = 32, 4, 2
    L = np.full((G, n), 50)
    P = np.full(G, 10)
    est = length_estimate(np.full(G, 50.0), np.full(G, 50.0), sigma=0.5, estimator="oracle",
                          samples=L.astype(float))
    prob = planning_problem(prompt_set(P, n), est, instances=m, slots=32, minibatch=8, max_new_tokens=4000)
    asg = Assignment(orders=[np.arange(0, 16), np.arange(16, 32)], minibatch=np.full(G, -1), planner="halves")
    res = simulate_pipeline(prob, asg, L, mode="stream", max_lag=0, trainer=TrainerModel(1e-4, 0.01, 8),
                            dispatch=dispatch, work_stealing=steal)
    gi, gv = res.trace.group_instance, res.trace.group_version
    for v in range(G // 8):
        assert np.bincount(gi[gv == v], minlength=m).tolist() == [4, 4], f"version {v}"
    # the groups of one version start together: both instances admit at the version's release
    for v in range(G // 8):
        d = res.trace.group_dispatch[gv == v]
        assert d.max() - d.min() < 1e-9
