"""The runtime's online cost fit and rho meter (runtime/online_cost.py) and the WindowPlanner using them."""
from __future__ import annotations

import numpy as np
import pytest

from mindspeed_asp.runtime.online_cost import OnlineCostFit, RhoMeter
from mindspeed_asp.core.problem import CostModel

from factories import prompt_set

TRUE = CostModel(a=5e-3, b=1e-4, c=2e-7, p=1e-5, source="truth")
CONFIGURED = CostModel(a=1.0, b=0.0, c=0.0, p=0.0, source="configured")


def _steps(rng: np.random.Generator, n: int, noise: float = 0.02):
    """Engine steps as an instance reports them: decode steps of 1-32 sequences, some with a prefill."""
    active = rng.integers(1, 33, size=n)
    kv = active * rng.integers(20, 400, size=n)
    prefill = np.where(rng.random(n) < 0.2, active * rng.integers(10, 60, size=n), 0)
    t = TRUE.step_time(active, kv, prefill) * (1 + noise * rng.standard_normal(n))
    return [(int(a), int(k), int(p), float(s)) for a, k, p, s in zip(active, kv, prefill, t)]


def test_fit_recovers_the_engine_cost_from_its_steps():
    fit = OnlineCostFit(CONFIGURED, min_steps=200)
    fit.add_steps(_steps(np.random.default_rng(0), 2000))
    est = fit.estimate()
    assert est.source == "online" and est.steps == 2000
    c = est.cost
    assert c.a == pytest.approx(TRUE.a, rel=0.05)
    assert c.b == pytest.approx(TRUE.b, rel=0.05)
    assert c.c == pytest.approx(TRUE.c, rel=0.10)
    assert c.p == pytest.approx(TRUE.p, rel=0.10)
    assert est.r2 > 0.95


def test_configured_cost_until_enough_steps_and_idle_steps_skipped():
    fit = OnlineCostFit(CONFIGURED, min_steps=100)
    rows = _steps(np.random.default_rng(1), 99)
    assert fit.add_steps(rows + [(0, 0, 0, 0.01), (4, 100, 0, 0.0)]) == 99  # no sequence / no time: skipped
    assert fit.estimate().source == "configured" and fit.estimate().cost is CONFIGURED
    fit.add_steps(_steps(np.random.default_rng(2), 1))
    assert fit.estimate().source == "online"


def test_fit_follows_new_steps_and_keeps_the_most_recent():
    fit = OnlineCostFit(CONFIGURED, min_steps=50, max_steps=500, refit_every=50)
    rng = np.random.default_rng(3)
    slow = [(a, k, p, 3 * s) for a, k, p, s in _steps(rng, 500, noise=0.0)]
    fit.add_steps(slow)
    assert fit.estimate().cost.a == pytest.approx(3 * TRUE.a, rel=1e-3)
    fit.add_steps(_steps(rng, 500, noise=0.0))  # the engine got faster: the old steps age out
    assert fit.steps == 500
    assert fit.estimate().cost.a == pytest.approx(TRUE.a, rel=1e-3)


def test_identical_steps_cannot_be_fitted_and_keep_the_configured_cost():
    fit = OnlineCostFit(CONFIGURED, min_steps=10)
    fit.add_steps([(8, 800, 0, 0.01)] * 3)
    assert fit.estimate().source == "configured"


def test_rho_is_trainer_seconds_per_window_over_its_rollout_bound():
    cost = CostModel(a=0.01, b=0.0, c=0.0, p=0.0)
    meter = RhoMeter(default=1.0, minibatch_groups=1, instances=2, slots=4)
    assert meter.estimate(cost).source == "configured" and meter.estimate(cost).rho == 1.0
    # two groups on two instances, cost a only: R_LB = the longest sequence alone = 40 steps x 10 ms = 0.4 s
    meter.add_window(np.array([[10, 20], [30, 40]]), np.array([5, 5]))
    meter.add_update(0.1)
    meter.add_update(0.3)  # 0.2 s per update, 2 updates (groups / M) per window: 0.4 s of training
    est = meter.estimate(cost)
    assert est.source == "measured" and est.windows == 1 and est.updates == 2
    assert est.rollout_lb_s_per_window == pytest.approx(0.4)
    assert est.rho == pytest.approx(1.0)
    # the same window priced with a slower engine: the same training is a smaller share
    assert meter.estimate(CostModel(a=0.02, b=0.0, c=0.0, p=0.0)).rho == pytest.approx(0.5)


def test_rho_meter_refuses_bad_input():
    meter = RhoMeter(default=1.0, minibatch_groups=8, instances=2, slots=32)
    with pytest.raises(ValueError):
        meter.add_update(float("nan"))
    with pytest.raises(ValueError):
        meter.add_window(np.array([1, 2, 3]), np.array([1, 2, 3]))
    with pytest.raises(ValueError):
        RhoMeter(default=-1.0, minibatch_groups=8, instances=2, slots=32)


def test_window_planner_plans_later_windows_with_the_fitted_cost_and_measured_rho():
    from mindspeed_asp.config import AspSection
    from mindspeed_asp.runtime.replan import WindowPlanner

    P = 16
    prompts = prompt_set(np.full(P, 12, dtype=np.int64), 4, prefix="p")
    asp = AspSection(instances=2, slots=16, minibatch_groups=4, max_lag=1, planner="lpt")
    wp = WindowPlanner(asp, prompts, max_new_tokens=64, instances=2, seed=0)
    first = wp.plan(list(range(8)))
    assert first.cost["source"] == "configured" and first.rho["source"] == "configured"
    assert first.rho["rho"] == 1.0 and first.plan_seconds > 0
    rng = np.random.default_rng(4)
    for g in range(8):
        wp.observe(f"p{g}", 0, list(rng.integers(8, 64, size=4)), gid=g)
    wp.add_engine_steps(_steps(rng, 400))
    wp.add_update(0.5)
    wp.add_update(0.7)
    second = wp.plan(list(range(8, 16)))
    assert second.cost["source"] == "online" and second.cost["a"] == pytest.approx(TRUE.a, rel=0.1)
    assert second.rho["source"] == "measured" and second.rho["windows"] == 1 and second.rho["updates"] == 2
    assert second.rho["rho"] == pytest.approx(0.6 * 2 / second.rho["rollout_lb_s_per_window"])
    # without asp.online_fit every window keeps the configured cost and rho
    off = WindowPlanner(AspSection(instances=2, slots=16, minibatch_groups=4, planner="lpt", online_fit=False),
                        prompts, max_new_tokens=64, instances=2)
    off.plan(list(range(8)))
    off.add_engine_steps(_steps(rng, 400))
    assert off.plan(list(range(8, 16))).cost["source"] == "configured"
