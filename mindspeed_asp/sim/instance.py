"""One simulated inference instance (a vLLM engine under continuous batching), and the sequences' shared state.

Why apart from the event loop (engine.py): what happens inside one instance between two of its events touches
only that instance and the sequences it runs: stepping at a constant active count, retiring the sequences
that finish, preempting the latest admitted ones when the KV budget overflows, finding its next event. Which
sequences it admits, when and from where is the event loop's (the gate, the lag budget) and the dispatcher's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from heapq import heappop
from typing import List, Optional, Tuple

from mindspeed_asp.sim.instance_inputs import INF, InstanceInputs
from mindspeed_asp.sim.trace import InstanceTrace


@dataclass(eq=False)
class Sequences:
    """Every sequence's state, indexed g*n+s and shared by the instances (a regenerated group may run on
    another one); plain lists: the hot loop indexes them one element at a time."""

    nsamp: int  # n, sequences per group
    prompt: List[int]  # prompt tokens
    response: List[int]  # true response tokens
    progress: List[int]  # tokens generated before the current admission
    admit_step: List[int]  # the instance step of the current admission
    epoch: List[int]  # odd while running; a bump invalidates stale heap and admission entries
    group_left: List[int]  # per group: sequences still generating

    @classmethod
    def fresh(cls, inp: InstanceInputs) -> "Sequences":
        """Nothing generated yet."""
        total = inp.groups * inp.samples
        return cls(nsamp=inp.samples, prompt=inp.prompt, response=inp.response, progress=[0] * total,
                   admit_step=[0] * total, epoch=[0] * total, group_left=[inp.samples] * inp.groups)


@dataclass(eq=False, slots=True)  # slots: the event loop reads these attributes on every event
class Instance:
    """One instance: its queue, what runs, its clock and its pending event, plus what it reads (the interval
    sums, the KV budget and policy, the sequences, the trace being recorded)."""

    index: int
    iv: object  # step_cost interval sums
    kv_budget: float  # K, inf when unbounded
    preempting: bool  # a KV overflow preempts ("preempt" policy under a budget)
    reserve: bool  # "reserve" policy: admit only what fits at its final length
    seqs: Sequences
    rec: InstanceTrace
    queue: List[int]  # sequence ids g*n+s in plan order
    head: List[bool]  # sequence starts a new group
    ptr: int = 0
    front: List[int] = field(default_factory=list)  # preempted sequences, re-admitted first (stack: last=first)
    running: List[tuple] = field(default_factory=list)  # heap (finish_step, sid, epoch)
    # (sid, epoch) per admission, in admission order (lazy; only with a KV budget): an entry is live while
    # seqs.epoch[sid] == epoch. A bare sid is not enough: a regenerated sequence runs again, maybe elsewhere
    admitted: List[tuple] = field(default_factory=list)
    n: int = 0
    kv: float = 0.0  # resident KV at the current step boundary
    reserved: float = 0.0  # reserve policy: sum of final KV of running sequences
    step: int = 0
    clock: float = 0.0
    busy: float = 0.0
    prefill: float = 0.0  # prefill tokens admitted at the current boundary
    token: int = 0  # invalidates stale heap entries
    held: bool = False  # head-of-line group refused by the gate
    retry_at: float = INF
    paused_until: float = 0.0
    extra: float = 0.0  # pause time to add at the next advance
    event_step: int = -1
    event_time: float = INF

    def advance(self, to_step: int) -> None:
        """Step to `to_step` at the constant active count: clock (plus any pause), busy time, resident KV."""
        d = to_step - self.step
        if d <= 0:
            return
        dt = self.iv.interval(self.n, self.kv, d, self.prefill)
        self.clock += dt + self.extra
        self.extra = 0.0
        self.busy += dt
        self.kv += self.n * d
        self.step = to_step
        self.prefill = 0.0
        self.rec.end[self.index] = self.clock

    def retire_due(self) -> List[int]:
        """Free the slots of the sequences that finish at this step; returns the groups they complete."""
        run = self.running
        step = self.step
        clock = self.clock
        seqs = self.seqs
        epoch, pl, ll = seqs.epoch, seqs.prompt, seqs.response
        left, nsamp = seqs.group_left, seqs.nsamp
        reserve = self.reserve
        seq_finish = self.rec.seq_finish
        n, kv = self.n, self.kv
        done = []
        while run and run[0][0] <= step:
            _, sid, ep = heappop(run)
            if ep != epoch[sid]:
                continue
            epoch[sid] = ep + 1  # no longer running
            n -= 1
            final = pl[sid] + ll[sid]
            kv -= final
            if reserve:
                self.reserved -= final
            seq_finish[sid] = clock
            g = sid // nsamp
            left[g] -= 1
            if left[g] == 0:
                done.append(g)
        self.n, self.kv = n, kv
        return done

    def preempt(self) -> None:
        """The next step overflows the KV budget (preempt policy): preempt the most recently admitted
        sequences until it fits (they are recomputed when re-admitted)."""
        seqs, rec = self.seqs, self.rec
        admitted, epoch = self.admitted, seqs.epoch
        while self.kv + self.n > self.kv_budget and admitted:
            sid, ep = admitted[-1]
            if epoch[sid] != ep:
                # that admission ended: finished, preempted, or its group was regenerated and the sequence
                # admitted again (possibly on another instance, whose state it belongs to now)
                admitted.pop()
                continue
            if self.n <= 1:
                break
            admitted.pop()
            prog = seqs.progress[sid] + (self.step - seqs.admit_step[sid])
            epoch[sid] = ep + 1  # invalidates its heap and admission entries
            seqs.progress[sid] = prog
            self.n -= 1
            self.kv -= seqs.prompt[sid] + prog
            rec.seq_preemptions[sid] += 1
            rec.preemptions[self.index] += 1
            self.front.append(sid)

    def next_event(self) -> Optional[Tuple[float, int]]:
        """(time, step) of the next event: the earliest finish, a KV overflow, or a pending gate retry (which
        releases the held group). None when idle; its pending events are void then."""
        n, kv, prefill, step, now = self.n, self.kv, self.prefill, self.step, self.clock
        if n == 0:
            self.event_time = INF
            self.event_step = -1
            self.token += 1
            return None
        running, epoch = self.running, self.seqs.epoch
        while running and running[0][2] != epoch[running[0][1]]:
            heappop(running)
        ev = running[0][0]
        if self.preempting:
            # overflow when kv + n*d + n > K, i.e. at the first d with d > (K - kv - n) / n
            d_over = int(math.floor((self.kv_budget - kv - n) / n)) + 1
            ev = min(ev, step + max(d_over, 1))
        if self.retry_at < INF:
            rel = self.retry_at - now
            d = self.iv.steps_to_reach(n, kv, prefill, rel) if rel > 0 else 1
            ev = min(ev, step + max(d, 1))
            self.retry_at = INF
            self.held = False
        return now + self.iv.interval(n, kv, ev - step, prefill) + self.extra, ev
