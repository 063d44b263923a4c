"""The one metrics core (mindspeed_asp.core.metrics) on hand-checked cases, and its callers agreeing with it:
the run recorder's spans and a simulated run give the core's numbers (the sample queue:
tests/runtime/test_sample_queue.py)."""
from __future__ import annotations

import numpy as np
import pytest

from mindspeed_asp.core import metrics as m
from mindspeed_asp.runtime.run_recorder import GroupSpan, group_skewness, run_padding

from factories import length_estimate, planning_problem, prompt_set


def test_percentile_is_nearest_rank():
    lags = [0] * 98 + [1, 3]
    assert m.percentile(lags, 99) == 1.0  # the 99th of 100 sorted values; interpolation would give 1.02
    assert m.percentile([5, 1, 3], 50) == 3.0 and m.percentile([5, 1, 3], 100) == 5.0
    assert m.percentile([7], 99) == 7.0 and m.percentile([], 99) == 0.0


def test_lag_stats_by_hand():
    s = m.lag_stats([0] * 98 + [1, 3], max_lag=2)
    assert s == {"lag/mean": 0.04, "lag/p99": 1.0, "lag/max": 3.0, "lag/frac_over_bound": 0.01}
    assert m.lag_stats([], 1) == {"lag/mean": 0.0, "lag/p99": 0.0, "lag/max": 0.0, "lag/frac_over_bound": 0.0}
    assert m.lag_histogram([2, 0, 2]) == {"0": 1, "2": 2} and m.lag_histogram([]) == {}


def test_skewness_tail_and_padding_by_hand():
    assert m.skewness([10.0, 5.0]) == pytest.approx(0.25) and m.skewness([3.0, 3.0]) == 0.0 and m.skewness([]) == 0.0
    assert m.tail_share([1.0] * 9 + [10.0]) == pytest.approx(0.9)
    assert m.tail_share([3.0, 4.0], start=2.0) == 0.0 and m.tail_share([]) == 0.0
    # 2 instances x B=4: sum L = 24, steps 5 and 3 -> 1 - 24 / (4 * 8) = 0.25
    assert m.generation_padding(24, 4, [5, 3]) == pytest.approx(0.25)
    assert m.idle_share(5.0, 4.0) == 0.0 and m.idle_share(1.0, 0.0) == 0.0
    assert m.micro_batch_padding([3, 5, 4]) == (3.0, 12.0) and m.micro_batch_padding([]) == (0.0, 0.0)
    assert m.padding_share(3.0, 12.0) == pytest.approx(0.2) and m.padding_share(0.0, 0.0) == 0.0


def _span(instance, gid, start, end, lengths, window=0):
    return GroupSpan(instance, gid, start, start, end, 10, sum(lengths), list(lengths), 0, window)


def test_recorder_spans_go_through_the_core():
    spans = [_span(0, 0, 0.0, 10.0, [4, 4]), _span(1, 1, 0.0, 5.0, [2, 2]), _span(1, 2, 5.0, 6.0, [1])]
    sk = group_skewness(spans, 2)
    assert sk["skew"] == m.skewness([10.0, 6.0])
    assert sk["after90"] == m.tail_share([10.0, 5.0, 6.0], start=0.0)
    # with engine step counts the padding is the core's step form, without them the slot-time form
    assert run_padding(spans, 4, {0: 4, 1: 3}) == (m.generation_padding(13, 4, [4, 3]), "steps")
    used = 10.0 * 8 / 4 + 5.0 * 4 / 2 + 1.0 * 1 / 1
    assert run_padding(spans, 4, {}) == (pytest.approx(m.idle_share(used, 4 * 16.0)), "time")


def test_simulator_reports_the_core_statistics():
    """A simulated streaming run: its lag and bubble metrics are the core's on the run's own numbers."""
    from mindspeed_asp.sim.pipeline import simulate_pipeline
    from mindspeed_asp.sim.train_time import TrainerModel
    from mindspeed_asp.core.problem import Assignment

    rng = np.random.default_rng(0)
    G, n, inst = 48, 4, 3
    L = rng.integers(5, 400, size=(G, n))
    P = rng.integers(10, 50, G)
    est = length_estimate(np.median(L, 1).astype(float), L.max(1).astype(float), samples=L * 1.0)
    prob = planning_problem(prompt_set(P, n), est, instances=inst, slots=8, minibatch=4, max_new_tokens=400,
                            max_lag=2)
    order = rng.permutation(G)
    plan = Assignment(orders=[order[j::inst] for j in range(inst)], minibatch=np.full(G, -1), planner="random")
    res = simulate_pipeline(prob, plan, L, mode="stream", max_lag=2,
                            trainer=TrainerModel(alpha=2e-5, overhead=0.05, minibatch=4))
    assert len(res.lags) == G * n and max(res.lags) > 0  # lags to summarise
    for k, v in m.lag_stats(res.lags, 2).items():
        assert res.metrics[k] == v, k
    assert res.metrics["bubble/skewness"] == m.skewness(res.trace.busy)
    assert res.metrics["bubble/padding"] == m.generation_padding(L.sum(), 8, res.trace.steps)


# ------------------------------------------------------------------ e2e_tps over every device, rho vs stock
def test_device_count_split_and_colocated():
    split = m.split_devices(8, devices_per_instance=2, trainer_devices=4)
    assert (split.rollout, split.trainer, split.total, split.layout) == (16, 4, 20, "split")
    assert split.describe() == "20 (16 rollout + 4 trainer, split)"
    co = m.colocated_devices(16)
    assert co.total == 16 and co.layout == "colocated"  # every device generates and trains: counted once
    assert m.DeviceCount.from_dict(split.to_dict()) == split and m.DeviceCount.from_dict(co.to_dict()) == co
    assert split.to_dict()["definition"] == m.E2E_TPS_DEFINITION
    with pytest.raises(ValueError):
        m.split_devices(0, trainer_devices=0)  # no device at all
    with pytest.raises(ValueError):
        m.split_devices(2, devices_per_instance=0)


def test_e2e_tps_divides_by_every_device():
    # 8 + 8 split: 16 devices; 32000 tokens in 10 s -> 200 tokens/s/device (not 400 over the rollout half)
    assert m.e2e_tps(32_000, 10.0, m.split_devices(8, 1, 8)) == pytest.approx(200.0)
    assert m.e2e_tps(32_000, 10.0, m.colocated_devices(16)) == pytest.approx(200.0)
    assert m.e2e_tps(32_000, 10.0, 4) == pytest.approx(800.0)
    assert m.e2e_tps(5, 0.0, 3) == 0.0
    with pytest.raises(ValueError):
        m.e2e_tps(1, 1.0, 0)


def test_devices_of_reads_only_this_definition():
    assert m.devices_of({"devices": m.split_devices(2, 1, 1).to_dict()}).total == 3
    assert m.devices_of({}) is None  # a summary without a devices record
    assert m.devices_of({"devices": 4}) is None
    assert m.devices_of({"devices": {**m.split_devices(2).to_dict(), "definition": "instances"}}) is None


def test_rho_conversion_round_trip():
    # trainer work 30 s; R_LB 20 s; stock's measured rollout 60 s
    assert m.rho_stock(30.0, 60.0) == pytest.approx(0.5)
    assert m.rho_stock_from_rlb(1.5, 20.0, 60.0) == pytest.approx(0.5)  # same trainer time: 1.5 x 20 = 30
    assert m.rho_rlb_from_stock(0.5, 20.0, 60.0) == pytest.approx(1.5)
    for rho in (0.0, 0.3, 1.0, 2.7):
        assert m.rho_rlb_from_stock(m.rho_stock_from_rlb(rho, 13.0, 41.0), 13.0, 41.0) == pytest.approx(rho)
    with pytest.raises(ValueError):
        m.rho_stock(1.0, 0.0)
    with pytest.raises(ValueError):
        m.rho_stock_from_rlb(1.0, 0.0, 5.0)
