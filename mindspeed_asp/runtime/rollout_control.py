"""The rollout control: the max-lag policy, the dispatcher and the sample queue, wired once.

Two drivers feed rollout instances: the standalone runtime's (`runtime/driver.py`, Ray actors polled from
one process) and the MindSpeed-RL integration's (`integrations/mindspeed_rl/lockstep_rollout.py`, TP-rank
actors stepped in lockstep). What they decide is the same, so it lives here and nowhere else: which groups an
instance may take now (the one capacity rule and the max-lag admission), where a finished group goes and
under which version it counts, which minibatch the next update trains and in which order, what a stale group
becomes, and what a checkpoint keeps of all of it. Each driver keeps only what is its own: how it talks to
its instances, and what a dead instance means for it (the runtime re-dispatches its groups with
`instance_dead`; the NPU path ends the run, because its weight groups span every instance).

No Ray, no vLLM, no clock of its own: every rule is unit-tested, and one scripted trace gives both drivers the
same decisions (tests/runtime/test_rollout_control.py).
"""
from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, Hashable, List, Optional, Sequence, Tuple

from mindspeed_asp.core.policy import LagPolicy
from mindspeed_asp.runtime.dispatcher import MODE_POLICY, Dispatcher, Ticket
from mindspeed_asp.runtime.sample_queue import QUEUE_COUNTERS, SampleQueue

#: The order an update takes its M groups in, per mode: oldest version first, then (asp) the plan's
#: minibatch tag, so the groups the planner packed into one minibatch are trained together.
TRAIN_ORDER = {"stock": "oldest", "async": "oldest", "asp": "plan_tag"}


def instance_capacity(slots: int, n: int) -> int:
    """Groups one instance may hold in flight: enough to fill its engine's `slots` sequences (ceil(slots / n)
    groups of n), plus one waiting in the engine's queue, so an engine that finishes a group has the next one
    at hand instead of idling until the driver's next poll or lockstep call."""
    if slots < 1 or n < 1:
        raise ValueError(f"slots and n must be >= 1, got slots={slots}, n={n}")
    return max(1, math.ceil(slots / n)) + 1


def group_gid(group_id: Hashable) -> int:
    """The integer group id inside a result's `group_id`: the runtime sends a `RequestId` (gid, attempt), the
    MindSpeed-RL adapter the str of its int gid."""
    gid = getattr(group_id, "gid", None)
    return int(gid if gid is not None else group_id)


@dataclass
class Admission:
    """What one `admit` call decided: the groups handed out now (instance, ticket) and the stale groups sent
    back for regeneration on the way (regenerate policy)."""

    picks: List[Tuple[int, Ticket]] = field(default_factory=list)
    regenerated: List[int] = field(default_factory=list)


@dataclass
class Cut:
    """One consistent cut of the rollout state for a checkpoint: the trained gids in training order, the
    finished untrained groups with the version each counts under, the groups queued or generating (in flight
    first, each with its instance; -1 = the shared FIFO), the isolated among them, the counters, and the lag
    policy's and dispatcher's own state (plain data), from which a restart re-dispatches exactly as the
    standalone runtime's resume does."""

    trained: List[int]
    ready: List[Tuple[Any, int]]
    unfinished: List[Tuple[int, int]]
    isolated: List[int]
    counters: Dict[str, int]
    dispatch: Dict[str, Any]


class RolloutControl:
    """Admission, finishing, minibatches, stale groups, deaths and checkpoints of one run's rollout.

    `mode` (stock / async / asp) picks the dispatch policy (`dispatcher.MODE_POLICY`) and the training order
    (`TRAIN_ORDER`); stock submits a whole iteration at once (no per-instance cap), the streaming modes hold
    `instance_capacity(slots, n)` groups per instance. Not thread-safe: each driver calls it under its lock.
    """

    def __init__(self, mode: str, instances: int, max_lag: int, minibatch_groups: int, slots: int, n: int,
                 work_stealing: bool = True, stale_policy: str = "regenerate",
                 clock: Callable[[], float] = time.time) -> None:
        if mode not in MODE_POLICY:
            raise ValueError(f"unknown mode {mode!r}; one of {sorted(MODE_POLICY)}")
        self.mode = mode
        self.lag_policy = LagPolicy(max_lag, minibatch_groups)
        self.queue = SampleQueue(self.lag_policy, stale_policy=stale_policy)
        self.capacity = None if mode == "stock" else instance_capacity(slots, n)
        self.dispatcher = Dispatcher(MODE_POLICY[mode], instances, capacity=self.capacity,
                                     work_stealing=work_stealing, clock=clock, lag=self.lag_policy)
        self.train_order = TRAIN_ORDER[mode]
        self.dispatch_version: Dict[int, int] = {}  # gid -> version it was (last) dispatched with
        self.predicted: Dict[int, float] = {}  # gid -> its ticket's predicted tokens (kept for a regenerate)
        self.trained: List[int] = []  # gids in training order
        self._regenerated: List[int] = []  # stale gids sent back since the last `admit`

    @property
    def max_lag(self) -> int:
        return self.lag_policy.max_lag

    @property
    def M(self) -> int:
        return self.lag_policy.M

    # ------------------------------------------------------------------ work in
    def load_window(self, tickets: Sequence[Ticket], plan_queues: Optional[Sequence[Sequence[int]]] = None,
                    shared: bool = False, isolated: Sequence[int] = ()) -> int:
        """Queue a window of groups (plan queues when the plan dispatches); returns the groups queued."""
        self.dispatcher.load_window(tickets, plan_queues, shared=shared, isolated=isolated)
        self.predicted.update((t.gid, float(t.predicted)) for t in tickets)
        return self.dispatcher.queued()

    def admit(self, version: int) -> Admission:
        """Hand out as many groups as the free capacity and the max-lag counter admit at trainer `version`;
        reports too the stale groups sent back for regeneration since the last call."""
        picks = self.dispatcher.fill(version)
        for _, t in picks:
            self.dispatch_version[t.gid] = t.version
        regenerated, self._regenerated = self._regenerated, []
        return Admission(picks, regenerated)

    def finish(self, instance: int, result: Any) -> bool:
        """A finished group from `instance`: queued for the trainer under its dispatch version. False when the
        instance does not own it (dead, stolen from, a late duplicate): refused, so no group trains twice."""
        gid = group_gid(result.group_id)
        if not self.dispatcher.on_finished(instance, gid):
            return False
        self.queue.put(result, version=self.dispatch_version[gid])
        return True

    def instance_dead(self, instance: int) -> List[int]:
        """Re-dispatch a dead instance's in-flight and queued groups to the live ones (the caller's choice:
        the standalone runtime does, the NPU path ends the run instead); returns their gids."""
        return self.dispatcher.on_instance_dead(instance)

    # ------------------------------------------------------------------ work out
    def next_minibatch(self, version: int) -> Optional[List[Any]]:
        """The M groups the update from `version` trains, or None: while the lag policy says a group still
        generating is due in it (`must_wait`), or fewer than M trainable groups are ready. Stale groups met on
        the way are dropped or sent back for regeneration, per the queue's stale policy."""
        if self.lag_policy.must_wait(int(version)):
            return None
        batch = self.queue.next_minibatch(int(version), prefer=self.train_order)
        if batch is not None:
            self.trained.extend(group_gid(g.group_id) for g in batch)
        self._regenerate()
        return batch

    def _regenerate(self) -> None:
        """Stale groups the queue set aside (regenerate policy) go back to the front of the dispatch queues
        at once, so they count in `supply` and go out at the next `admit`."""
        for group in self.queue.take_stale():
            gid = group_gid(group.group_id)
            self.dispatcher.requeue(gid, predicted=self.predicted.get(gid, 1.0))
            self._regenerated.append(gid)

    def supply(self) -> int:
        """Groups that can still be trained: queued, in flight and finished untrained."""
        return self.dispatcher.queued() + self.dispatcher.in_flight_count() + self.queue.occupancy()

    def counters(self) -> Dict[str, int]:
        return {**self.queue.counters(), **self.lag_policy.counters()}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> Dict[str, Any]:
        """The whole rollout state as the standalone runtime's checkpoint keeps it (one section each)."""
        return {"policy": self.lag_policy.state_dict(), "dispatcher": self.dispatcher.state_dict(),
                "queue": self.queue.state_dict()}

    def load_state_dict(self, state: Dict[str, Any], trained: Sequence[int] = (),
                        section: Callable[[str], ContextManager[Any]] = lambda name: nullcontext()) -> List[int]:
        """Restore `state_dict()` output (and the trained gids, which the runtime's checkpoint keeps in its
        driver section) into this fresh control; the groups that were generating go back to the front of the
        queues to be generated again. Returns their gids. `section(name)` wraps the restore of each part, so
        a damaged checkpoint's error names the part (`runtime/checkpoint.py` `restoring`)."""
        regenerate = self._restore_dispatch(state["policy"], state["dispatcher"], section)
        with section("queue"):
            self.queue.load_state_dict(state["queue"])
            for entry in state["queue"]["pending"]:
                self.dispatch_version[group_gid(entry["group"].group_id)] = int(entry["version"])
        self.trained = [int(g) for g in trained]
        self._regenerate()  # stale groups the checkpoint held set aside
        return regenerate

    def _restore_dispatch(self, policy: Dict[str, Any], dispatcher: Dict[str, Any],
                          section: Callable[[str], ContextManager[Any]] = lambda name: nullcontext()) -> List[int]:
        """The one restart rule of both drivers: the counters and every group's dispatch state as saved, then
        the groups that were generating (their instances are gone with the stopped run) back to the front of
        the queues, oldest first (`Dispatcher.abandon_in_flight`). Returns their gids."""
        with section("policy"):
            self.lag_policy.load_state_dict(policy)
        with section("dispatcher"):
            self.dispatcher.load_state_dict(dispatcher)
            regenerate = self.dispatcher.abandon_in_flight()
        for q in self.dispatcher.queues:
            self.predicted.update((t.gid, float(t.predicted)) for t in q)
        self.predicted.update((t.gid, float(t.predicted)) for t in self.dispatcher.fifo)
        return regenerate

    def cut(self) -> Cut:
        """The state a MindSpeed-RL checkpoint keeps (integrations/mindspeed_rl/resume_state.py): a group that
        finishes after the cut counts as generating, and a resumed run generates it again."""
        d = self.dispatcher
        unfinished = [(t.gid, j) for j, q in enumerate(d.in_flight) for t in q.values()]
        unfinished += [(t.gid, j) for j, q in enumerate(d.queues) for t in q]
        unfinished += [(t.gid, -1) for t in d.fifo]
        ready = [(e["group"], int(e["version"])) for e in self.queue.state_dict()["pending"]]
        return Cut(list(self.trained), ready, unfinished,
                   sorted(gid for gid, _ in unfinished if gid in d.isolated), self.counters(),
                   {"policy": self.lag_policy.state_dict(), "dispatcher": d.state_dict()})

    def restore_cut(self, trained: Sequence[int], ready: Sequence[Tuple[Any, int]],
                    unfinished: Sequence[Tuple[int, int]], counters: Dict[str, int],
                    isolated: Sequence[int] = (), dispatch: Optional[Dict[str, Any]] = None,
                    group_id: Callable[[int], Hashable] = str) -> int:
        """Continue from a `cut()` in this fresh control. With the cut's `dispatch` state, the restart is the standalone
        runtime's (`_restore_dispatch`): counters and queues as saved, the groups that were generating back to the
        front. Without it (a cut that carries no `dispatch` state): the trained groups keep their place in the admission
        count, the finished ones wait under their saved versions, the unfinished ones are loaded as one window on the
        instance queues they had. `group_id(gid)` is how the caller's requests name a group (the MindSpeed-RL adapter:
        the str of its gid), so a trained group's late duplicate is still refused. Returns the groups queued."""
        if self.dispatcher.dispatched or self.trained or self.dispatcher.queued():
            raise RuntimeError("restore needs a fresh rollout control")
        self.trained = [int(g) for g in trained]
        if dispatch is not None:
            self._restore_dispatch(dispatch["policy"], dispatch["dispatcher"])
            pending = []
            for seq, (result, version) in enumerate(ready):
                self.dispatch_version[group_gid(result.group_id)] = int(version)
                pending.append({"seq": seq, "version": int(version), "group": result})
            self.queue.load_state_dict({
                "pending": pending, "trained_ids": [group_id(g) for g in trained], "stale_out": [], "seq": len(pending),
                "counters": {k: int(counters.get(f"queue/{k}", 0)) for k in QUEUE_COUNTERS},
                "log_rows": [], "all_lags": []})
            return self.dispatcher.queued()
        self._restore_legacy(ready, unfinished, isolated)
        self._restore_counters(counters)
        return self.dispatcher.queued()

    def _restore_legacy(self, ready: Sequence[Tuple[Any, int]], unfinished: Sequence[Tuple[int, int]],
                        isolated: Sequence[int]) -> None:
        if self.trained:
            n = len(self.trained)
            self.lag_policy.on_dispatched(0, n)
            self.lag_policy.on_finished(0, n)
            self.lag_policy.on_trained(0, n)
        for result, version in ready:
            gid = group_gid(result.group_id)
            self.dispatch_version[gid] = int(version)
            self.dispatcher.done.add(gid)
            self.lag_policy.on_dispatched(int(version))
            self.queue.put(result, version=int(version))
        if unfinished:
            queues = None
            if self.dispatcher.policy == "plan":
                m = self.dispatcher.instances
                queues = [[gid for gid, j in unfinished if max(j, 0) % m == k] for k in range(m)]
            self.load_window([Ticket(int(gid)) for gid, _ in unfinished], queues, isolated=[int(g) for g in isolated])

    def _restore_counters(self, counters: Dict[str, int]) -> None:
        """The logged counters continue from the saved run (`policy/accepted` and `running` are recomputed)."""
        for key in ("received", "trained", "trained_samples", "dropped_stale", "regenerated", "duplicates"):
            if f"queue/{key}" in counters:
                setattr(self.queue, key, int(counters[f"queue/{key}"]))
        for key in ("dispatched", "finished", "trained", "lost", "stale"):
            if f"policy/{key}" in counters:
                setattr(self.lag_policy, key, int(counters[f"policy/{key}"]))
