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
the plan order, until `Cluster.notify` is called or the gate's retry time comes.

Where an instance's next group comes from when its own queue is empty is the shared policy's
(`mindspeed_asp/policy.py`, the same functions the runtime's dispatcher calls):
- work stealing (`work_stealing=True`, the runtime's asp mode): the not-started group at the *tail* of the
  most loaded other queue (load = predicted tokens of its not-started groups when `steal_load` is given, else
  their count). Taking from the tail keeps the victim's plan order; a partly admitted group is never split;
  the group moves only once the gate admits it (the runtime steals only within its admission budget).
- `dispatch="fifo"` (the runtime's async mode): the head of one shared queue in dataset order; the
  instances start with empty queues. `dispatch="shared"` (a shared plan, `Assignment.shared`): the same,
  with the queue in the plan's order (the orders read position by position, `Assignment.shared_order`).
- isolation (`isolated`, the plan's `Assignment.isolated`): an instance running an isolated group steals
  nothing until it ends (`policy.may_steal`).
When several instances are offered work at once (the start, `notify` after a version bump), they go in the
policy's order: fewest running first, those with work of their own before those that would take it
elsewhere. Every steal is counted per thief and per group.

A lag budget (`Cluster.budget`, the pipeline's admission budget in groups) is dealt out as the runtime's
dispatcher hands out groups: one group at a time to the eligible instance with the fewest groups in flight
(own work first, then a thief), at most `group_capacity` in flight per instance. An instance opens no more
groups than it was granted; without this the first instance woken would fill all its slots and take the
whole budget. When the budget covers every group from the start, the gate never binds and instances admit
freely, as without a budget.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

import numpy as np

from mindspeed_asp.policy import lightest, may_steal, offer_order, shared_queue_order, steal_victim, wake_order
from mindspeed_asp.types import CostModel, InstanceSpec

INF = float("inf")
DISPATCH = ("plan", "fifo", "shared")
_OWN, _NONE, _FIFO = -1, -2, -3  # where the next group comes from (>= 0: the victim of a steal)
_ADMITTED, _HELD, _RETRY = 0, 1, 2  # the gate's answer for a group, as the admission loop acts on it


# --------------------------------------------------------------------------------------------- step costs
class TabulatedCost:
    """Step time interpolated in a measured table over (active sequences, KV tokens), seconds.

    Why: vLLM's step time is flat up to a knee and then compute bound, which the linear model misses. The
    table is a grid `time[i, j]` at `active[i]`, `kv[j]` (both increasing); outside the grid the edge values
    are held (no extrapolation). `p` is the per-prefill-token cost added on top.
    """

    def __init__(self, active: Sequence[float], kv: Sequence[float], time: np.ndarray, p: float = 0.0,
                 source: str = "table") -> None:
        from scipy.interpolate import RegularGridInterpolator

        self.active = np.asarray(active, dtype=np.float64)
        self.kv = np.asarray(kv, dtype=np.float64)
        self.time = np.asarray(time, dtype=np.float64)
        if self.time.shape != (len(self.active), len(self.kv)):
            raise ValueError(f"table shape {self.time.shape} != (len(active), len(kv)) = "
                             f"({len(self.active)}, {len(self.kv)})")
        if np.any(np.diff(self.active) <= 0) or np.any(np.diff(self.kv) <= 0):
            raise ValueError("table axes must be strictly increasing")
        self.p = float(p)
        self.source = source
        self._interp = RegularGridInterpolator((self.active, self.kv), self.time, method="linear",
                                               bounds_error=False, fill_value=None)

    def step_time(self, active, kv_tokens, prefill_tokens=0.0):
        act = np.clip(np.asarray(active, dtype=np.float64), self.active[0], self.active[-1])
        kv = np.clip(np.asarray(kv_tokens, dtype=np.float64), self.kv[0], self.kv[-1])
        act, kv = np.broadcast_arrays(act, kv)
        out = self._interp(np.stack([act.ravel(), kv.ravel()], axis=1)).reshape(act.shape)
        return out + self.p * np.asarray(prefill_tokens, dtype=np.float64)


class _LinearIntervals:
    """Closed-form sums of `a + b*n + c*(K + n*d)` over d = 0..D-1 steps, plus the prefill of the first step."""

    def __init__(self, cost: CostModel, scale: float = 1.0) -> None:
        self.a, self.b, self.c, self.p = (cost.a * scale, cost.b * scale, cost.c * scale, cost.p * scale)

    def interval(self, n: int, kv: float, steps: int, prefill: float) -> float:
        d = float(steps)
        return d * (self.a + self.b * n) + self.c * (d * kv + n * d * (d - 1.0) / 2.0) + self.p * prefill

    def steps_to_reach(self, n: int, kv: float, prefill: float, t: float) -> int:
        """Smallest D >= 1 with interval(n, kv, D, prefill) >= t."""
        qa = self.c * n / 2.0
        qb = self.a + self.b * n + self.c * kv - self.c * n / 2.0
        qc = self.p * prefill - t
        if qa > 0.0:
            disc = max(qb * qb - 4.0 * qa * qc, 0.0)
            d = (-qb + math.sqrt(disc)) / (2.0 * qa)
        else:
            d = -qc / qb if qb > 0 else 1.0
        d = max(1, int(math.ceil(d - 1e-9)))
        while d > 1 and self.interval(n, kv, d - 1, prefill) >= t:
            d -= 1
        while self.interval(n, kv, d, prefill) < t:
            d += 1
        return d


class _TableIntervals:
    """Interval sums for any vectorised `step_time(active, kv, prefill)` (one numpy sum per interval)."""

    def __init__(self, cost, scale: float = 1.0) -> None:
        self.cost = cost
        self.scale = scale
        self.p = float(getattr(cost, "p", 0.0)) * scale

    def _steps(self, n: int, kv: float, steps: int) -> np.ndarray:
        d = np.arange(steps, dtype=np.float64)
        return self.scale * np.asarray(self.cost.step_time(np.full(steps, float(n)), kv + n * d, 0.0))

    def interval(self, n: int, kv: float, steps: int, prefill: float) -> float:
        if steps <= 0:
            return 0.0
        return float(self._steps(n, kv, steps).sum()) + self.p * prefill

    def steps_to_reach(self, n: int, kv: float, prefill: float, t: float) -> int:
        horizon = 64
        while True:
            cum = np.cumsum(self._steps(n, kv, horizon)) + self.p * prefill
            idx = int(np.searchsorted(cum, t, side="left"))
            if idx < horizon:
                return idx + 1
            horizon *= 4


def make_intervals(cost, scale: float = 1.0):
    """Interval-time helper for a cost object: closed form for the linear CostModel, sums otherwise."""
    if isinstance(cost, CostModel):
        return _LinearIntervals(cost, scale)
    if not hasattr(cost, "step_time"):
        raise TypeError(f"cost {cost!r} has no step_time(active, kv, prefill)")
    return _TableIntervals(cost, scale)


# --------------------------------------------------------------------------------------------- results
@dataclass
class InstanceTrace:
    """What the instances did: per group, per sequence and per instance (times in seconds).

    Sequence arrays are indexed by `g * n + s`. `seq_start` is the first admission, `seq_version` the policy
    version at first admission (the oldest version that produced any of its tokens), `group_dispatch` the
    time the group's first sequence was admitted and `group_version` the version then.
    """

    n: int
    group_instance: np.ndarray  # int [G]
    group_dispatch: np.ndarray  # float [G]
    group_finish: np.ndarray  # float [G]
    group_version: np.ndarray  # int [G]
    seq_start: np.ndarray  # float [G*n]
    seq_finish: np.ndarray  # float [G*n]
    seq_version: np.ndarray  # int [G*n]
    seq_preemptions: np.ndarray  # int [G*n]
    group_regenerated: np.ndarray  # int [G], times the group was regenerated (stale) before it was trained
    busy: np.ndarray  # float [m], T_j: time spent stepping
    steps: np.ndarray  # int [m], S_j: decode steps
    end: np.ndarray  # float [m], wall-clock time of the instance's last step
    preemptions: np.ndarray  # int [m]
    recompute_tokens: np.ndarray  # int [m], prefill tokens recomputed after preemption
    kv_peak: np.ndarray  # int [m], max resident KV reached
    steals: Optional[np.ndarray] = None  # int [m], groups this instance stole (work stealing)
    group_stolen: Optional[np.ndarray] = None  # bool [G], the group ran on a thief, not its plan instance

    @property
    def makespan(self) -> float:
        """Wall-clock time at which the last group finished."""
        return float(self.group_finish.max()) if len(self.group_finish) else 0.0


GateFn = Callable[[int, float], Optional[float]]
"""gate(group, now) -> None to admit now; a time to retry at; or math.inf to wait for `Cluster.notify`."""


@dataclass
class _Inst:
    queue: List[int]  # sequence ids g*n+s in plan order
    head: List[bool]  # sequence starts a new group
    ptr: int = 0
    front: List[int] = field(default_factory=list)  # preempted sequences, re-admitted first (stack: last=first)
    running: List[tuple] = field(default_factory=list)  # heap (finish_step, sid, epoch)
    # (sid, epoch) per admission, in admission order (lazy; only with a KV budget): an entry is live while
    # seq_epoch[sid] == epoch. A bare sid is not enough: a regenerated sequence runs again, maybe elsewhere
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


class Cluster:
    """All instances in one event loop, so a pipeline can interleave trainer events and gate dispatches.

    Use: `c = Cluster(...)`; repeatedly `c.peek_time()` / `c.step()`, which processes the earliest instance
    event and calls `on_group_done(g, t)` for every completed group; `c.version` is the policy version
    stamped on admissions; `c.notify(t)` re-offers held groups at time t; `c.pause(t, d)` stops all instances
    for d seconds (weight sync); `c.trace()` returns the InstanceTrace.
    """

    def __init__(self, orders: Sequence[np.ndarray], lengths: np.ndarray, prompt_lens: np.ndarray,
                 spec: InstanceSpec, cost, *, gate: Optional[GateFn] = None,
                 on_group_done: Optional[Callable[[int, float], None]] = None,
                 kv_policy: str = "preempt", cost_scale: float = 1.0, work_stealing: bool = False,
                 steal_load: Optional[np.ndarray] = None, dispatch: str = "plan",
                 isolated: Optional[Sequence[int]] = None) -> None:
        if dispatch not in DISPATCH:
            raise ValueError(f"dispatch must be one of {DISPATCH}, got {dispatch!r}")
        lengths = np.asarray(lengths)
        if lengths.ndim != 2:
            raise ValueError(f"lengths must be [G, n], got shape {lengths.shape}")
        if np.any(lengths < 1):
            raise ValueError("every response length must be >= 1 token")
        self.G, self.nsamp = lengths.shape
        self.L = lengths.astype(np.int64).ravel()
        plens = np.asarray(prompt_lens, dtype=np.int64)
        if plens.shape != (self.G,):
            raise ValueError(f"prompt_lens must have shape ({self.G},), got {plens.shape}")
        self.P = np.repeat(plens, self.nsamp)
        if kv_policy not in ("preempt", "reserve"):
            raise ValueError(f"kv_policy must be 'preempt' or 'reserve', got {kv_policy!r}")
        self.B = int(spec.slots)
        if self.B < 1:
            raise ValueError("InstanceSpec.slots must be >= 1")
        self.K = float(spec.kv_budget) if spec.kv_budget is not None else INF
        if self.K < INF:
            worst = int((self.P + self.L).max()) if self.G else 0
            if worst + 1 > self.K:
                raise ValueError(f"kv_budget {spec.kv_budget} is smaller than one sequence's prompt + response "
                                 f"({worst} tokens): that sequence can never run")
        self.kv_policy = kv_policy
        self.iv = make_intervals(cost, cost_scale)
        self.gate = gate
        self.on_group_done = on_group_done
        self.version = 0
        G, n = self.G, self.nsamp
        self.group_instance = np.full(G, -1, dtype=np.int64)
        self.group_dispatch = np.full(G, np.nan)
        self.group_finish = np.full(G, np.nan)
        self.group_version = np.full(G, -1, dtype=np.int64)
        self.group_left = [n] * G
        self.seq_start = np.full(G * n, np.nan)
        self.seq_finish = np.full(G * n, np.nan)
        self.seq_version = np.full(G * n, -1, dtype=np.int64)
        self.seq_pre = np.zeros(G * n, dtype=np.int64)
        self.regenerated = np.zeros(G, dtype=np.int64)
        # plain lists: the hot loop indexes them one element at a time
        self.seq_progress = [0] * (G * n)  # tokens generated before the current admission
        self.seq_admit_step = [0] * (G * n)
        self.seq_epoch = [0] * (G * n)  # odd while running; bumps invalidate stale heap entries
        self._pl = self.P.tolist()
        self._ll = self.L.tolist()
        self.insts: List[_Inst] = []
        self.preemptions = np.zeros(len(orders), dtype=np.int64)
        self.recompute = np.zeros(len(orders), dtype=np.int64)
        self.kv_peak = np.zeros(len(orders), dtype=np.int64)
        self.end = np.zeros(len(orders))
        self.work_stealing = bool(work_stealing)
        if steal_load is None:
            self._gload = [1.0] * G
        else:
            steal_load = np.asarray(steal_load, dtype=np.float64)
            if steal_load.shape != (G,):
                raise ValueError(f"steal_load must have shape ({G},), got {steal_load.shape}")
            self._gload = steal_load.tolist()
        self.steals = np.zeros(len(orders), dtype=np.int64)
        self.group_stolen = np.zeros(G, dtype=bool)
        self._qload = [0.0] * len(orders)  # load of each instance's not-started groups
        self._inload = [0.0] * len(orders)  # load of each instance's dispatched, unfinished groups
        seen = np.zeros(G, dtype=bool)
        for j, order in enumerate(orders):
            order = np.asarray(order, dtype=np.int64)
            if len(order) and (order.min() < 0 or order.max() >= G):
                raise ValueError(f"instance {j}: group index out of range [0, {G})")
            if np.any(seen[order]):
                raise ValueError(f"instance {j}: a group is placed twice")
            seen[order] = True
            self.group_instance[order] = j
            sids = (order[:, None] * n + np.arange(n)[None, :]).ravel()
            head = np.zeros(len(sids), dtype=bool)
            head[::n] = True
            self.insts.append(_Inst(queue=sids.tolist(), head=head.tolist()))
            self._qload[j] = float(sum(self._gload[g] for g in order.tolist()))
        self.dispatch = dispatch
        self._fifo: List[int] = []  # fifo dispatch: groups in dataset order, taken from _fifo_ptr on
        self._fifo_ptr = 0
        if dispatch == "shared":
            self._fifo = [int(g) for g in shared_queue_order(orders)]
            self.dispatch = dispatch = "fifo"  # from here on a shared queue like fifo's, in the plan's order
        elif dispatch == "fifo":
            self._fifo = np.flatnonzero(seen).tolist()
        if dispatch == "fifo":
            self.group_instance[:] = -1
            for j, ins in enumerate(self.insts):
                ins.queue, ins.head, self._qload[j] = [], [], 0.0
        self._heap: List[tuple] = []
        self._seq = 0
        self._started = False
        # lag budget dealing (see the module doc): set `budget` (and `group_capacity`) before the first step
        self.budget: Optional[Callable[[], float]] = None
        self.group_capacity: Optional[int] = None
        m = len(self.insts)
        self.granted = [0] * m  # groups instance j may still open under the budget
        self._infl = [0] * m  # groups opened on instance j and not finished
        self._isolated = [False] * self.G  # groups the plan isolated (policy.may_steal)
        for g in (isolated if isolated is not None else ()):
            if not 0 <= int(g) < self.G:
                raise ValueError(f"isolated group {g} outside [0, {self.G})")
            self._isolated[int(g)] = True
        self._iso_n = [0] * m  # isolated groups in flight on instance j
        self._qn = [len(ins.queue) // n for ins in self.insts]  # not-started groups in instance j's own queue
        self._unbounded = False  # the budget covers every group from the start: no dealing

    # ------------------------------------------------------------------ public loop
    def start(self, t: float = 0.0) -> None:
        """Admit the first sequences of every instance at time t."""
        if self._started:
            return
        self._started = True
        for ins in self.insts:
            ins.clock = t
        self._check_unbounded()
        if self._granting:
            self._deal(t, wake=False)
        for j in self._wake_order(range(len(self.insts))):
            self._admit_and_schedule(j)

    def peek_time(self) -> float:
        self.start()
        h = self._heap
        while h:
            t, _, j, tok = h[0]
            if tok == self.insts[j].token:
                return t
            heapq.heappop(h)
        return INF

    def step(self) -> float:
        """Process the earliest instance event; returns its time (inf when nothing is pending)."""
        t = self.peek_time()
        if t == INF:
            return t
        _, _, j, _ = heapq.heappop(self._heap)
        ins = self.insts[j]
        if ins.event_step < 0:  # retry of a held/paused idle instance
            ins.clock = max(ins.clock, t)
            ins.retry_at = INF
            self._admit_and_schedule(j)
            return t
        self._advance(j, ins.event_step)
        if self._finish_due(j) and self._granting:
            self._deal(t, skip=j)  # freed group capacity may take budget left over; j admits just below
        self._admit_and_schedule(j)
        return t

    def run(self) -> None:
        """Run until no instance event is pending (all done, or all held by the gate)."""
        while self.step() < INF:
            pass

    def notify(self, t: float) -> None:
        """Re-offer held groups at time t (the gate's answer may have changed, e.g. a new version).

        Held instances, and idle ones that may take work from elsewhere, are offered in the policy's order
        (the order the runtime's dispatcher fills free instances in): those with work of their own first,
        then fewest running sequences, then index; a fixed index order would let the low-numbered instances
        take all the admission budget and starve the others. Under a bounded lag budget the new budget is
        dealt out group by group instead (`_deal`) and only the instances granted a group are woken.
        """
        if self._granting:
            self._deal(t)
            return
        elsewhere = self.work_stealing or self.dispatch == "fifo"
        cands = [j for j, ins in enumerate(self.insts) if ins.held or (elsewhere and self._idle_empty(ins))]
        for j in self._wake_order(cands):
            ins = self.insts[j]
            if ins.held:
                ins.held = False
                self._wake(j, t)
            elif self._idle_empty(ins):
                self._wake(j, t)

    @staticmethod
    def _idle_empty(ins: "_Inst") -> bool:
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
                self._advance(j, ins.step + d)
            self._admit_and_schedule(j)

    def requeue(self, g: int, t: float) -> int:
        """Regenerate finished group g from scratch (a stale group): its n samples go to the head of the waiting
        queue of the least-loaded instance at time t, as a new dispatch (the gate applies again). Returns the
        instance. The first generation's work stays in the busy time: it was spent."""
        if self.group_left[g] != 0:
            raise ValueError(f"group {g} is still generating; only finished groups can be regenerated")
        n = self.nsamp
        for sid in range(g * n, (g + 1) * n):
            self.seq_progress[sid] = 0
        self.group_left[g] = n
        self.group_finish[g] = np.nan
        self.regenerated[g] += 1
        if self.dispatch == "fifo":  # back to the front of the shared queue (the runtime's fifo.appendleft)
            if self._fifo_ptr > 0:
                self._fifo_ptr -= 1
                self._fifo[self._fifo_ptr] = g
            else:
                self._fifo.insert(0, g)
            self.group_instance[g] = -1
            self.notify(t)
            return -1
        loads = [self._qload[k] + self._inload[k] for k in range(len(self.insts))]
        j = lightest(loads, range(len(self.insts)))
        ins = self.insts[j]
        ins.queue[ins.ptr:ins.ptr] = list(range(g * n, (g + 1) * n))
        ins.head[ins.ptr:ins.ptr] = [True] + [False] * (n - 1)
        self._qload[j] += self._gload[g]
        self._qn[j] += 1
        self.group_instance[g] = j
        if self._granting:
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
        return sum(1 for x in self.group_left if x > 0)

    def trace(self) -> InstanceTrace:
        busy = np.array([ins.busy for ins in self.insts])
        steps = np.array([ins.step for ins in self.insts], dtype=np.int64)
        return InstanceTrace(
            n=self.nsamp, group_instance=self.group_instance.copy(), group_dispatch=self.group_dispatch.copy(),
            group_finish=self.group_finish.copy(), group_version=self.group_version.copy(),
            seq_start=self.seq_start.copy(), seq_finish=self.seq_finish.copy(),
            seq_version=self.seq_version.copy(), seq_preemptions=self.seq_pre.copy(),
            group_regenerated=self.regenerated.copy(), busy=busy, steps=steps,
            end=self.end.copy(), preemptions=self.preemptions.copy(), recompute_tokens=self.recompute.copy(),
            kv_peak=self.kv_peak.copy(), steals=self.steals.copy(), group_stolen=self.group_stolen.copy())

    # ------------------------------------------------------------------ internals
    def _push(self, j: int, t: float, step: int) -> None:
        ins = self.insts[j]
        ins.token += 1
        ins.event_step = step
        ins.event_time = t
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, j, ins.token))

    def _push_retry(self, j: int, t: float) -> None:
        ins = self.insts[j]
        ins.retry_at = t
        self._push(j, t, -1)

    def _advance(self, j: int, to_step: int) -> None:
        ins = self.insts[j]
        d = to_step - ins.step
        if d <= 0:
            return
        dt = self.iv.interval(ins.n, ins.kv, d, ins.prefill)
        ins.clock += dt + ins.extra
        ins.extra = 0.0
        ins.busy += dt
        ins.kv += ins.n * d
        ins.step = to_step
        ins.prefill = 0.0
        self.end[j] = ins.clock

    def _finish_due(self, j: int) -> int:
        ins = self.insts[j]
        run = ins.running
        step = ins.step
        clock = ins.clock
        epoch, pl, ll = self.seq_epoch, self._pl, self._ll
        left, nsamp = self.group_left, self.nsamp
        reserve = self.kv_policy == "reserve"
        pop = heapq.heappop
        n, kv = ins.n, ins.kv
        done = []
        while run and run[0][0] <= step:
            _, sid, ep = pop(run)
            if ep != epoch[sid]:
                continue
            epoch[sid] = ep + 1  # no longer running
            n -= 1
            final = pl[sid] + ll[sid]
            kv -= final
            if reserve:
                ins.reserved -= final
            self.seq_finish[sid] = clock
            g = sid // nsamp
            left[g] -= 1
            if left[g] == 0:
                done.append(g)
        ins.n, ins.kv = n, kv
        infl = self._infl
        for g in done:
            self.group_finish[g] = clock
            self._inload[j] -= self._gload[g]
            infl[j] -= 1
            if self._isolated[g]:
                self._iso_n[j] -= 1
            if self.on_group_done is not None:
                self.on_group_done(g, clock)
        if self.K < INF and self.kv_policy == "preempt" and ins.kv + ins.n > self.K:
            self._preempt(j)
        return len(done)

    def _preempt(self, j: int) -> None:
        """Preempt the most recently admitted sequences until the next step fits (recompute later)."""
        ins = self.insts[j]
        admitted, epoch = ins.admitted, self.seq_epoch
        while ins.kv + ins.n > self.K and admitted:
            sid, ep = admitted[-1]
            if epoch[sid] != ep:
                # that admission ended: finished, preempted, or its group was regenerated and the sequence
                # admitted again (possibly on another instance, whose state it belongs to now)
                admitted.pop()
                continue
            if ins.n <= 1:
                break
            admitted.pop()
            prog = self.seq_progress[sid] + (ins.step - self.seq_admit_step[sid])
            epoch[sid] = ep + 1  # invalidates its heap and admission entries
            self.seq_progress[sid] = prog
            ins.n -= 1
            ins.kv -= self._pl[sid] + prog
            self.seq_pre[sid] += 1
            self.preemptions[j] += 1
            ins.front.append(sid)

    # ------------------------------------------------------------------ admission
    def _source(self, j: int) -> int:
        """Where instance j's next group comes from when its own queue is empty: the shared FIFO, the victim
        of a steal (the policy's most loaded queue with a whole not-started group at its tail), or nowhere."""
        if self.dispatch == "fifo":
            return _FIFO if self._fifo_ptr < len(self._fifo) else _NONE
        if not self.work_stealing or not may_steal(self._iso_n[j]):
            return _NONE
        nsamp = self.nsamp
        cands = []
        for v, other in enumerate(self.insts):
            start = len(other.queue) - nsamp
            # a partly admitted group is never split
            if v != j and start >= other.ptr and start >= 0 and other.head[start]:
                cands.append(v)
        v = steal_victim(self._qload, cands)
        return _NONE if v < 0 else v

    def _source_head(self, src: int) -> int:
        """First sequence of the group `src` would hand over (not moved yet)."""
        if src == _FIFO:
            return self._fifo[self._fifo_ptr] * self.nsamp
        return self.insts[src].queue[-self.nsamp]

    def _take_group(self, j: int, src: int) -> None:
        """Move the group `src` hands over to the end of instance j's (empty) queue."""
        nsamp, ins = self.nsamp, self.insts[j]
        if src == _FIFO:
            g = self._fifo[self._fifo_ptr]
            self._fifo_ptr += 1
            sids = list(range(g * nsamp, (g + 1) * nsamp))
        else:
            victim = self.insts[src]
            sids = victim.queue[-nsamp:]
            del victim.queue[-nsamp:]
            del victim.head[-nsamp:]
            g = sids[0] // nsamp
            self._qload[src] -= self._gload[g]
            self._qn[src] -= 1
            self.group_stolen[g] = True
            self.steals[j] += 1
        self._qload[j] += self._gload[g]
        self._qn[j] += 1
        ins.queue.extend(sids)
        ins.head.extend([True] + [False] * (nsamp - 1))
        self.group_instance[g] = j

    def _open_group(self, j: int, src: int, g: int, now: float, n: int, ptr: int) -> int:
        """Ask the gate for group g (own head, or from `src`); if admitted, take it and stamp its dispatch.

        Held: the instance waits head-of-line for `notify` or the gate's retry time (pushed now when the
        instance is idle: `_RETRY`, the caller returns at once). Under a bounded lag budget an instance with
        no group granted is held without asking the gate.
        """
        granting = self._granting
        if granting and self.granted[j] <= 0:
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
        if src != _OWN:
            self._take_group(j, src)
        self.group_dispatch[g] = now
        self.group_version[g] = self.version
        self._qload[j] -= self._gload[g]
        self._inload[j] += self._gload[g]
        self._qn[j] -= 1
        self._infl[j] += 1
        if self._isolated[g]:
            self._iso_n[j] += 1
        if granting:
            self.granted[j] -= 1
        return _ADMITTED

    # ------------------------------------------------------------------ lag budget dealing
    @property
    def _granting(self) -> bool:
        return self.budget is not None and not self._unbounded

    def _check_unbounded(self) -> None:
        """At the start: no dealing at all when the budget covers every group (the gate never binds: opening a
        group uses one unit of budget and one pending group alike), so an unbounded run admits as before."""
        if self.budget is None or self._unbounded:
            return
        pending = len(self._fifo) - self._fifo_ptr + sum(self._qn)
        if self.budget() >= pending:
            self._unbounded = True
            self.granted = [0] * len(self.insts)

    def _deal(self, t: float, skip: int = -1, wake: bool = True) -> None:
        """Deal the budget not granted yet one group at a time, as the runtime's `Dispatcher.fill` does: to the
        instance with work of its own, else a thief (stealing) or anyone (fifo), with the fewest groups in flight
        or granted, then index, below `group_capacity`. Wake the instances granted a group (not `skip`, which is
        at its step boundary and admits next), in the order of their first grant."""
        granted = self.granted
        left = int(self.budget()) - sum(granted)
        if left <= 0:
            return
        m, cap = len(self.insts), self.group_capacity
        fifo = self.dispatch == "fifo"
        load = [self._infl[k] + granted[k] for k in range(m)]
        pool = len(self._fifo) - self._fifo_ptr - sum(granted) if fifo else 0
        own = [0] * m if fifo else [max(0, self._qn[k] - granted[k]) for k in range(m)]

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
            if fifo:
                if pool <= 0:
                    break
                pool -= 1
            elif own[j] > 0:
                own[j] -= 1
            elif self.work_stealing:
                if not may_steal(self._iso_n[j]):
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
        if not wake:
            return
        for j in woken:
            if j != skip:
                self.insts[j].held = False
                self._wake(j, t)

    def _admit_and_schedule(self, j: int) -> None:
        ins = self.insts[j]
        if ins.clock < ins.paused_until and ins.n == 0:
            self._push_retry(j, ins.paused_until)
            return
        if self._admit(j):
            self._schedule_next_event(j)

    def _admit(self, j: int) -> bool:
        """Fill instance j's free slots at its step boundary: preempted sequences first, then its own queue in
        plan order, then groups from elsewhere (`_source`). False when it returned early on a gate retry."""
        ins = self.insts[j]
        now = ins.clock
        B, K = self.B, self.K
        bounded = K < INF
        reserve = self.kv_policy == "reserve"
        q, head = ins.queue, ins.head
        nq = len(q)
        pl, ll, epoch, admit_step = self._pl, self._ll, self.seq_epoch, self.seq_admit_step
        running, front = ins.running, ins.front
        push = heapq.heappush
        step, version, nsamp = ins.step, self.version, self.nsamp
        n, kv, prefill, ptr = ins.n, ins.kv, ins.prefill, ins.ptr
        seq_start, seq_version = self.seq_start, self.seq_version
        while n < B:
            if front:
                sid = front[-1]
                prog = self.seq_progress[sid]
                need = pl[sid] + prog
                if bounded and kv + n + need + 1 > K:
                    break
                front.pop()
                self.recompute[j] += prog
            else:
                src = _OWN if ptr < nq else self._source(j)
                if src == _NONE:
                    break
                sid = q[ptr] if src == _OWN else self._source_head(src)
                need = pl[sid]
                if bounded and (ins.reserved + need + ll[sid] > K if reserve else kv + n + need + 1 > K):
                    break
                if src != _OWN or head[ptr]:
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
            push(running, (step + ll[sid] - prog, sid, ep))
        ins.n, ins.kv, ins.prefill, ins.ptr = n, kv, prefill, ptr
        if kv > self.kv_peak[j]:
            self.kv_peak[j] = int(kv)
        return True

    def _schedule_next_event(self, j: int) -> None:
        """Push instance j's next event: the earliest finish, a KV overflow, or a pending gate retry."""
        ins = self.insts[j]
        n, kv, prefill, step, now = ins.n, ins.kv, ins.prefill, ins.step, ins.clock
        if n == 0:
            ins.event_time = INF
            ins.event_step = -1
            ins.token += 1
            return
        running, epoch = ins.running, self.seq_epoch
        while running and running[0][2] != epoch[running[0][1]]:
            heapq.heappop(running)
        ev = running[0][0]
        if self.K < INF and self.kv_policy != "reserve":
            # overflow when kv + n*d + n > K, i.e. at the first d with d > (K - kv - n) / n
            d_over = int(math.floor((self.K - kv - n) / n)) + 1
            ev = min(ev, step + max(d_over, 1))
        if ins.retry_at < INF:
            rel = ins.retry_at - now
            d = self.iv.steps_to_reach(n, kv, prefill, rel) if rel > 0 else 1
            ev = min(ev, step + max(d, 1))
            ins.retry_at = INF
            ins.held = False
        t = now + self.iv.interval(n, kv, ev - step, prefill) + ins.extra
        self._push(j, t, ev)


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
    cl = Cluster(orders, lengths, prompt_lens, spec, cost, gate=gate, kv_policy=kv_policy,
                 cost_scale=cost_scale, work_stealing=work_stealing, steal_load=steal_load, dispatch=dispatch,
                 isolated=isolated)
    cl.run()
    left = cl.unfinished_groups()
    if left:
        raise RuntimeError(f"{left} groups never finished (placed on no instance?)")
    return cl.trace()
