"""Which prompt group goes to which rollout instance, and when.

The dispatcher is a pure state machine (no Ray, no vLLM) so every rule is unit-testable: the driver feeds it
events (a window of groups, a finished group, a dead instance, a stale group to regenerate) and asks it to
`fill` free instance capacity at the trainer's version. Which instance is offered work first, whom a thief
robs, where a group sent back goes, and how many groups the max-lag bound admits are the policy's
(`mindspeed_asp/core/policy.py`, shared with the simulator); the dispatcher reports its dispatches and lost groups
to the `LagPolicy` it is given.

Three policies, one per runtime mode (docs/design.md#modes):

- `stock`: MindSpeed-RL's default. Each iteration's groups are cut into contiguous, dataset-ordered chunks,
  one per instance, and every chunk is submitted at once; no stealing.
- `least_loaded` (mode `async`): one FIFO in dataset order; the next group goes to the live instance with
  the fewest groups in flight (OpenRLHF's rule).
- `plan` (mode `asp`): each instance pulls from its own plan queue in plan order; an instance whose queue
  is empty steals not-yet-started groups from the tail of the most loaded queue (every steal is logged),
  after every free instance with work of its own has taken it. A shared window of the plan (the planner
  chose not to pin its groups, `Assignment.shared`) waits in the one FIFO in the plan's order and goes
  out as in `least_loaded`; an instance takes from it once its own queue is empty, before it would steal.
  An instance running a group the plan isolated (a dominant group) steals nothing until it ends.

Every group is in exactly one state (queued, in flight on one instance, done), so a group is never handed
out twice, and results from an instance that no longer owns a group are refused.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Sequence, Tuple

from mindspeed_asp.core.policy import (LagPolicy, lightest, may_steal, offer_order, shared_queue_order, steal_victim,
                                  wake_order)

POLICIES = ("stock", "least_loaded", "plan")
MODE_POLICY = {"stock": "stock", "async": "least_loaded", "asp": "plan"}


@dataclass
class Ticket:
    """One prompt group to generate: `gid` is its row in the epoch's prompt set."""

    gid: int
    predicted: float = 1.0  # predicted tokens of the group (load measure for stealing)
    attempt: int = 0  # 0 first time; incremented on re-dispatch after a death or a stale regenerate
    version: int = -1  # trainer version at dispatch (set by `fill`): the version the policy counts it under


@dataclass
class StealEvent:
    time: float
    thief: int
    victim: int
    gid: int


@dataclass
class Dispatcher:
    """Plan / least-loaded / stock dispatch with capacity, admission, stealing and re-dispatch.

    `capacity` is the number of groups an instance may hold in flight (slots // n keeps vLLM's batch full
    without a hidden engine queue); `None` means unlimited (stock submits a whole chunk). `lag` is the
    max-lag policy that admits dispatches and counts them; None admits everything (unit tests, rollout only).
    """

    policy: str
    instances: int
    capacity: Optional[int] = None
    work_stealing: bool = True
    clock: Callable[[], float] = time.monotonic
    lag: Optional[LagPolicy] = None
    queues: List[Deque[Ticket]] = field(init=False)
    fifo: Deque[Ticket] = field(init=False)
    in_flight: List[Dict[int, Ticket]] = field(init=False)
    alive: List[bool] = field(init=False)  # the rollout pool shares this list (one liveness record)
    lost_instances: set = field(init=False)  # deaths already handled (the pool marks `alive` before calling us)
    done: set = field(init=False)
    steals: List[StealEvent] = field(init=False)
    redispatched: int = field(init=False, default=0)
    dispatched: int = field(init=False, default=0)
    windows_loaded: int = field(init=False, default=0)  # plan policy: windows loaded so far
    window_of: Dict[int, int] = field(init=False)  # plan policy: gid -> the window it was loaded in
    isolated: set = field(init=False)  # gids the plan isolated: their instance steals nothing while they run

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown dispatch policy {self.policy!r}; one of {POLICIES}")
        if self.instances < 1:
            raise ValueError("need at least one instance")
        self.queues = [deque() for _ in range(self.instances)]
        self.fifo = deque()
        self.in_flight = [dict() for _ in range(self.instances)]
        self.alive = [True] * self.instances
        self.lost_instances = set()
        self.done = set()
        self.steals = []
        self.window_of = {}
        self.isolated = set()

    # ------------------------------------------------------------------ loading work
    def load_window(self, tickets: Sequence[Ticket], plan_queues: Optional[Sequence[Sequence[int]]] = None,
                    shared: bool = False, isolated: Iterable[int] = ()) -> None:
        """Add a window (an iteration, an epoch) of groups.

        `plan` needs `plan_queues` (per instance, the ordered gids of this window; with `shared`, one queue
        dealt round-robin, read back position by position into the FIFO); the other policies take `tickets`
        in dataset order. `isolated` are the gids the plan isolated (`Assignment.isolated`).
        """
        known = self._known()
        by_gid = {t.gid: t for t in tickets}
        for t in tickets:
            if t.gid in known:
                raise ValueError(f"group {t.gid} is already queued, in flight or done")
        iso = [int(g) for g in isolated]
        for g in iso:
            if g not in by_gid:
                raise ValueError(f"isolated group {g} is not in this window")
        if self.policy == "plan":
            if plan_queues is None or len(plan_queues) != self.instances:
                raise ValueError(f"plan dispatch needs {self.instances} instance queues")
            placed = [g for q in plan_queues for g in q]
            if sorted(placed) != sorted(by_gid):
                raise ValueError("plan queues do not cover exactly this window's groups")
        self.isolated.update(iso)
        if self.policy == "plan":
            self.windows_loaded += 1
            self.window_of.update((g, self.windows_loaded) for g in by_gid)
            if shared:
                self.fifo.extend(by_gid[g] for g in shared_queue_order(plan_queues))
                return
            for j, q in enumerate(plan_queues):
                target = j if self.alive[j] else self._lightest_queue()
                self.queues[target].extend(by_gid[g] for g in q)
        elif self.policy == "least_loaded":
            self.fifo.extend(tickets)
        else:  # stock: contiguous dataset-ordered chunks over the live instances
            live = [j for j in range(self.instances) if self.alive[j]]
            chunks = _split_contiguous(list(tickets), len(live))
            for j, chunk in zip(live, chunks):
                self.queues[j].extend(chunk)

    # ------------------------------------------------------------------ dispatching
    def fill(self, version: Optional[int] = None) -> List[Tuple[int, Ticket]]:
        """Hand out queued groups to instances with free capacity, as many as the lag policy admits at the
        trainer's `version` (all of them without a policy).

        Returns (instance, ticket) pairs in the order they should be submitted; the dispatcher already
        counts them as in flight, and the policy as dispatched at `version`.
        """
        if self.lag is not None and version is None:
            raise ValueError("Dispatcher.fill: a dispatcher with a lag policy needs the trainer's version")
        out: List[Tuple[int, Ticket]] = []
        while self.lag is None or self.lag.admits(version):
            pick = self._next_assignment()
            if pick is None:
                break
            j, t = pick
            t.version = -1 if version is None else int(version)
            self.in_flight[j][t.gid] = t
            self.dispatched += 1
            if self.lag is not None:
                self.lag.on_dispatched(t.version)
            out.append((j, t))
        return out

    def _free(self, j: int) -> bool:
        return self.alive[j] and (self.capacity is None or len(self.in_flight[j]) < self.capacity)

    def _next_assignment(self) -> Optional[Tuple[int, Ticket]]:
        counts = [len(q) for q in self.in_flight]
        offered = offer_order(counts, (j for j in range(self.instances) if self._free(j)))
        if not offered:
            return None
        if self.policy == "least_loaded":
            return (offered[0], self.fifo.popleft()) if self.fifo else None
        # plan and stock: instances with work of their own first, then a thief
        if self.fifo and self._shared_first():  # plan: a shared window loaded before any pinned work left
            return offered[0], self.fifo.popleft()
        j = wake_order(offered, [bool(q) for q in self.queues])[0]
        if self.queues[j]:
            return j, self.queues[j].popleft()
        if self.fifo:  # plan: a shared window after the pinned ones, to instances out of work of their own
            return j, self.fifo.popleft()
        if self.policy == "plan" and self.work_stealing:
            # j has no work of its own, nor has any instance after it: the first that may steal does
            thief = next((k for k in offered if may_steal(self._isolated_in_flight(k))), -1)
            if thief < 0:
                return None
            loads = [self._queue_load(k) for k in range(self.instances)]
            victim = steal_victim(loads, (k for k in range(self.instances)
                                          if k != thief and self.alive[k] and self.queues[k]))
            if victim >= 0:
                t = self.queues[victim].pop()  # tail: keeps the victim's plan order intact
                self.steals.append(StealEvent(self.clock(), thief, victim, t.gid))
                return thief, t
        return None

    # ------------------------------------------------------------------ events
    def on_finished(self, instance: int, gid: int) -> bool:
        """Record a finished group; False when this instance does not own it (dead, stolen, duplicate)."""
        if not self.alive[instance] or gid not in self.in_flight[instance]:
            return False
        del self.in_flight[instance][gid]
        self.done.add(gid)
        return True

    def on_instance_dead(self, instance: int) -> List[int]:
        """Mark an instance dead and re-queue its in-flight and queued groups on the live ones.

        In-flight groups go to the front (they were started first); returns the re-dispatched gids.
        """
        if instance in self.lost_instances:
            return []
        self.lost_instances.add(instance)
        self.alive[instance] = False
        if not any(self.alive):
            raise RuntimeError("every rollout instance is dead")
        lost = list(self.in_flight[instance].values())
        self.in_flight[instance].clear()
        queued = list(self.queues[instance])
        self.queues[instance].clear()
        for t in lost:
            if self.lag is not None:
                self.lag.on_lost(t.version)
            t.attempt += 1
        self.redispatched += len(lost)
        if self.policy == "least_loaded":
            self.fifo.extendleft(reversed(lost))
        else:
            for t in reversed(lost):
                self.queues[self._lightest_queue()].appendleft(t)
            for t in queued:
                self.queues[self._lightest_queue()].append(t)
        return [t.gid for t in lost] + [t.gid for t in queued]

    def requeue(self, gid: int, predicted: float = 1.0) -> None:
        """Put a done group back at the front (a stale sample being regenerated)."""
        self.done.discard(gid)
        for q in self.in_flight:
            q.pop(gid, None)
        t = Ticket(gid, predicted, attempt=1)
        if self.policy == "least_loaded":
            self.fifo.appendleft(t)
        else:
            self.queues[self._lightest_queue()].appendleft(t)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> Dict[str, Any]:
        """Every group's state (queued per queue, in flight per instance, done), the steals and counters, as
        plain data for a checkpoint (`runtime/checkpoint.py`)."""
        return {"policy": self.policy, "instances": self.instances,
                "queues": [[asdict(t) for t in q] for q in self.queues], "fifo": [asdict(t) for t in self.fifo],
                "in_flight": [[asdict(t) for t in q.values()] for q in self.in_flight],
                "done": sorted(self.done), "steals": [asdict(s) for s in self.steals],
                "redispatched": self.redispatched, "dispatched": self.dispatched,
                "windows_loaded": self.windows_loaded, "window_of": sorted(self.window_of.items()),
                "isolated": sorted(self.isolated)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore `state_dict()` output into a fresh dispatcher of the same policy and instance count.

        Every instance counts as alive (a resumed run starts all of them again); the groups that were in
        flight stay in flight until `abandon_in_flight` hands them back.
        """
        if state["policy"] != self.policy or int(state["instances"]) != self.instances:
            raise ValueError(f"checkpoint dispatcher is {state['policy']} over {state['instances']} instances, "
                             f"this run {self.policy} over {self.instances}")
        self.queues = [deque(Ticket(**t) for t in q) for q in state["queues"]]
        self.fifo = deque(Ticket(**t) for t in state["fifo"])
        self.in_flight = [{int(t["gid"]): Ticket(**t) for t in q} for q in state["in_flight"]]
        self.alive[:] = [True] * self.instances  # in place: the rollout pool shares the list
        self.lost_instances = set()
        self.done = {int(g) for g in state["done"]}
        self.steals = [StealEvent(**s) for s in state["steals"]]
        self.redispatched = int(state["redispatched"])
        self.dispatched = int(state["dispatched"])
        self.windows_loaded = int(state.get("windows_loaded", 0))  # absent in checkpoints before shared windows
        self.window_of = {int(g): int(w) for g, w in state.get("window_of", [])}
        self.isolated = {int(g) for g in state.get("isolated", [])}  # absent in checkpoints before isolation

    def abandon_in_flight(self) -> List[int]:
        """Groups in flight on instances that are gone as a whole (a stopped run being resumed) go back to
        the front of the queues to be generated again, as after a death (`on_instance_dead`), and the lag
        policy stops counting them; returns their gids. Not counted as re-dispatches of a dead instance."""
        lost = [t for q in self.in_flight for t in q.values()]
        lost.sort(key=lambda t: (t.version, t.gid))
        for q in self.in_flight:
            q.clear()
        for t in lost:
            if self.lag is not None and t.version >= 0:
                self.lag.on_lost(t.version)
            t.attempt += 1
            t.version = -1
        if self.policy == "least_loaded":
            self.fifo.extendleft(reversed(lost))
        else:
            for t in reversed(lost):
                self.queues[self._lightest_queue()].appendleft(t)
        return [t.gid for t in lost]

    # ------------------------------------------------------------------ views
    def queued(self) -> int:
        return len(self.fifo) + sum(len(q) for q in self.queues)

    def in_flight_count(self, instance: Optional[int] = None) -> int:
        if instance is not None:
            return len(self.in_flight[instance])
        return sum(len(q) for q in self.in_flight)

    def owner(self, gid: int) -> Optional[int]:
        for j, q in enumerate(self.in_flight):
            if gid in q:
                return j
        return None

    def idle(self) -> bool:
        """Nothing queued and nothing in flight."""
        return self.queued() == 0 and self.in_flight_count() == 0

    def _known(self) -> set:
        s = set(self.done)
        s.update(t.gid for t in self.fifo)
        for q in self.queues:
            s.update(t.gid for t in q)
        for q in self.in_flight:
            s.update(q)
        return s

    def _shared_first(self) -> bool:
        """Plan policy: the shared FIFO's head was loaded in an earlier window than every pinned group still
        queued (windows go out oldest first, so the lag bound is not spent on newer pinned work)."""
        if self.policy != "plan":
            return False
        head = self.window_of.get(self.fifo[0].gid, 0)
        return all(head < self.window_of.get(q[0].gid, 0) for q in self.queues if q)

    def _isolated_in_flight(self, j: int) -> int:
        return sum(1 for g in self.in_flight[j] if g in self.isolated)

    def _queue_load(self, j: int) -> float:
        return sum(t.predicted for t in self.queues[j])

    def _lightest_queue(self) -> int:
        loads = [self._queue_load(k) + sum(t.predicted for t in self.in_flight[k].values())
                 for k in range(self.instances)]
        return lightest(loads, (j for j in range(self.instances) if self.alive[j]))


def _split_contiguous(items: list, parts: int) -> List[list]:
    """Dataset-ordered chunks whose sizes differ by at most one (MindSpeed-RL's per-instance share)."""
    base, extra = divmod(len(items), parts)
    out, start = [], 0
    for p in range(parts):
        size = base + (1 if p < extra else 0)
        out.append(items[start:start + size])
        start += size
    return out

