"""One rollout control for both drivers: the rules, and one scripted trace giving both the same decisions.

The standalone driver (runtime/driver.py) builds its `RolloutControl` from a run config; the MindSpeed-RL rollout driver
(integrations/mindspeed_rl/lockstep_rollout.py) from the `asp:` keys the async trainer passes. Both drive the policy,
dispatcher and queue through this one control, so they cannot drift apart as two loops of their own would (the capacity
per instance, `ceil(slots/n)+1` vs `slots//n`: 3 vs 2 groups at slots 8, n 4; the training order in asp mode, plan tag
vs oldest). The parity test replays one seeded trace (windows, dispatches, finishes in a random order, updates, a
checkpoint cut and restore halfway) through each driver's own entry points and compares every decision: which group went
to which instance at which version, which groups each update trained, which were regenerated, and the counters at the
end.
"""
from __future__ import annotations

import math
import random
from typing import Any, Dict, List, Optional, Tuple

import pytest

from mindspeed_asp.runtime.dispatcher import Ticket
from mindspeed_asp.runtime.rollout_control import RolloutControl, group_gid, instance_capacity
from mindspeed_asp.runtime.requests import GroupRequest, GroupResult, RequestId, SampleResult

INSTANCES, SLOTS, N, M, WINDOW = 2, 8, 4, 3, 9


# ----------------------------------------------------------------------------- the rules
def test_one_capacity_rule_fills_the_engine_plus_one_waiting_group():
    assert instance_capacity(8, 4) == 3  # 2 groups fill 8 slots, one waits in the engine's queue
    assert instance_capacity(9, 4) == 4  # a partly filled third group still runs
    assert instance_capacity(2, 4) == 2  # fewer slots than n: one group at a time, plus one waiting
    with pytest.raises(ValueError, match="slots and n must be >= 1"):
        instance_capacity(0, 4)


def test_stock_has_no_per_instance_cap_and_trains_oldest_first():
    stock = RolloutControl("stock", 2, 0, M, SLOTS, N)
    asp = RolloutControl("asp", 2, 1, M, SLOTS, N)
    assert stock.capacity is None and stock.dispatcher.policy == "stock" and stock.train_order == "oldest"
    assert asp.capacity == 3 and asp.dispatcher.policy == "plan" and asp.train_order == "plan_tag"
    assert RolloutControl("async", 2, 1, M, SLOTS, N).dispatcher.policy == "least_loaded"
    with pytest.raises(ValueError, match="unknown mode 'sync'"):
        RolloutControl("sync", 2, 1, M, SLOTS, N)


def test_group_ids_of_both_drivers_name_the_same_group():
    assert group_gid(RequestId(7, 2)) == 7 and group_gid("7") == 7 and group_gid(7) == 7


def _result(group_id: Any, version: int, tag: int = -1, n: int = N) -> GroupResult:
    samples = [SampleResult([5, 6], [-0.1, -0.2], version, version, "length") for _ in range(n)]
    return GroupResult(group_id, "p", 0, samples, [2, 3], 0.0, 0.0, 0.0, minibatch=tag)


def test_asp_trains_the_plan_minibatch_together_not_the_first_arrivals():
    """Four groups finish in the order 0, 2, 1, 3; the plan tagged {0, 1} and {2, 3} as minibatches: asp trains
    {0, 1} first, async the two first to arrive."""
    tags = {0: 0, 1: 0, 2: 1, 3: 1}
    taken = {}
    for mode in ("asp", "async"):
        c = RolloutControl(mode, 1, 1, 2, SLOTS, N)  # minibatches of 2 groups
        queues = [[0, 1, 2, 3]] if mode == "asp" else None
        c.load_window([Ticket(g) for g in range(4)], queues)
        picks = c.admit(0).picks
        assert [t.gid for _, t in picks] == [0, 1, 2]  # capacity 3 on the one instance
        c.finish(0, _result(RequestId(0), 0, tags[0]))
        picks = c.admit(0).picks
        assert [t.gid for _, t in picks] == [3]
        for g in (2, 1, 3):
            c.finish(0, _result(RequestId(g), 0, tags[g]))
        taken[mode] = sorted(group_gid(g.group_id) for g in c.next_minibatch(0))
    assert taken == {"asp": [0, 1], "async": [0, 2]}


def test_a_result_from_an_instance_that_does_not_own_the_group_is_refused():
    c = RolloutControl("async", 2, 1, M, SLOTS, N)
    c.load_window([Ticket(0)])
    (j, t), = c.admit(0).picks
    assert not c.finish(1 - j, _result(RequestId(0), 0))
    assert c.finish(j, _result(RequestId(0), 0)) and not c.finish(j, _result(RequestId(0), 0))
    assert c.queue.occupancy() == 1


def test_a_dead_instance_gives_its_groups_to_the_live_one():
    c = RolloutControl("asp", 2, 1, M, SLOTS, N)
    c.load_window([Ticket(g) for g in range(4)], [[0, 1], [2, 3]])
    c.admit(0)
    assert sorted(c.instance_dead(1)) == [2, 3]
    assert sorted(t.gid for _, t in c.admit(0).picks) == [2]  # instance 0 holds 0, 1 and now 2 (capacity 3)
    assert c.supply() == 4


def test_stale_groups_go_back_for_regeneration_and_count_in_the_supply():
    c = RolloutControl("async", 1, 1, 1, SLOTS, N)
    c.load_window([Ticket(0), Ticket(1, predicted=9.0)])
    assert len(c.admit(0).picks) == 2  # (0 + max_lag 1 + 1) x M 1 groups admitted at version 0
    c.finish(0, _result(RequestId(0), 0))
    assert [group_gid(g.group_id) for g in c.next_minibatch(0)] == [0]
    c.finish(0, _result(RequestId(1), 0))  # dispatched at version 0: trainable up to version 1
    assert c.next_minibatch(2) is None  # stale at 2: regenerated, not lost
    assert c.supply() == 1 and c.dispatcher.queued() == 1 and c.queue.regenerated == 1
    adm = c.admit(2)
    assert adm.regenerated == [1] and [(t.gid, t.version, t.predicted) for _, t in adm.picks] == [(1, 2, 9.0)]


# ----------------------------------------------------------------------------- the parity trace
class StandaloneSide:
    """The standalone driver's rollout control, built by the Driver from a run config, stepped in its loop's
    order (load, dispatch, poll, train)."""

    def __init__(self, mode: str, max_lag: int, tmp_path) -> None:
        from mindspeed_asp.runtime.driver import Driver
        from mindspeed_asp.runtime.run_config import config_from_dict

        cfg = config_from_dict({}, overrides=[f"asp.mode={mode}", f"asp.max_lag={max_lag}",
                                              f"asp.instances={INSTANCES}", f"asp.slots={SLOTS}", f"data.n={N}",
                                              f"asp.minibatch_groups={M}", "data.num_prompts=64"])
        self.control = Driver(cfg, tmp_path, progress=False, manage_ray=False).control
        self.attempt: Dict[int, int] = {}

    def load(self, gids: List[int], queues: Optional[List[List[int]]], tags: Dict[int, int]) -> None:
        self.control.load_window([Ticket(g, float(g % 5 + 1)) for g in gids], queues)

    def admit(self, version: int) -> Tuple[List[Tuple[int, int, int]], List[int]]:
        adm = self.control.admit(version)
        for _, t in adm.picks:
            self.attempt[t.gid] = t.attempt
        return [(j, t.gid, t.version) for j, t in adm.picks], adm.regenerated

    def finish(self, j: int, gid: int, version: int, tag: int) -> None:
        self.control.finish(j, _result(RequestId(gid, self.attempt[gid]), version, tag))

    def train(self, version: int) -> Optional[List[int]]:
        batch = self.control.next_minibatch(version)
        return None if batch is None else [group_gid(g.group_id) for g in batch]

    def queued(self) -> int:
        return self.control.dispatcher.queued()

    def admits(self, version: int) -> bool:
        return self.control.lag_policy.admits(version)

    def restart(self, tmp_path, mode: str, max_lag: int) -> "StandaloneSide":
        """A checkpoint (state_dict) and a fresh driver restoring it, as `asp train --resume` does."""
        state = self.control.state_dict()
        fresh = StandaloneSide(mode, max_lag, tmp_path)
        fresh.control.load_state_dict(state, self.control.trained)
        return fresh

    def counters(self) -> Dict[str, int]:
        return self.control.counters()


class NpuSide:
    """The MindSpeed-RL rollout driver (its loop thread not started: the test steps it), configured as the
    async trainer configures it from the `asp:` keys."""

    def __init__(self, mode: str, max_lag: int) -> None:
        from mindspeed_asp.integrations.mindspeed_rl.lockstep_rollout import LockstepRollout

        self.driver = LockstepRollout([[object()] for _ in range(INSTANCES)], mode, max_lag, M, SLOTS, N,
                                    start=False)
        self.mode, self.max_lag = mode, max_lag

    def load(self, gids: List[int], queues: Optional[List[List[int]]], tags: Dict[int, int]) -> None:
        reqs = [GroupRequest(str(g), f"p{g}", [2, 3], N, 8, minibatch=tags.get(g, -1)) for g in gids]
        self.driver.load_window(reqs, {g: float(g % 5 + 1) for g in gids}, queues)

    def admit(self, version: int) -> Tuple[List[Tuple[int, int, int]], List[int]]:
        d = self.driver
        d.set_version(version)
        with d.lock:
            adm = d._admit()
            picks = [(j, int(req.group_id), v) for j, jobs in enumerate(d.pending) for req, v in jobs]
            d.pending = [[] for _ in d.instances]  # issued
        return picks, adm.regenerated

    def finish(self, j: int, gid: int, version: int, tag: int) -> None:
        self.driver._accept(j, [_result(str(gid), version, tag)])

    def train(self, version: int) -> Optional[List[int]]:
        got = self.driver.next_minibatch(version, timeout=5.0, feed_below=10 ** 9)
        return None if "groups" not in got else [int(g.group_id) for g in got["groups"]]

    def queued(self) -> int:
        return self.driver.control.dispatcher.queued()

    def admits(self, version: int) -> bool:
        return self.driver.control.lag_policy.admits(version)

    def restart(self, tmp_path, mode: str, max_lag: int) -> "NpuSide":
        """A MindSpeed-RL checkpoint (snapshot) restored into a fresh rollout driver."""
        snap = self.driver.snapshot()
        fresh = NpuSide(mode, max_lag)
        fresh.driver.restore(self.driver.version, snap["trained_gids"], snap["ready"], snap["unfinished"],
                             snap["counters"], snap["isolated"], snap["dispatch"])
        return fresh

    def counters(self) -> Dict[str, int]:
        return self.driver.control.counters()


def _trace(side: Any, mode: str, max_lag: int, seed: int, tmp_path, steps: int = 10) -> List[Any]:
    """Drive `side` through one seeded trace; every decision goes into the log."""
    rng = random.Random(seed)
    log: List[Any] = []
    version, next_gid, peak = 0, 0, 0
    in_flight: Dict[int, List[Tuple[int, int]]] = {j: [] for j in range(INSTANCES)}  # j -> (gid, version)
    tags: Dict[int, int] = {}
    for tick in range(2000):
        if version >= steps:
            break
        if side.queued() == 0 and side.admits(version):
            gids = list(range(next_gid, next_gid + WINDOW))
            next_gid += WINDOW
            tags.update({g: (g - gids[0]) // M for g in gids})
            queues = None
            if mode == "asp":
                order = sorted(gids, key=lambda g: rng.random())
                queues = [order[k::INSTANCES] for k in range(INSTANCES)]
            side.load(gids, queues, tags)
            log.append(("window", gids, queues))
        picks, regenerated = side.admit(version)
        log.append(("admit", version, sorted(picks), regenerated))
        for j, gid, v in picks:
            in_flight[j].append((gid, v))
        peak = max(peak, *(len(q) for q in in_flight.values()))
        busy = [j for j in range(INSTANCES) if in_flight[j]]
        if busy and rng.random() < 0.7:
            j = rng.choice(busy)
            gid, v = in_flight[j].pop(rng.randrange(len(in_flight[j])))
            side.finish(j, gid, v, tags[gid])
            log.append(("finish", j, gid))
        trained = side.train(version)
        if trained is not None:
            log.append(("train", version, trained))
            version += 1
            if version == steps // 2:  # a checkpoint and a restart: what was generating is generated again
                side = side.restart(tmp_path, mode, max_lag)
                in_flight = {j: [] for j in range(INSTANCES)}
                log.append(("restart", version))
    assert version == steps, f"the trace stalled at version {version}"
    log.append(("counters", side.counters()))
    log.append(("peak in flight on one instance", peak))
    return log


@pytest.mark.parametrize("mode,max_lag", [("asp", 1), ("asp", 2), ("async", 1), ("async", 0)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_both_drivers_make_the_same_decisions_on_one_trace(tmp_path, mode, max_lag, seed):
    pytest.importorskip("pydantic")
    standalone = _trace(StandaloneSide(mode, max_lag, tmp_path / "a"), mode, max_lag, seed, tmp_path / "a")
    npu = _trace(NpuSide(mode, max_lag), mode, max_lag, seed, tmp_path / "b")
    assert len(standalone) == len(npu)
    for k, (a, b) in enumerate(zip(standalone, npu)):
        assert a == b, f"decision {k} differs: standalone {a} vs MindSpeed-RL {b}"
    trained = [g for e in standalone if e[0] == "train" for g in e[2]]
    assert len(trained) == len(set(trained))  # no group trained twice, across the restart too
    if max_lag >= 1:  # admission leaves room for (max_lag + 1) x M = 6+ groups: the one capacity rule binds
        assert standalone[-1][1] == instance_capacity(SLOTS, N) > math.ceil(SLOTS / N)
