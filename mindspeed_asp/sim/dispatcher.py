"""The instance simulator's dispatcher: which group an instance takes next, and how much of the lag budget
it may open, decided by the shared policy as the runtime's `Dispatcher` decides them.

Why apart from the event loop (engine.py): the event loop models what an instance does with the sequences it
has (admit, step, finish, preempt); this models how groups reach it, with the same functions of
`mindspeed_asp/core/policy.py` the runtime's dispatcher calls. It owns the instances' queues of not-started groups,
the shared queue, what each instance holds and the budget granted to each.

Where an instance's next group comes from when its own queue is empty:
- work stealing (`work_stealing=True`, the runtime's asp mode): the not-started group at the *tail* of the
  most loaded other queue (load = predicted tokens of its not-started groups when `steal_load` is given, else
  their count). Taking from the tail keeps the victim's plan order; a partly admitted group is never split;
  the group moves only once the gate admits it (the runtime steals only within its admission budget).
- `dispatch="fifo"` (the runtime's async mode): the head of one shared queue in dataset order; the
  instances start with empty queues. `dispatch="shared"` (a shared plan, `Assignment.shared`): the same,
  with the queue in the plan's order (the orders read position by position, `Assignment.shared_order`).
- isolation (`isolated`, the plan's `Assignment.isolated`): an instance running an isolated group steals
  nothing until it ends (`policy.may_steal`).
Every steal is counted per thief and per group.

A lag budget (`budget`, the pipeline's admission budget in groups) is dealt out as the runtime's dispatcher
hands out groups: one group at a time to the eligible instance with the fewest groups in flight (own work
first, then a thief), at most `group_capacity` in flight per instance. An instance opens no more groups than
it was granted; without this the first instance woken would fill all its slots and take the whole budget.
When the budget covers every group from the start, the gate never binds and instances admit freely, as
without a budget.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import numpy as np

from mindspeed_asp.core.policy import lightest, may_steal, shared_queue_order, steal_victim
from mindspeed_asp.sim.instance import Instance
from mindspeed_asp.sim.instance_inputs import InstanceInputs
from mindspeed_asp.sim.trace import InstanceTrace

OWN, NOWHERE, SHARED = -1, -2, -3  # where the next group comes from (>= 0: the victim of a steal)


@dataclass
class Loads:
    """What each instance holds, as the shared policy weighs it; lists indexed by instance, the form the
    policy's functions (`steal_victim`, `lightest`) take."""

    queued_load: List[float]  # load of its not-started groups (a steal takes from the most loaded)
    inflight_load: List[float]  # load of its dispatched, unfinished groups (a requeue goes to the lightest)
    queued: List[int]  # not-started groups in its own queue
    inflight: List[int]  # groups opened and not finished
    isolated: List[int]  # isolated groups in flight (policy.may_steal)


def plan_queues(inp: InstanceInputs) -> List[Tuple[List[int], List[bool], float]]:
    """Each instance's own queue from the plan: its sequences g*n+s in plan order, which of them start a group,
    and the load of its groups (empty queues with a shared queue: every group waits there)."""
    n = inp.samples
    out = []
    for order in inp.orders:
        if inp.shared_queue:
            out.append(([], [], 0.0))
            continue
        sids = (order[:, None] * n + np.arange(n)[None, :]).ravel()
        head = np.zeros(len(sids), dtype=bool)
        head[::n] = True
        out.append((sids.tolist(), head.tolist(), float(sum(inp.group_load[g] for g in order.tolist()))))
    return out


def shared_queue_groups(inp: InstanceInputs) -> List[int]:
    """The one queue groups are handed out from: the placed groups in dataset order (fifo), the plan's
    shared order (shared), or none (plan: every instance has its own)."""
    if inp.dispatch == "shared":
        return [int(g) for g in shared_queue_order(inp.orders)]
    if inp.dispatch == "fifo":
        return np.flatnonzero(inp.placed).tolist()
    return []


def deal_grants(left: int, granted: List[int], inflight: List[int], own: List[int], pool: Optional[int],
                cap: Optional[int], may_take: Optional[List[bool]]) -> List[int]:
    """Deal `left` groups of lag budget one at a time, as the runtime's `Dispatcher.fill` does; returns the
    instances granted one, in the order of their first grant. `granted` is updated in place.

    Each goes to the instance with work of its own (`own`: its not-started groups not granted yet), else to a
    thief, with the fewest groups in flight or granted, then index, below `cap`. With a shared queue (`pool`:
    its groups not granted yet; `own` all 0) anyone takes one. A thief (`may_take` given: work stealing, and
    whether each instance may steal now) takes from the policy's victim among the others' `own`.
    """
    m = len(granted)
    load = [inflight[k] + granted[k] for k in range(m)]

    def key(k: int) -> tuple:
        return (0 if own[k] > 0 else 1, load[k], k)  # wake_order over offer_order

    heap = [key(k) for k in range(m) if cap is None or load[k] < cap]
    heapq.heapify(heap)
    woken: List[int] = []
    while left > 0 and heap:
        top = heapq.heappop(heap)
        j = top[2]
        if top != key(j) or (cap is not None and load[j] >= cap):
            continue  # stale entry
        if pool is not None:
            if pool <= 0:
                break
            pool -= 1
        elif own[j] > 0:
            own[j] -= 1
        elif may_take is not None:
            if not may_take[j]:
                continue  # off the heap for this deal: it is offered work again at the next one
            v = steal_victim(own, [k for k in range(m) if k != j and own[k] > 0])
            if v < 0:
                break
            own[v] -= 1
            heapq.heappush(heap, key(v))
        else:
            break
        granted[j] += 1
        load[j] += 1
        left -= 1
        if cap is None or load[j] < cap:
            heapq.heappush(heap, key(j))
        if j not in woken:
            woken.append(j)
    return woken


class GroupDispatcher:
    """How groups reach the instances (module doc): the next group's source, the moves of stolen and
    regenerated groups, what each instance holds and the lag budget dealt to it.

    `insts` are the simulator's instances (their `queue`, `head` and `ptr` are read and, for a steal or a
    requeue, changed here); `rec` the trace being recorded (placements and steals are written here). Set
    `budget` (and `group_capacity`) before the first step to deal a lag budget.
    """

    def __init__(self, inp: InstanceInputs, insts: List[Instance], queued_load: List[float], rec: InstanceTrace,
                 work_stealing: bool) -> None:
        self.insts, self.rec, self.nsamp = insts, rec, inp.samples
        self.shared_queue = inp.shared_queue
        self.work_stealing = bool(work_stealing)
        self.group_load, self.isolated = inp.group_load, inp.isolated
        m = len(insts)
        self.loads = Loads(queued_load=queued_load, inflight_load=[0.0] * m,
                           queued=[len(ins.queue) // inp.samples for ins in insts], inflight=[0] * m,
                           isolated=[0] * m)
        self.fifo = shared_queue_groups(inp)  # the shared queue's groups, taken from fifo_ptr on
        self.fifo_ptr = 0
        self.budget: Optional[Callable[[], float]] = None
        self.group_capacity: Optional[int] = None
        self.granted = [0] * m  # groups instance j may still open under the budget
        self._unbounded = False  # the budget covers every group from the start: no dealing

    @property
    def takes_elsewhere(self) -> bool:
        """Whether an instance with an empty queue may get work from elsewhere (a steal or the shared queue)."""
        return self.work_stealing or self.shared_queue

    # ------------------------------------------------------------------ where the next group comes from
    def source(self, j: int) -> int:
        """Where instance j's next group comes from when its own queue is empty: the shared queue, the victim
        of a steal (the policy's most loaded queue with a whole not-started group at its tail), or nowhere."""
        if self.shared_queue:
            return SHARED if self.fifo_ptr < len(self.fifo) else NOWHERE
        if not self.work_stealing or not may_steal(self.loads.isolated[j]):
            return NOWHERE
        nsamp = self.nsamp
        cands = []
        for v, other in enumerate(self.insts):
            start = len(other.queue) - nsamp
            # a partly admitted group is never split
            if v != j and start >= other.ptr and start >= 0 and other.head[start]:
                cands.append(v)
        v = steal_victim(self.loads.queued_load, cands)
        return NOWHERE if v < 0 else v

    def source_head(self, src: int) -> int:
        """First sequence of the group `src` would hand over (not moved yet)."""
        if src == SHARED:
            return self.fifo[self.fifo_ptr] * self.nsamp
        return self.insts[src].queue[-self.nsamp]

    def take_group(self, j: int, src: int) -> None:
        """Move the group `src` hands over to the end of instance j's (empty) queue."""
        nsamp, ins, loads, gload = self.nsamp, self.insts[j], self.loads, self.group_load
        if src == SHARED:
            g = self.fifo[self.fifo_ptr]
            self.fifo_ptr += 1
            sids = list(range(g * nsamp, (g + 1) * nsamp))
        else:
            victim = self.insts[src]
            sids = victim.queue[-nsamp:]
            del victim.queue[-nsamp:]
            del victim.head[-nsamp:]
            g = sids[0] // nsamp
            loads.queued_load[src] -= gload[g]
            loads.queued[src] -= 1
            self.rec.group_stolen[g] = True
            self.rec.steals[j] += 1
        loads.queued_load[j] += gload[g]
        loads.queued[j] += 1
        ins.queue.extend(sids)
        ins.head.extend([True] + [False] * (nsamp - 1))
        self.rec.group_instance[g] = j

    def requeue(self, g: int) -> int:
        """Queue finished group g again to be regenerated: at the front of the shared queue (the runtime's
        fifo.appendleft; returns -1), else at the head of the waiting queue of the least loaded instance
        (returned)."""
        n = self.nsamp
        if self.shared_queue:
            if self.fifo_ptr > 0:
                self.fifo_ptr -= 1
                self.fifo[self.fifo_ptr] = g
            else:
                self.fifo.insert(0, g)
            self.rec.group_instance[g] = -1
            return -1
        loads = self.loads
        m = len(self.insts)
        j = lightest([loads.queued_load[k] + loads.inflight_load[k] for k in range(m)], range(m))
        ins = self.insts[j]
        ins.queue[ins.ptr:ins.ptr] = list(range(g * n, (g + 1) * n))
        ins.head[ins.ptr:ins.ptr] = [True] + [False] * (n - 1)
        loads.queued_load[j] += self.group_load[g]
        loads.queued[j] += 1
        self.rec.group_instance[g] = j
        return j

    # ------------------------------------------------------------------ what the instances hold
    def opened(self, j: int, g: int, granting: bool) -> None:
        """Instance j dispatched group g (its first sequence admitted); `granting` (the caller's `granting`,
        read before the gate was asked): one granted group used."""
        loads, load = self.loads, self.group_load[g]
        loads.queued_load[j] -= load
        loads.inflight_load[j] += load
        loads.queued[j] -= 1
        loads.inflight[j] += 1
        if self.isolated[g]:
            loads.isolated[j] += 1
        if granting:
            self.granted[j] -= 1

    def closed(self, j: int, g: int) -> None:
        """Group g finished on instance j."""
        loads = self.loads
        loads.inflight_load[j] -= self.group_load[g]
        loads.inflight[j] -= 1
        if self.isolated[g]:
            loads.isolated[j] -= 1

    # ------------------------------------------------------------------ lag budget dealing
    @property
    def granting(self) -> bool:
        """Whether the lag budget is dealt out (a budget is set and does not cover every group)."""
        return self.budget is not None and not self._unbounded

    def check_unbounded(self) -> None:
        """At the start: no dealing at all when the budget covers every group (the gate never binds: opening a
        group uses one unit of budget and one pending group alike), so an unbounded run admits as before."""
        if self.budget is None or self._unbounded:
            return
        pending = len(self.fifo) - self.fifo_ptr + sum(self.loads.queued)
        if self.budget() >= pending:
            self._unbounded = True
            self.granted = [0] * len(self.insts)

    def deal(self) -> List[int]:
        """Deal the budget not granted yet (`deal_grants`); returns the instances granted a group, in the
        order of their first grant."""
        granted, loads = self.granted, self.loads
        left = int(self.budget()) - sum(granted)
        if left <= 0:
            return []
        m = len(self.insts)
        if self.shared_queue:
            own, pool = [0] * m, len(self.fifo) - self.fifo_ptr - sum(granted)
        else:
            own, pool = [max(0, loads.queued[k] - granted[k]) for k in range(m)], None
        may_take = [may_steal(x) for x in loads.isolated] if self.work_stealing and pool is None else None
        return deal_grants(left, granted, loads.inflight, own, pool, self.group_capacity, may_take)
