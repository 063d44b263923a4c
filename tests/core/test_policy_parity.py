"""One scripted trace through the simulator and through the runtime's dispatcher + sample queue: the same
dispatch, steal, admission and training-order decisions, for stock, async and asp at max_lag 0, 1 and 2.

Why: the planner scores its candidates with the simulator, so a simulated figure is only worth something if
the simulator runs the runtime's policy (docs/design.md#shared-policy). Both sides call
`mindspeed_asp/core/policy.py`; this test keeps the *callers* equal too (when they offer work, in which order
they ask, which events they report).

The script makes the two engine models agree exactly: every instance runs one group at a time (simulator:
slots = n and equal sample lengths within a group; runtime: dispatcher capacity 1, and the simulator deals
its lag budget with the same capacity), a step costs 1 s, so a
group finishes `length` seconds after it starts; an update of the trainer takes `alpha * tokens + overhead`
seconds, weight sync is instant. The runtime side is an event loop over the runtime's own `Dispatcher`,
`SampleQueue` and `LagPolicy` (no engines, no Ray). The trace has no two events at the same time, so the
order of simultaneous events (which the two loops may process differently) never decides anything.

Isolation (an instance running a group the plan isolated steals nothing) needs an instance with a free slot
beside a running group, so its script runs two groups per instance with no lag bound: dispatches then happen
only when a group ends, on the step grid of both engines, and the two sides still agree decision for decision.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np
import pytest

from mindspeed_asp.core.policy import LagPolicy
from mindspeed_asp.runtime.dispatcher import MODE_POLICY, Dispatcher, Ticket
from mindspeed_asp.runtime.sample_queue import SampleQueue
from mindspeed_asp.scheduler.baselines import plan_stock
from mindspeed_asp.core.fluid import group_moments
from mindspeed_asp.sim.pipeline import simulate_pipeline
from mindspeed_asp.sim.train_time import TrainerModel
from mindspeed_asp.core.problem import Assignment, CostModel, InstanceSpec, PlanningProblem

from factories import length_estimate, planning_problem, prompt_set

G, N, INSTANCES, M = 24, 2, 3, 2  # M < instances: admission leaves an instance idle
PROMPT = 4  # prompt tokens per sample
TRAINER = TrainerModel(alpha=0.013, overhead=0.37, minibatch=M)
INF = float("inf")


def script(seed: int = 3):
    """Group lengths (distinct, one per group), predicted loads and an unbalanced tagged plan for asp."""
    rng = np.random.default_rng(seed)
    lengths = rng.choice(np.arange(20, 400), size=G, replace=False).astype(np.int64)
    predicted = lengths * rng.uniform(0.7, 1.3, G)  # the planner's estimate: close, not exact
    order = np.argsort(-predicted, kind="stable")
    # an unbalanced plan: instance 1 gets half the groups, instance 0 the fewest predicted tokens, so instance
    # 0 drains first and steals from the heavier, higher-numbered queue
    queues = [order[2::4][::-1][:4], order[1::2], np.concatenate([order[0::4], order[2::4][::-1][4:]])]
    tags = np.empty(G, dtype=np.int64)
    tags[order] = rng.permutation(G) // M  # plan tags that disagree with arrival and version order
    tags[order[::5]] = -1  # and some untagged groups
    return lengths, predicted, queues, tags


def problem(lengths: np.ndarray, predicted: np.ndarray, groups: np.ndarray) -> PlanningProblem:
    """The script's `groups` as one window: the planner's estimate is `predicted`, a step costs 1 s."""
    est = length_estimate(predicted[groups], predicted[groups], estimator="script",
                          samples=np.repeat(predicted[groups][:, None], N, 1))
    prompts = prompt_set(np.full(len(groups), PROMPT, dtype=np.int64), N, prefix="p", ids=groups)
    return planning_problem(prompts, est, instances=INSTANCES, slots=N, minibatch=M,
                            cost=CostModel(a=1.0, b=0.0, c=0.0, p=0.0), max_new_tokens=int(lengths.max()))


@dataclass
class Decisions:
    """Everything the policy decided, in comparable form."""

    dispatch: Dict[int, Tuple[int, float, int]]  # group -> (instance, start time, version at dispatch)
    stolen: Dict[int, int]  # group -> thief (the victim is the group's plan instance)
    minibatches: List[List[int]]  # groups of each update, in training order
    starts: List[float]  # update start times

    def assert_equal(self, other: "Decisions") -> None:
        assert self.dispatch.keys() == other.dispatch.keys()
        for g in sorted(self.dispatch):
            (j1, t1, v1), (j2, t2, v2) = self.dispatch[g], other.dispatch[g]
            assert (j1, v1) == (j2, v2), f"group {g}: instance/version {(j1, v1)} vs {(j2, v2)}"
            assert t1 == pytest.approx(t2, abs=1e-9), f"group {g}: dispatched at {t1} vs {t2}"
        assert self.stolen == other.stolen
        assert self.minibatches == other.minibatches
        assert np.allclose(self.starts, other.starts, atol=1e-9)


# --------------------------------------------------------------------------------------------- the simulator
def simulated(mode: str, max_lag: int) -> Decisions:
    lengths, predicted, queues, tags = script()
    L = np.repeat(lengths[:, None], N, 1)
    if mode == "stock":  # MindSpeed-RL's iterations of M groups, each rolled out in full, then trained
        dispatch, mbs, starts, t0 = {}, [], [], 0.0
        for i in range(G // M):
            groups = np.arange(i * M, (i + 1) * M)
            prob = problem(lengths, predicted, groups)
            res = simulate_pipeline(prob, plan_stock(prob, np.random.default_rng(0)), L[groups], mode="stock",
                                    trainer=TRAINER, with_bounds=False)
            tr = res.trace
            for k, g in enumerate(groups.tolist()):
                dispatch[g] = (int(tr.group_instance[k]), t0 + float(tr.group_dispatch[k]), i)
            mbs.append([int(groups[k]) for k in res.mb_group_ids])
            starts.append(t0 + float(res.mb_start[0]))
            t0 += res.metrics["time/iteration"]
        return Decisions(dispatch, {}, mbs, starts)
    prob = problem(lengths, predicted, np.arange(G))
    if mode in ("asp", "asp_shared"):  # asp_shared: the plan's order from one queue, least-loaded
        a = Assignment(orders=queues, minibatch=tags, planner="script", shared=mode == "asp_shared")
        res = simulate_pipeline(prob, a, L, mode="stream", max_lag=max_lag, trainer=TRAINER, with_bounds=False,
                                group_capacity=1)
    else:  # async: one FIFO in dataset order, untagged
        a = Assignment(orders=queues, minibatch=None, planner="script")
        res = simulate_pipeline(prob, a, L, mode="stream", max_lag=max_lag, trainer=TRAINER, with_bounds=False,
                                dispatch="fifo", group_capacity=1)
    tr = res.trace
    assert res.metrics["lag/regenerated_groups"] == 0 and res.lags.max() <= max_lag
    dispatch = {g: (int(tr.group_instance[g]), float(tr.group_dispatch[g]), int(tr.group_version[g]))
                for g in range(G)}
    stolen = {g: int(tr.group_instance[g]) for g in np.flatnonzero(tr.group_stolen).tolist()}
    cuts = np.cumsum(res.mb_groups)[:-1]
    mbs = [part.tolist() for part in np.split(res.mb_group_ids, cuts)]
    return Decisions(dispatch, stolen, mbs, res.mb_start.tolist())


# --------------------------------------------------------------------------------------------- the runtime
@dataclass
class _Sample:
    min_version: int


@dataclass
class _Group:
    group_id: int
    samples: List[_Sample]
    minibatch: int = -1


def runtime(mode: str, max_lag: int) -> Decisions:
    """The runtime's dispatcher, sample queue and lag policy, driven as the driver drives them."""
    lengths, predicted, queues, tags = script()
    prob = problem(lengths, predicted, np.arange(G))
    load = group_moments(prob).area  # the simulator's steal load (predicted tokens)
    now = 0.0
    lag = LagPolicy(0 if mode == "stock" else max_lag, M)
    planned = mode in ("asp", "asp_shared")
    d = Dispatcher(MODE_POLICY["asp" if planned else mode], INSTANCES, capacity=None if mode == "stock" else 1,
                   work_stealing=planned, clock=lambda: now, lag=lag)
    q = SampleQueue(lag)
    prefer = "plan_tag" if planned else "oldest"
    if planned:
        d.load_window([Ticket(g, float(load[g])) for g in range(G)], plan_queues=[q_.tolist() for q_ in queues],
                      shared=mode == "asp_shared")
    elif mode == "async":
        d.load_window([Ticket(g, float(load[g])) for g in range(G)])
    loaded = G if mode != "stock" else 0
    busy_until = [0.0] * INSTANCES  # the engine: one group at a time, in submission order
    finishes: List[Tuple[float, int, int]] = []
    dispatch: Dict[int, Tuple[int, float, int]] = {}
    version, train_end, mbs, starts, times = 0, INF, [], [], []

    def fill() -> None:
        for j, t in d.fill(version):
            start = max(now, busy_until[j])
            busy_until[j] = start + float(lengths[t.gid])
            dispatch[t.gid] = (j, start, t.version)
            heapq.heappush(finishes, (busy_until[j], t.gid, j))

    def train() -> None:
        nonlocal train_end
        if train_end < INF or lag.must_wait(version):
            return
        batch = q.next_minibatch(version, M, prefer=prefer)
        if batch is None:
            return
        tokens = sum(N * (int(lengths[g.group_id]) + PROMPT) for g in batch)
        mbs.append([g.group_id for g in batch])
        starts.append(now)
        train_end = now + TRAINER.train_time(tokens)

    while True:
        if mode == "stock" and loaded < G and d.idle() and q.occupancy() == 0 and train_end == INF:
            d.load_window([Ticket(g, float(load[g])) for g in range(loaded, loaded + M)])
            loaded += M
        fill()
        t_fin = finishes[0][0] if finishes else INF
        if t_fin == INF and train_end == INF:
            break
        if train_end <= t_fin:  # the update is synced: a new version, then dispatch, then the next update
            now, train_end = train_end, INF
            times.append(now)
            version += 1
            fill()
            train()
        else:
            now, gid, j = heapq.heappop(finishes)
            times.append(now)
            assert d.on_finished(j, gid)
            v = dispatch[gid][2]
            q.put(_Group(gid, [_Sample(v)] * N, int(tags[gid]) if planned else -1), version=v)
            train()
    assert q.trained == G and q.stale_total == 0 and lag.accepted == lag.trained == G
    assert len(set(times)) == len(times), "the script has simultaneous events: pick another seed"
    stolen = {s.gid: s.thief for s in d.steals}
    assert all(queues[s.victim].tolist().count(s.gid) == 1 for s in d.steals)  # victim = plan instance
    return Decisions(dispatch, stolen, mbs, starts)


# --------------------------------------------------------------------------------------------- the test
@pytest.mark.parametrize("max_lag", [0, 1, 2])
@pytest.mark.parametrize("mode", ["stock", "async", "asp", "asp_shared"])
def test_simulator_and_runtime_take_the_same_decisions(mode, max_lag):
    sim, rt = simulated(mode, max_lag), runtime(mode, max_lag)
    rt.assert_equal(sim)


def test_the_script_exercises_every_decision():
    """The trace is not trivially easy: asp steals, admission holds instances back at max_lag 0 and 1,
    plan tags reorder minibatches away from arrival order, and the lag bound is reached at max_lag 2."""
    asp0, asp2 = runtime("asp", 0), runtime("asp", 2)
    assert len(asp2.stolen) >= 2
    assert max(v for _, _, v in asp0.dispatch.values()) == G // M - 1  # M groups per version at max_lag 0
    held = [g for g, (_, t, _) in runtime("async", 1).dispatch.items() if t > 0]
    assert held  # groups dispatched after the start: admission (or capacity) held them
    arrival = sorted(asp2.dispatch, key=lambda g: asp2.dispatch[g][1] + script()[0][g])
    flat = [g for mb in asp2.minibatches for g in mb]
    assert flat != arrival  # the plan tags (and versions) decided the order, not arrival alone
    lags = [k - asp2.dispatch[g][2] for k, mb in enumerate(asp2.minibatches) for g in mb]
    assert max(lags) == 2


def test_a_shared_plan_goes_out_in_plan_order_without_steals():
    """asp_shared is not asp under another name: nothing is stolen, and groups start in the plan's order read
    position by position (the shared queue), each on the instance that is free first."""
    _, _, queues, _ = script()
    shared = runtime("asp_shared", 2)
    assert shared.stolen == {}
    by_start = sorted(shared.dispatch, key=lambda g: (shared.dispatch[g][1], shared.dispatch[g][0]))
    width = max(len(q) for q in queues)
    assert by_start == [int(q[p]) for p in range(width) for q in queues if p < len(q)]
    assert shared.dispatch != runtime("asp", 2).dispatch


# --------------------------------------------------------------------------------------------- isolation
ISOLATION_SEED = 0


def isolation_script(seed: int = ISOLATION_SEED):
    """Three instances, two groups in flight each: instance 0's plan is one long group then a short one, the
    others hold many groups, so instance 0 has a free slot beside its long group for most of the run."""
    rng = np.random.default_rng(seed)
    lengths = rng.choice(np.arange(40, 400), size=G, replace=False).astype(np.int64)
    lengths[0] = 700
    queues = [np.array([0, 1]), np.arange(2, 14), np.arange(14, G)]
    return lengths, queues


def isolation_decisions(side: str, isolated: List[int]) -> Tuple[Dict[int, Tuple[int, float]], Dict[int, int]]:
    """(group -> (instance, start), stolen group -> thief) from the simulator's engine or the runtime's dispatcher,
    each engine running two groups at a time, every step 1 s (a group ends `length` s after it starts)."""
    from mindspeed_asp.sim.engine import simulate_instances

    lengths, queues = isolation_script()
    load = lengths.astype(np.float64)  # predicted tokens: the steal load on both sides
    if side == "sim":
        tr = simulate_instances(queues, np.repeat(lengths[:, None], N, 1), np.full(G, PROMPT),
                                InstanceSpec(slots=2 * N), CostModel(a=1.0, b=0.0, c=0.0, p=0.0), work_stealing=True,
                                steal_load=load, isolated=isolated)
        return ({g: (int(tr.group_instance[g]), float(tr.group_dispatch[g])) for g in range(G)},
                {g: int(tr.group_instance[g]) for g in np.flatnonzero(tr.group_stolen).tolist()})
    now = 0.0
    d = Dispatcher("plan", INSTANCES, capacity=2, work_stealing=True, clock=lambda: now)
    d.load_window([Ticket(g, float(load[g])) for g in range(G)], plan_queues=[q.tolist() for q in queues],
                  isolated=isolated)
    finishes: List[Tuple[float, int, int]] = []
    dispatch: Dict[int, Tuple[int, float]] = {}
    times = []
    while True:
        for j, t in d.fill():
            dispatch[t.gid] = (j, now)
            heapq.heappush(finishes, (now + float(lengths[t.gid]), t.gid, j))
        if not finishes:
            break
        now, gid, j = heapq.heappop(finishes)
        times.append(now)
        assert d.on_finished(j, gid)
    assert len(set(times)) == len(times), "the script has simultaneous events: pick another seed"
    return dispatch, {s.gid: s.thief for s in d.steals}


@pytest.mark.parametrize("isolated", [[], [0]])
def test_simulator_and_runtime_isolate_alike(isolated):
    """The isolation rule (policy.may_steal) on both sides: the same dispatches and steals with and without
    an isolated group, and the isolated group's instance steals only once that group has ended."""
    (sim_d, sim_s), (rt_d, rt_s) = isolation_decisions("sim", isolated), isolation_decisions("runtime", isolated)
    assert sim_s == rt_s
    assert sim_d.keys() == rt_d.keys()
    for g in sim_d:
        assert sim_d[g][0] == rt_d[g][0] and sim_d[g][1] == pytest.approx(rt_d[g][1], abs=1e-9), g
    lengths, _ = isolation_script()
    stolen_by_0 = [g for g, j in rt_s.items() if j == 0]
    assert stolen_by_0  # instance 0 steals in both runs ...
    if isolated:  # ... but with group 0 isolated, only after it ended
        assert min(rt_d[g][1] for g in stolen_by_0) >= float(lengths[0])
    else:
        assert min(rt_d[g][1] for g in stolen_by_0) < float(lengths[0])
