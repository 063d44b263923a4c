"""Metric formulas and lower bounds (docs/design.md#metrics) on hand-checked cases."""

import numpy as np
import pytest

from mindspeed_asp.core.problem import CostModel, InstanceSpec
from mindspeed_asp.core.metrics import generation_padding
from mindspeed_asp.sim import bounds as mx
from mindspeed_asp.sim.engine import simulate_instances
from mindspeed_asp.sim.train_time import TrainerModel


def test_percent_above():
    assert mx.percent_above(110.0, 100.0) == pytest.approx(10.0)
    assert mx.percent_above(100.0, 100.0) == 0.0
    assert np.isnan(mx.percent_above(1.0, 0.0))


def test_padding_matches_simulated_idle_slot_steps():
    L = np.array([[10, 2], [2, 2]])
    tr = simulate_instances([np.arange(2)], L, np.zeros(2, dtype=int), InstanceSpec(slots=4), CostModel())
    # all four start together; the instance runs 10 steps with 16 of 40 slot-steps used
    assert tr.steps[0] == 10
    assert generation_padding(L.sum(), 4, tr.steps) == pytest.approx(1 - 16 / 40)


def test_rollout_bound_terms_and_tightness_for_one_sequence():
    c = CostModel(a=1e-2, b=1e-3, c=1e-5, p=1e-4)
    L = np.array([[500]])
    P = np.array([40])
    b = mx.rollout_lower_bound(L, P, 4, InstanceSpec(slots=8), c)
    tr = simulate_instances([np.array([0]), np.array([], dtype=int)], L, P, InstanceSpec(slots=8), c)
    # one sequence alone: the solo bound is exact
    assert b["rollout/R_LB"] == pytest.approx(tr.busy.max(), rel=1e-12)
    # pair bound: 3 groups on 2 instances -> two of them share one
    L3 = np.array([[100], [90], [80]])
    b3 = mx.rollout_lower_bound(L3, np.zeros(3, dtype=int), 2, InstanceSpec(slots=8), c)
    w = mx.group_work(L3, np.zeros(3, dtype=int), c, 8)
    assert b3["rollout/pair_bound"] == pytest.approx(w[1] + w[2])
    assert b3["rollout/work_bound"] == pytest.approx(w.sum() / 2)


def test_step_bounds_by_hand():
    L = np.array([[5, 5], [20, 1]])
    P = np.array([0, 10])
    s = mx.instance_step_bounds([np.array([0, 1])], L, P, InstanceSpec(slots=2, kv_budget=40))
    kv = (P[:, None] * L + L * (L - 1) // 2).sum()  # 10+10+(200+190)+(10+0) = 420 -> ceil(420/40) = 11
    assert kv == 420
    assert s[0] == max(-(-31 // 2), 20, 11)


def test_stream_and_barrier_bounds():
    L = np.array([[10], [20], [30], [40]])
    P = np.zeros(4, dtype=int)
    c = CostModel(a=1.0, b=0.0, c=0.0, p=0.0)
    tr = TrainerModel(alpha=0.5, overhead=1.0, minibatch=2)
    b = mx.lower_bounds(L, P, 1, InstanceSpec(slots=4), c, trainer=tr, sync_time=0.5)
    total = 0.5 * 100 + 2 * 1.0
    assert b["train/total"] == pytest.approx(total)
    # first minibatch cannot be ready before the 2nd-shortest group alone (20 steps of 1 s)
    assert b["e2e/first_minibatch_LB"] == pytest.approx(20.0)
    assert b["e2e/stream_LB"] == pytest.approx(max(b["rollout/R_LB"] + 0.5 * 10 + 1.0 + 0.5, 20 + total + 2 * 0.5))
    assert b["e2e/barrier_LB"] == pytest.approx(b["rollout/R_LB"] + total + 0.5)


def test_sorting_metrics_on_a_hand_timeline():
    # M = 2. groups finish at 1, 2 (minibatch 0 ready at 2), 6, 7 (ready at 7); rollout ends at 7.
    arrivals = np.array([1.0, 2.0, 6.0, 7.0])
    start = np.array([2.0, 7.0])
    busy_end = np.array([4.0, 9.0])
    out = mx.sorting_metrics(arrivals, np.array([2.0, 7.0]), start, busy_end, np.array([2, 2]), 2, 7.0, 9.0)
    # trainer idle with < 2 groups queued while rollout runs: [0, 2) and [4, 7) -> 5 of 9 s
    assert out["bubble/sorting"] == pytest.approx(5 / 9)
    assert out["bubble/startup"] == pytest.approx(2 / 9)
    assert out["bubble/arrival_gap_cv"] == 0.0  # one gap
    t, q = mx.queue_series(arrivals, start, np.array([2, 2]))
    assert q.max() == 2 and q[-1] == 0


def test_training_padding():
    out = mx.training_padding([np.array([10.0, 30.0]), np.array([5.0, 5.0])], micro_batch=None, dp=1)
    # padded: 2*30 + 2*5 = 70, real 50 -> 20 / 70
    assert out["bubble/padding_train"] == pytest.approx(20 / 70)
    out2 = mx.training_padding([np.array([10.0, 30.0, 20.0, 20.0])], micro_batch=None, dp=2)
    assert out2["bubble/dp_imbalance"] == pytest.approx(1.0)

