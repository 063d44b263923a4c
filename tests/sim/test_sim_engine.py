"""Invariants of the event-driven instance simulator (docs/simulator.md, "How it is checked")."""
import math

import numpy as np
import pytest

from mindspeed_asp.core.problem import CostModel, InstanceSpec
from mindspeed_asp.sim.engine import InstanceSim, simulate_instances
from mindspeed_asp.sim.instance_inputs import check_instance_inputs
from mindspeed_asp.sim.step_cost import TabulatedCost
from mindspeed_asp.sim.bounds import instance_step_bounds

COST = CostModel(a=5e-3, b=2e-5, c=2e-7, p=1e-6)


def naive_instance(order, lengths, plens, slots, cost):
    """Token-by-token reference: FCFS admission into B slots, one token per running sequence per step."""
    n = lengths.shape[1]
    queue = [(g, s) for g in order for s in range(n)]
    running = []  # [remaining, kv, sid]
    t = 0.0
    steps = 0
    finish = {}
    while queue or running:
        prefill = 0
        while len(running) < slots and queue:
            g, s = queue.pop(0)
            running.append([int(lengths[g, s]), int(plens[g]), g * n + s])
            prefill += int(plens[g])
        act = len(running)
        kv = sum(r[1] for r in running)
        t += cost.a + cost.b * act + cost.c * kv + cost.p * prefill
        steps += 1
        for r in running:
            r[0] -= 1
            r[1] += 1
        for r in [r for r in running if r[0] == 0]:
            finish[r[2]] = t
        running = [r for r in running if r[0] > 0]
    return t, steps, finish


def test_equal_lengths_give_ceil_n_over_b_times_l_steps():
    for G, n, B, L in ((50, 4, 16, 37), (7, 8, 64, 5), (33, 3, 10, 1), (64, 8, 64, 100)):
        lengths = np.full((G, n), L)
        tr = simulate_instances([np.arange(G)], lengths, np.full(G, 11), InstanceSpec(slots=B), COST)
        assert tr.steps[0] == math.ceil(G * n / B) * L


def test_matches_token_by_token_reference():
    rng = np.random.default_rng(3)
    G, n, B = 23, 3, 7
    lengths = rng.integers(1, 60, (G, n))
    plens = rng.integers(0, 40, G)
    order = rng.permutation(G)
    tr = simulate_instances([order], lengths, plens, InstanceSpec(slots=B), COST)
    t, steps, finish = naive_instance(list(order), lengths, plens, B, COST)
    assert tr.steps[0] == steps
    assert tr.busy[0] == pytest.approx(t, rel=1e-12)
    for sid, f in finish.items():
        assert tr.seq_finish[sid] == pytest.approx(f, rel=1e-12)
    # a group finishes with its last sample
    assert np.allclose(tr.group_finish, tr.seq_finish.reshape(G, n).max(axis=1))


def test_linear_cost_time_minus_a_steps_is_order_invariant():
    rng = np.random.default_rng(0)
    G, n = 60, 4
    lengths = rng.integers(1, 300, (G, n))
    plens = rng.integers(1, 50, G)
    owner = rng.integers(0, 3, G)
    base = None
    for _ in range(5):
        orders = [rng.permutation(np.flatnonzero(owner == j)) for j in range(3)]
        tr = simulate_instances(orders, lengths, plens, InstanceSpec(slots=8), COST)
        rest = tr.busy - COST.a * tr.steps
        if base is None:
            base = rest
        assert np.allclose(rest, base, rtol=1e-10)
        assert np.all(tr.steps >= instance_step_bounds(orders, lengths, plens, InstanceSpec(slots=8)))


def test_kv_budget_preemption_recomputes_and_never_exceeds_budget():
    rng = np.random.default_rng(1)
    G, n = 40, 4
    lengths = rng.integers(1, 200, (G, n))
    plens = rng.integers(1, 50, G)
    spec = InstanceSpec(slots=64, kv_budget=2500)
    free = simulate_instances([np.arange(G)], lengths, plens, InstanceSpec(slots=64), CostModel())
    pre = simulate_instances([np.arange(G)], lengths, plens, spec, CostModel())
    res = simulate_instances([np.arange(G)], lengths, plens, spec, CostModel(), kv_policy="reserve")
    assert pre.preemptions[0] > 0 and pre.recompute_tokens[0] > 0
    assert res.preemptions[0] == 0
    assert pre.kv_peak[0] <= 2500 and res.kv_peak[0] <= 2500
    assert free.kv_peak[0] > 2500
    # every sequence still produced exactly its length: the order-free part of the time is unchanged (p = 0)
    c = CostModel()
    for tr in (free, pre, res):
        assert tr.busy[0] - c.a * tr.steps[0] == pytest.approx(free.busy[0] - c.a * free.steps[0], rel=1e-9)
        assert np.all(np.isfinite(tr.seq_finish))
    kv_total = (plens[:, None] * lengths + lengths * (lengths - 1) // 2).sum()
    assert pre.steps[0] >= math.ceil(kv_total / 2500) and res.steps[0] >= math.ceil(kv_total / 2500)


def test_release_times_hold_groups_back():
    G, n = 6, 2
    lengths = np.full((G, n), 10)
    release = {g: (5.0 if g == 3 else 0.0) for g in range(G)}
    tr = simulate_instances([np.arange(G)], lengths, np.zeros(G, dtype=int), InstanceSpec(slots=64), COST,
                            release=release.__getitem__)
    assert tr.group_dispatch[3] >= 5.0
    assert tr.group_dispatch[4] >= tr.group_dispatch[3]  # plan order kept (head-of-line wait)
    assert tr.group_dispatch[0] == 0.0


def test_gate_and_notify_resume_mid_interval():
    G = 4
    lengths = np.array([[100], [100], [3], [3]])
    allowed = {0, 1}

    def gate(g, now):
        return None if g in allowed else math.inf

    cl = InstanceSim([np.array([0, 1, 2, 3])], lengths, np.zeros(G, dtype=int), InstanceSpec(slots=4), COST,
                     gate=gate)
    while cl.peek_time() < 0.2:
        cl.step()
    assert np.isnan(cl.rec.group_dispatch[2])
    allowed.update({2, 3})
    cl.notify(0.2)
    cl.run()
    assert 0.2 <= cl.rec.group_dispatch[2] < 0.2 + COST.a * 2
    assert cl.trace().steps[0] == 100  # admitted into free slots while the long ones run


def test_tabulated_cost_equals_linear_on_a_linear_table():
    rng = np.random.default_rng(2)
    G, n = 20, 4
    lengths = rng.integers(1, 80, (G, n))
    plens = rng.integers(1, 30, G)
    lin = CostModel(a=4e-3, b=3e-5, c=1e-7, p=0.0)
    act = np.array([1.0, 64.0])
    kv = np.array([0.0, 1e6])
    table = lin.a + lin.b * act[:, None] + lin.c * kv[None, :]
    t1 = simulate_instances([np.arange(G)], lengths, plens, InstanceSpec(slots=16), lin)
    t2 = simulate_instances([np.arange(G)], lengths, plens, InstanceSpec(slots=16), TabulatedCost(act, kv, table))
    assert t1.steps[0] == t2.steps[0]
    assert t2.busy[0] == pytest.approx(t1.busy[0], rel=1e-9)


def test_bad_inputs_are_refused():
    lengths = np.full((3, 2), 10)
    with pytest.raises(ValueError, match="kv_budget"):
        simulate_instances([np.arange(3)], lengths, np.full(3, 100), InstanceSpec(slots=4, kv_budget=50), COST)
    with pytest.raises(ValueError, match="twice"):
        simulate_instances([np.array([0, 1]), np.array([1, 2])], lengths, np.zeros(3, dtype=int),
                           InstanceSpec(slots=4), COST)
    with pytest.raises(RuntimeError, match="never finished"):
        simulate_instances([np.array([0, 1])], lengths, np.zeros(3, dtype=int), InstanceSpec(slots=4), COST)


_OK = dict(orders=[np.arange(3)], lengths=np.full((3, 2), 10), prompt_lens=np.full(3, 5), spec=InstanceSpec(slots=4),
           cost=COST)


@pytest.mark.parametrize("change,error,match", [
    ({"dispatch": "round_robin"}, ValueError, "dispatch must be one of"),
    ({"lengths": np.full(6, 10)}, ValueError, r"lengths must be \[G, n\]"),
    ({"lengths": np.zeros((3, 0), dtype=int)}, ValueError, "n >= 1 samples"),
    ({"lengths": np.full((3, 2), 0)}, ValueError, ">= 1 token"),
    ({"prompt_lens": np.full(2, 5)}, ValueError, r"prompt_lens must have shape \(3,\)"),
    ({"kv_policy": "evict"}, ValueError, "kv_policy"),
    ({"spec": InstanceSpec(slots=0)}, ValueError, "slots must be >= 1"),
    ({"spec": InstanceSpec(slots=4, kv_budget=15)}, ValueError, "kv_budget 15"),
    ({"cost": object()}, TypeError, "step_time"),
    ({"steal_load": np.ones(2)}, ValueError, "steal_load"),
    ({"orders": [np.array([0, 3])]}, ValueError, "out of range"),
    ({"orders": [np.array([0, 1]), np.array([1, 2])]}, ValueError, "instance 1: a group is placed twice"),
    ({"isolated": [3]}, ValueError, "isolated group 3"),
])
def test_check_instance_inputs_refuses_each_bad_input(change, error, match):
    """The simulator's input checks live in one function; each refusal names what it refuses."""
    kw = {**_OK, **change}
    pos = [kw.pop(k) for k in ("orders", "lengths", "prompt_lens", "spec", "cost")]
    with pytest.raises(error, match=match):
        check_instance_inputs(*pos, **kw)
    with pytest.raises(error, match=match):  # the simulator refuses it the same way
        InstanceSim(*pos, **kw)


def test_check_instance_inputs_flattens_per_sequence_and_derives_the_shared_queue():
    inp = check_instance_inputs([np.array([2, 0]), np.array([1])], np.array([[3, 4], [5, 6], [7, 8]]),
                                np.array([10, 20, 30]), InstanceSpec(slots=2), COST, dispatch="shared")
    assert (inp.groups, inp.samples, inp.slots, inp.kv_budget) == (3, 2, 2, math.inf)
    assert inp.response == [3, 4, 5, 6, 7, 8] and inp.prompt == [10, 10, 20, 20, 30, 30]
    assert inp.dispatch == "shared" and inp.shared_queue  # the argument kept as given, its meaning derived
    assert inp.group_load == [1.0, 1.0, 1.0] and inp.isolated == [False, False, False]
