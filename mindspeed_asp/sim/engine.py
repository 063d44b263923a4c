"""Event-driven simulator of inference instances under continuous batching (vLLM-like).

Why event-driven: between two events of an instance (a sequence finishes, the KV budget overflows, a held
group is released) the active count n is constant and the resident KV grows by n tokens per step, so the
time of the steps in between has a closed form (linear cost) or one vectorised sum (tabulated cost). The
simulator therefore jumps from event to event instead of stepping token by token, and a 64-instance x
10^5-group epoch runs in seconds.

Model of one instance (one vLLM engine):
- B slots (`max_num_seqs`): at every step boundary, free slots admit waiting sequences first-come first-served,
  preempted sequences first (vLLM puts them back at the head of the waiting queue);
- every step each running sequence produces one token; a sequence of response length L admitted at step s
  frees its slot at step s + L (its first step includes its prefill, cost p * prefill tokens);
- a step costs `cost.step_time(active, kv, prefill)` where kv = sum over running sequences of
  (prompt + generated tokens) at the start of the step;
- KV budget K (tokens, optional): a step needs `kv + active <= K` (every sequence writes one token). With
  `kv_policy="preempt"` admission is optimistic and, when the budget overflows, the most recently admitted
  sequences are preempted and later recomputed (prefill of prompt + generated tokens), as vLLM V1 does;
  with `kv_policy="reserve"` a sequence is admitted only if its final KV (prompt + L) fits, so it never
  preempts.

A group (the n samples of one prompt) is dispatched when its first sequence is admitted; a `gate` callback
can hold a group back (admission control of the pipeline), and a held instance waits head-of-line, keeping
the plan order, until `InstanceSim.notify` is called or the gate's retry time comes.

Where an instance's next group comes from when its own queue is empty (work stealing, a shared queue, the
plan's isolation) and how a lag budget is dealt out are the shared policy's decisions, made by the
simulator's dispatcher (dispatcher.py) with the functions the runtime's dispatcher calls. When several
instances are offered work at once (the start, `notify` after a version bump), they go in the policy's
order: fewest running first, those with work of their own before those that would take it elsewhere.

Layout: this module holds the event loop (`InstanceSim`: events, the gate, waking, admission) and
`simulate_instances`; its result (`InstanceTrace`) is trace.py's, one instance's stepping, retiring and
preemption are instance.py's, the dispatcher dispatcher.py's, the input checks instance_inputs.py's, step
costs and interval sums step_cost.py's.
"""
from __future__ import annotations

from heapq import heappop, heappush  # bare names: the event loop calls them on every event
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from mindspeed_asp.core.policy import offer_order, wake_order
from mindspeed_asp.core.problem import InstanceSpec
from mindspeed_asp.sim.dispatcher import NOWHERE, OWN, GroupDispatcher, plan_queues
from mindspeed_asp.sim.instance import Instance, Sequences
from mindspeed_asp.sim.instance_inputs import DISPATCH, INF, InstanceInputs, check_instance_inputs
from mindspeed_asp.sim.trace import InstanceTrace, empty_trace

__all__ = ["DISPATCH", "INF", "GateFn", "InstanceSim", "simulate_instances"]

_ADMITTED, _HELD, _RETRY = 0, 1, 2  # the gate's answer for a group, as the admission loop acts on it


GateFn = Callable[[int, float], Optional[float]]
"""gate(group, now) -> None to admit now; a time to retry at; or math.inf to wait for `InstanceSim.notify`."""


def _instances(inp: InstanceInputs, queues: List[Tuple[List[int], List[bool], float]], seqs: Sequences,
               rec: InstanceTrace) -> List[Instance]:
    """The instances, idle at time 0, each with its plan queue (`dispatcher.plan_queues`)."""
    preempting = inp.kv_budget < INF and inp.kv_policy == "preempt"
    return [Instance(index=j, iv=inp.intervals, kv_budget=inp.kv_budget, preempting=preempting,
                     reserve=inp.kv_policy == "reserve", seqs=seqs, rec=rec, queue=queue, head=head)
            for j, (queue, head, _) in enumerate(queues)]


# --------------------------------------------------------------------------------------------- the simulator
class InstanceSim:
    """The inference instances (vLLM engines) of a rollout, simulated in one event loop, so a pipeline can
    interleave trainer events and gate dispatches.

    Named for what it models: the instances and how groups reach them (plan queues, a shared queue, stealing,
    the gate and the lag budget), not the devices around them; the device-level model of a run (device counts,
    splits, trainer and sync times) is `sim.cluster.ClusterModel`.

    Use: `s = InstanceSim(...)`; repeatedly `s.peek_time()` / `s.step()`, which processes the earliest instance
    event and calls `on_group_done(g, t)` for every completed group; `s.version` is the policy version
    stamped on admissions; `s.notify(t)` re-offers held groups at time t; `s.pause(t, d)` stops all instances
    for d seconds (weight sync); `s.trace()` returns the InstanceTrace. `s.rec` is the trace being recorded.
    """

    def __init__(self, orders: Sequence[np.ndarray], lengths: np.ndarray, prompt_lens: np.ndarray,
                 spec: InstanceSpec, cost, *, gate: Optional[GateFn] = None,
                 on_group_done: Optional[Callable[[int, float], None]] = None,
                 kv_policy: str = "preempt", cost_scale: float = 1.0, work_stealing: bool = False,
                 steal_load: Optional[np.ndarray] = None, dispatch: str = "plan",
                 isolated: Optional[Sequence[int]] = None) -> None:
        inp = check_instance_inputs(orders, lengths, prompt_lens, spec, cost, kv_policy=kv_policy,
                                    cost_scale=cost_scale, steal_load=steal_load, dispatch=dispatch,
                                    isolated=isolated)
        self.inputs = inp
        # what the event loop reads on every event, as plain attributes
        self.G, self.nsamp, self.B, self.K = inp.groups, inp.samples, inp.slots, inp.kv_budget
        self.kv_policy, self.iv = inp.kv_policy, inp.intervals
        self.gate = gate
        self.on_group_done = on_group_done
        self.version = 0
        self.rec = empty_trace(inp)
        self.seqs = Sequences.fresh(inp)
        queues = plan_queues(inp)
        self.insts = _instances(inp, queues, self.seqs, self.rec)
        self.dispatcher = GroupDispatcher(inp, self.insts, [load for _, _, load in queues], self.rec,
                                          work_stealing)
        self._heap: List[tuple] = []  # (time, seq, instance, token): an entry is live while token matches
        self._seq = 0
        self._started = False

    # ------------------------------------------------------------------ the event loop
    def start(self, t: float = 0.0) -> None:
        """Admit the first sequences of every instance at time t."""
        if self._started:
            return
        self._started = True
        for ins in self.insts:
            ins.clock = t
        self.dispatcher.check_unbounded()
        if self.dispatcher.granting:
            self.dispatcher.deal()  # the instances admit just below, in the policy's order
        for j in self._wake_order(range(len(self.insts))):
            self._admit_and_schedule(j)

    def peek_time(self) -> float:
        """Time of the earliest pending instance event (inf when none), dropping superseded ones."""
        if not self._started:  # (a check, not a call: this runs on every event)
            self.start()
        h = self._heap
        while h:
            t, _, j, tok = h[0]
            if tok == self.insts[j].token:
                return t
            heappop(h)
        return INF

    def step(self) -> float:
        """Process the earliest instance event; returns its time (inf when nothing is pending).

        The event is a retry (`_on_retry`) or a step boundary: the instance steps there (`Instance.advance`),
        retires what is due (`_finish_due`), deals the budget the completed groups freed (it admits just
        below, so it is not woken), then admits and schedules its next event (`_admit_and_schedule`). The
        boundary is handled inline, not in a method of its own: this runs once per event."""
        t = self.peek_time()
        if t == INF:
            return t
        j = heappop(self._heap)[2]
        ins = self.insts[j]
        if ins.event_step < 0:
            self._on_retry(j, t)
            return t
        ins.advance(ins.event_step)
        if self._finish_due(j, ins) and self.dispatcher.granting:
            self._deal(t, skip=j)
        self._admit_and_schedule(j)
        return t

    def run(self) -> None:
        """Run until no instance event is pending (all done, or all held by the gate)."""
        while self.step() < INF:
            pass

    def _on_retry(self, j: int, t: float) -> None:
        """The retry time of a held or paused idle instance came: admit from there."""
        ins = self.insts[j]
        ins.clock = max(ins.clock, t)
        ins.retry_at = INF
        self._admit_and_schedule(j)

    # ------------------------------------------------------------------ what the pipeline drives
    def notify(self, t: float) -> None:
        """Re-offer held groups at time t (the gate's answer may have changed, e.g. a new version).

        Held instances, and idle ones that may take work from elsewhere, are offered in the policy's order
        (the order the runtime's dispatcher fills free instances in): those with work of their own first,
        then fewest running sequences, then index; a fixed index order would let the low-numbered instances
        take all the admission budget and starve the others. Under a bounded lag budget the new budget is
        dealt out group by group instead (`_deal`) and only the instances granted a group are woken.
        """
        if self.dispatcher.granting:
            self._deal(t)
            return
        elsewhere = self.dispatcher.takes_elsewhere
        cands = [j for j, ins in enumerate(self.insts) if ins.held or (elsewhere and self._idle_empty(ins))]
        for j in self._wake_order(cands):
            ins = self.insts[j]
            if ins.held:
                ins.held = False
                self._wake(j, t)
            elif self._idle_empty(ins):
                self._wake(j, t)

    def requeue(self, g: int, t: float) -> int:
        """Regenerate finished group g from scratch (a stale group): its n samples go to the head of the waiting
        queue of the least-loaded instance at time t, as a new dispatch (the gate applies again). Returns the
        instance. The first generation's work stays in the busy time: it was spent."""
        seqs = self.seqs
        if seqs.group_left[g] != 0:
            raise ValueError(f"group {g} is still generating; only finished groups can be regenerated")
        n = self.nsamp
        for sid in range(g * n, (g + 1) * n):
            seqs.progress[sid] = 0
        seqs.group_left[g] = n
        self.rec.group_finish[g] = np.nan
        self.rec.group_regenerated[g] += 1
        j = self.dispatcher.requeue(g)
        if j < 0:  # the shared queue: whoever is offered work first takes it
            self.notify(t)
        elif self.dispatcher.granting:
            self._deal(t)
        else:
            self._wake(j, t)
        return j

    def pause(self, t: float, duration: float) -> None:
        """Stop every instance for `duration` seconds from time t (a weight-sync round); busy time excludes it."""
        if duration <= 0:
            return
        until = t + duration
        for j, ins in enumerate(self.insts):
            ins.paused_until = max(ins.paused_until, until)
            if ins.n > 0 and ins.event_time < INF:
                ins.extra += duration
                self._push(j, ins.event_time + duration, ins.event_step)
            elif ins.retry_at < INF and ins.retry_at < until:
                self._push_retry(j, until)

    def unfinished_groups(self) -> int:
        """Groups with a sequence still to generate."""
        return sum(1 for x in self.seqs.group_left if x > 0)

    def trace(self) -> InstanceTrace:
        """A copy of the record so far, with each instance's busy time and steps."""
        rec = self.rec
        busy = np.array([ins.busy for ins in self.insts])
        steps = np.array([ins.step for ins in self.insts], dtype=np.int64)
        return InstanceTrace(
            n=rec.n, group_instance=rec.group_instance.copy(), group_dispatch=rec.group_dispatch.copy(),
            group_finish=rec.group_finish.copy(), group_version=rec.group_version.copy(),
            seq_start=rec.seq_start.copy(), seq_finish=rec.seq_finish.copy(), seq_version=rec.seq_version.copy(),
            seq_preemptions=rec.seq_preemptions.copy(), group_regenerated=rec.group_regenerated.copy(), busy=busy,
            steps=steps, end=rec.end.copy(), preemptions=rec.preemptions.copy(),
            recompute_tokens=rec.recompute_tokens.copy(), kv_peak=rec.kv_peak.copy(), steals=rec.steals.copy(),
            group_stolen=rec.group_stolen.copy())

    # ------------------------------------------------------------------ waking instances
    @staticmethod
    def _idle_empty(ins: Instance) -> bool:
        return ins.n == 0 and not ins.front and ins.ptr >= len(ins.queue)

    def _wake_order(self, cands) -> List[int]:
        offered = offer_order([ins.n for ins in self.insts], cands)
        return wake_order(offered, [ins.ptr < len(ins.queue) or bool(ins.front) for ins in self.insts])

    def _wake(self, j: int, t: float) -> None:
        """Let instance j admit at time t: now if idle, else at its first step boundary at or after t."""
        ins = self.insts[j]
        t_eff = max(t, ins.paused_until)
        if ins.n == 0:
            ins.clock = max(ins.clock, t_eff)
            self._admit_and_schedule(j)
            return
        rel = t_eff - ins.clock - ins.extra
        d = self.iv.steps_to_reach(ins.n, ins.kv, ins.prefill, rel) if rel > 0 else 0
        if d == 0 or ins.step + d < ins.event_step:
            if d > 0:
                ins.advance(ins.step + d)
            self._admit_and_schedule(j)

    def _deal(self, t: float, skip: int = -1) -> None:
        """Deal the lag budget not granted yet (`GroupDispatcher.deal`) and wake the instances granted a group,
        in the order of their first grant; not `skip`, which is at its step boundary and admits next."""
        for j in self.dispatcher.deal():
            if j != skip:
                self.insts[j].held = False
                self._wake(j, t)

    # ------------------------------------------------------------------ stepping and retiring
    def _push(self, j: int, t: float, step: int) -> None:
        ins = self.insts[j]
        ins.token += 1
        ins.event_step = step
        ins.event_time = t
        self._seq += 1
        heappush(self._heap, (t, self._seq, j, ins.token))

    def _push_retry(self, j: int, t: float) -> None:
        ins = self.insts[j]
        ins.retry_at = t
        self._push(j, t, -1)

    def _finish_due(self, j: int, ins: Instance) -> int:
        """Retire instance j's (`ins`) sequences due at its step, close the groups they complete, then preempt
        if the next step overflows the KV budget. Returns how many groups completed."""
        clock = ins.clock
        done = ins.retire_due()
        if done:
            self._close_groups(j, done, clock)
        if ins.preempting and ins.kv + ins.n > ins.kv_budget:
            ins.preempt()
        return len(done)

    def _close_groups(self, j: int, done: List[int], clock: float) -> None:
        """Record the groups instance j completed at `clock`, release what they held, tell `on_group_done`."""
        group_finish, closed = self.rec.group_finish, self.dispatcher.closed
        for g in done:
            group_finish[g] = clock
            closed(j, g)
            if self.on_group_done is not None:
                self.on_group_done(g, clock)

    # ------------------------------------------------------------------ admission
    def _open_group(self, j: int, src: int, g: int, now: float, n: int, ptr: int) -> int:
        """Ask the gate for group g (own head, or from `src`); if admitted, take it and stamp its dispatch.

        Held: the instance waits head-of-line for `notify` or the gate's retry time (pushed now when the
        instance is idle: `_RETRY`, the caller returns at once). Under a bounded lag budget an instance with
        no group granted is held without asking the gate.
        """
        d = self.dispatcher
        granting = d.granting
        if granting and d.granted[j] <= 0:
            self.insts[j].held = True
            return _HELD
        if self.gate is not None:
            ans = self.gate(g, now)
            if ans is not None:
                ins = self.insts[j]
                ins.held = True
                if ans != INF and ans > now:
                    if n == 0:
                        ins.ptr = ptr
                        self._push_retry(j, ans)
                        return _RETRY
                    ins.retry_at = ans
                return _HELD
        if src != OWN:
            d.take_group(j, src)
        self.rec.group_dispatch[g] = now
        self.rec.group_version[g] = self.version
        d.opened(j, g, granting)
        return _ADMITTED

    def _admit_and_schedule(self, j: int) -> None:
        """Admit at instance j's boundary and push its next event; a paused idle instance retries when the
        pause ends instead."""
        ins = self.insts[j]
        if ins.clock < ins.paused_until and ins.n == 0:
            self._push_retry(j, ins.paused_until)
            return
        if self._admit(j):
            event = ins.next_event()
            if event is not None:
                self._push(j, event[0], event[1])

    def _admit(self, j: int) -> bool:
        """Fill instance j's free slots at its step boundary: preempted sequences first, then its own queue in
        plan order, then groups from elsewhere (`GroupDispatcher.source`). False when it returned early on a
        gate retry (the retry is its next event)."""
        ins, rec, d = self.insts[j], self.rec, self.dispatcher
        now, B, K, nsamp, version = ins.clock, self.B, self.K, self.nsamp, self.version
        bounded, reserve = K < INF, self.kv_policy == "reserve"
        q, head, running, front, step = ins.queue, ins.head, ins.running, ins.front, ins.step
        nq = len(q)
        seqs = self.seqs
        pl, ll, epoch, admit_step = seqs.prompt, seqs.response, seqs.epoch, seqs.admit_step
        seq_start, seq_version = rec.seq_start, rec.seq_version
        n, kv, prefill, ptr = ins.n, ins.kv, ins.prefill, ins.ptr
        while n < B:
            if front:
                sid = front[-1]
                prog = seqs.progress[sid]
                need = pl[sid] + prog
                if bounded and kv + n + need + 1 > K:
                    break
                front.pop()
                rec.recompute_tokens[j] += prog
            else:
                src = OWN if ptr < nq else d.source(j)
                if src == NOWHERE:
                    break
                sid = q[ptr] if src == OWN else d.source_head(src)
                need = pl[sid]
                if bounded and (ins.reserved + need + ll[sid] > K if reserve else kv + n + need + 1 > K):
                    break
                if src != OWN or head[ptr]:
                    verdict = self._open_group(j, src, sid // nsamp, now, n, ptr)
                    if verdict == _RETRY:
                        return False
                    if verdict == _HELD:
                        break
                    nq = len(q)
                ptr += 1
                prog = 0
                seq_start[sid] = now
                seq_version[sid] = version
            # admit sid with `prog` tokens already generated
            ep = epoch[sid] + 1  # odd = running
            epoch[sid] = ep
            admit_step[sid] = step
            n += 1
            kv += need
            prefill += need
            if reserve:
                ins.reserved += pl[sid] + ll[sid]
            if bounded:
                ins.admitted.append((sid, ep))
            heappush(running, (step + ll[sid] - prog, sid, ep))
        ins.n, ins.kv, ins.prefill, ins.ptr = n, kv, prefill, ptr
        if kv > rec.kv_peak[j]:
            rec.kv_peak[j] = int(kv)
        return True


def simulate_instances(orders: List[np.ndarray], lengths: np.ndarray, prompt_lens: np.ndarray,
                       spec: InstanceSpec, cost, release: Optional[Callable[[int], float]] = None, *,
                       kv_policy: str = "preempt", cost_scale: float = 1.0, work_stealing: bool = False,
                       steal_load: Optional[np.ndarray] = None, dispatch: str = "plan",
                       isolated: Optional[Sequence[int]] = None) -> InstanceTrace:
    """Run every instance's queue to completion and return the trace.

    `orders[j]` is instance j's ordered group indices; `lengths[g, s]` true response lengths; `release(g)`
    optionally gives the earliest time group g may be dispatched (its instance waits head-of-line until then).
    `cost` is a CostModel (closed-form) or anything with a vectorised `step_time` (e.g. TabulatedCost).
    `work_stealing` lets an instance with an empty queue take not-started groups from the most loaded one
    (`steal_load[g]`: load measure, default group count); `dispatch="fifo"` ignores the orders' placement and
    hands groups out from one queue in dataset order (the runtime's async mode).
    """
    gate = None
    if release is not None:
        def gate(g: int, now: float) -> Optional[float]:
            r = float(release(g))
            return None if r <= now else r
    sim = InstanceSim(orders, lengths, prompt_lens, spec, cost, gate=gate, kv_policy=kv_policy,
                      cost_scale=cost_scale, work_stealing=work_stealing, steal_load=steal_load, dispatch=dispatch,
                      isolated=isolated)
    sim.run()
    left = sim.unfinished_groups()
    if left:
        raise RuntimeError(f"{left} groups never finished (placed on no instance?)")
    return sim.trace()
