"""The simulated RL pipeline: instances, a streaming trainer, the max-lag bound and weight sync.

Why: planners are judged end to end (docs/design.md section 5). A plan that minimises the rollout makespan can
still starve a streaming trainer, so the simulator couples the instance model (engine.py) with the trainer in
one event loop and reports every metric and bound under the project's names.

Modes:
- "stream": ASP's asynchronous pipeline. Instances follow their plan queues. Admission control (AReaL's
  capacity rule, docs/design.md section 6): a group is dispatched (its first sample admitted) only while
  `dispatched - taken < (version + max_lag + 1 - updates_started) * M`, so it can still be trained by update
  `version + max_lag`. The trainer takes finished groups earliest-deadline first (dispatch version, then the
  plan's minibatch tag, then arrival), M per update (`alpha*tokens + overhead` seconds), then syncs weights
  (`sync_time`; instances pause unless `sync_pauses_rollout=False`) and bumps the version. With
  `stale_policy="wait"` an update starts only if every group still untrained can meet its deadline afterwards
  (EDF feasibility, M per update): the trainer waits for an old group rather than train newer ones, which
  guarantees lag <= max_lag for every trained sample with nothing dropped. `"drop"` never waits; the audit
  then drops (and counts) the samples whose lag would exceed the bound. `"regenerate"` (the runtime's default)
  never waits either: a ready group that this update could no longer train within the bound is sent back and
  generated again from scratch on the least-loaded instance (counted; its first generation stays in the busy
  time). Every trained sample is audited:
  lag = update index - the policy version at its first admission (the oldest that produced a token).
- "stock": MindSpeed-RL's synchronous iteration: every instance runs its whole share, the iteration waits for
  the slowest instance, then trains ceil(G/M) minibatches in completion order, then syncs once.
- Work stealing (`work_stealing`, default None = on for "stream" like the runtime's asp mode, off for "stock"
  and "single" like MindSpeed-RL): an instance whose own queue is empty takes not-started groups from the tail
  of the most loaded queue (load = predicted tokens from `problem.estimate` when present); counted in
  `rollout/steals`. Passing True for "stock" gives a rollout-only run with stealing (benchmarks).
- "single": "stock" on one big instance with all the devices: slots and KV budget times m, step cost divided
  by `single_scaling(m)` (the measured/assumed speed-up of an m-device instance over a 1-device one).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np

from mindspeed_asp.types import Assignment, InstanceSpec, PlanningProblem
from mindspeed_asp.metrics import generation_padding, lag_stats, skewness, tail_share
from mindspeed_asp.sim import metrics as mx
from mindspeed_asp.sim.engine import INF, Cluster, InstanceTrace
from mindspeed_asp.sim.train_time import TrainerModel, group_tokens

MODES = ("stream", "stock", "single")
STALE_POLICIES = ("wait", "drop", "regenerate")


@dataclass
class SimResult:
    """Everything one simulated run measured.

    `metrics` uses docs/design.md section 5 names; `bounds` the lower bounds; `above` "% above bound" for
    time/rollout (vs rollout/R_LB), time/iteration (vs the e2e bound of the mode) and steps (vs steps/LB).
    Per-minibatch arrays: `mb_ready` (all its groups finished), `mb_start`, `mb_finish` (update done),
    `mb_sync_end`, `mb_groups`, `mb_tokens`. `queue_t`/`queue_q` is the ready-queue occupancy step function.
    `lags` holds the lag of every trained sample. `trace` is the instance trace (Gantt data).
    """

    mode: str
    planner: str
    metrics: Dict[str, float]
    bounds: Dict[str, float]
    above: Dict[str, float]
    mb_ready: np.ndarray
    mb_start: np.ndarray
    mb_finish: np.ndarray
    mb_sync_end: np.ndarray
    mb_groups: np.ndarray
    mb_tokens: np.ndarray
    queue_t: np.ndarray
    queue_q: np.ndarray
    lags: np.ndarray
    trace: InstanceTrace
    params: Dict[str, float] = field(default_factory=dict)

    def summary(self) -> Dict[str, object]:
        """JSON-ready dict (no per-sample arrays)."""
        return {"mode": self.mode, "planner": self.planner, "metrics": dict(self.metrics),
                "bounds": dict(self.bounds), "percent_above_bound": dict(self.above),
                "params": dict(self.params)}


class _Trainer:
    """Streaming trainer state inside the event loop."""

    def __init__(self, trainer: TrainerModel, max_lag: int, stale_policy: str, sync_time: float,
                 pause: bool, cl: Cluster, G: int, tokens_per_sample: np.ndarray) -> None:
        self.t = trainer
        self.M = trainer.minibatch
        self.max_lag = max_lag
        self.stale_policy = stale_policy
        self.sync = sync_time
        self.pause = pause
        self.cl = cl
        self.G = G
        self.tok = tokens_per_sample  # [G, n]
        self.version = 0
        self.k = 0  # next update index (= trainer version)
        self.busy = False
        self.dispatched = 0
        self.finished = 0
        self.inflight = [0]  # dispatched, unfinished groups per dispatch version
        self.untrained = [0]  # dispatched, not yet taken by an update, per dispatch version
        self.ready_by_v = [0]  # finished, not yet taken, per dispatch version
        self.lo = 0  # lowest dispatch version that may still have untrained groups
        self.k_started = 0  # updates started so far
        self.ready: List[tuple] = []  # heap (dispatch version, plan tag, finish time, g)
        self.tags = None  # plan minibatch tag per group (-1 = untagged)
        self.events: List[tuple] = []
        self._seq = 0
        self.rec: Dict[str, list] = {k: [] for k in ("ready", "start", "finish", "sync_end", "groups", "tokens")}
        self.lags: List[np.ndarray] = []
        self.sample_tokens: List[np.ndarray] = []
        self.stale_dropped = 0
        self.regenerated = 0
        self.trained = 0

    # gate: admission control (AReaL's capacity rule, counted against the updates still to start)
    def gate(self, g: int, now: float) -> Optional[float]:
        """Dispatch only if the group can still be trained by update version + max_lag."""
        untrained = self.dispatched - self.trained
        if untrained < (self.version + self.max_lag + 1 - self.k_started) * self.M:
            self.dispatched += 1
            self.inflight[self.version] += 1
            self.untrained[self.version] += 1
            return None
        return INF

    def group_done(self, g: int, t: float) -> None:
        v = int(self.cl.group_version[g])
        self.inflight[v] -= 1
        self.finished += 1
        tag = int(self.tags[g]) if self.tags is not None and self.tags[g] >= 0 else self.G
        heapq.heappush(self.ready, (v, tag, t, g))
        self.ready_by_v[v] += 1
        self.try_start(t)

    def _first_untrained(self) -> int:
        # never past the current version: new dispatches happen at the current version
        while self.lo < self.version and self.untrained[self.lo] == 0:
            self.lo += 1
        return self.lo

    def _schedulable(self) -> bool:
        """Can every remaining group still meet its deadline (dispatch version + max_lag) if the M oldest ready
        groups train now?

        EDF feasibility with M groups per update: for each later update k', the untrained groups due by k'
        must fit into updates k+1..k'. Failing means an older group is still generating: wait for it. Only
        the dispatch versions present are visited (the due count changes only there).
        """
        k, eta, M = self.k, self.max_lag, self.M
        lo = self._first_untrained()
        need = min(M, len(self.ready))
        due = 0
        for v in range(lo, self.version + 1):
            take = min(self.ready_by_v[v], need)
            need -= take
            due += self.untrained[v] - take
            if due > (v + eta - k) * M:
                return False
        return True

    def _regenerate_stale(self, now: float) -> int:
        """Send back every ready group that this update could not train within the bound; returns how many.

        A group is stale when update k - (oldest version of its samples) > max_lag. It leaves the queue, stops
        counting as dispatched and is generated again from scratch (the runtime's "regenerate" policy).
        """
        k, eta, n = self.k, self.max_lag, self.cl.nsamp
        keep, stale = [], []
        while self.ready and self.ready[0][0] < k - eta:
            item = heapq.heappop(self.ready)
            g = item[3]
            oldest = int(self.cl.seq_version[g * n:(g + 1) * n].min())
            (stale if k - oldest > eta else keep).append(item)
        for item in keep:
            heapq.heappush(self.ready, item)
        for v, _, _, g in stale:
            self.ready_by_v[v] -= 1
            self.untrained[v] -= 1
            self.dispatched -= 1
            self.finished -= 1
            self.regenerated += 1
            self.cl.requeue(g, now)
        return len(stale)

    def try_start(self, now: float) -> None:
        if self.busy or not self.ready:
            return
        all_done = self.finished == self.G
        if len(self.ready) < self.M and not all_done:
            return
        if self.stale_policy == "wait" and not self._schedulable():
            return
        if self.stale_policy == "regenerate" and self._regenerate_stale(now):
            if len(self.ready) < self.M and not self.finished == self.G:
                return
            if not self.ready:
                return
        take = [heapq.heappop(self.ready) for _ in range(min(self.M, len(self.ready)))]
        for v, _, _, _ in take:
            self.untrained[v] -= 1
            self.ready_by_v[v] -= 1
        self.k_started += 1
        groups = np.array([g for _, _, _, g in take], dtype=np.int64)
        n = self.cl.nsamp
        sids = (groups[:, None] * n + np.arange(n)[None, :]).ravel()
        lag = self.k - self.cl.seq_version[sids]
        ok = lag <= self.max_lag
        if self.stale_policy == "drop":
            self.stale_dropped += int((~ok).sum())
            lag = lag[ok]
            toks = self.tok.ravel()[sids][ok]
        else:
            toks = self.tok.ravel()[sids]
        tokens = float(toks.sum())
        dur = self.t.train_time(tokens)
        self.busy = True
        self.rec["ready"].append(max(t for _, _, t, _ in take))
        self.rec["start"].append(now)
        self.rec["finish"].append(now + dur)
        self.rec["groups"].append(len(take))
        self.rec["tokens"].append(tokens)
        self.lags.append(lag)
        self.sample_tokens.append(toks)
        self.trained += len(take)
        self._push(now + dur, "trained")

    def _push(self, t: float, kind: str) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind))

    def peek(self) -> float:
        return self.events[0][0] if self.events else INF

    def handle(self) -> None:
        t, _, kind = heapq.heappop(self.events)
        if kind == "trained":
            if self.sync > 0:
                if self.pause:
                    self.cl.pause(t, self.sync)
                self._push(t + self.sync, "synced")
                return
        # synced (or no sync time): the new version is live everywhere
        self.rec["sync_end"].append(t)
        self.version += 1
        self.k += 1
        self.inflight.append(0)
        self.untrained.append(0)
        self.ready_by_v.append(0)
        self.cl.version = self.version
        self.busy = False
        self.cl.notify(t)
        self.try_start(t)


def _steal_load(problem: PlanningProblem) -> Optional[np.ndarray]:
    """Predicted tokens per group (the runtime dispatcher's steal load), or None without an estimate."""
    if problem.estimate is None:
        return None
    from mindspeed_asp.scheduler.fluid import group_moments

    return group_moments(problem).area


def _check_inputs(problem: PlanningProblem, assignment: Assignment, true_lengths: np.ndarray,
                  mode: str, max_lag: int, trainer: TrainerModel) -> np.ndarray:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if max_lag < 0:
        raise ValueError("max_lag must be >= 0")
    G = len(problem.prompts)
    L = np.asarray(true_lengths)
    if L.shape != (G, problem.prompts.n):
        raise ValueError(f"true_lengths shape {L.shape} != (groups, n) = ({G}, {problem.prompts.n})")
    if len(assignment.orders) != problem.instances:
        raise ValueError(f"assignment has {len(assignment.orders)} instance queues, problem has "
                         f"{problem.instances} instances")
    assignment.validate(G)
    if trainer.minibatch < 1:
        raise ValueError("trainer.minibatch must be >= 1")
    return L.astype(np.int64)


def simulate_pipeline(problem: PlanningProblem, assignment: Assignment, true_lengths: np.ndarray, *,
                      mode: str = "stream", max_lag: int = 1, trainer: TrainerModel, sync_time: float = 0.0,
                      single_scaling: Optional[Callable[[int], float]] = None, stale_policy: str = "wait",
                      sync_pauses_rollout: bool = True, kv_policy: str = "preempt",
                      devices_per_instance: int = 1, trainer_devices: int = 0,
                      with_bounds: bool = True, work_stealing: Optional[bool] = None) -> SimResult:
    """Simulate one window (iteration) of `problem` dispatched by `assignment`, with the true lengths.

    `trainer.minibatch` is M in groups. `sync_time` is one weight-sync round (seconds). `devices_per_instance`
    and `trainer_devices` only scale the throughput metrics (e2e_tps divides by instance devices, like
    MindSpeed-RL's; perf_throughput by all devices, like verl's). `with_bounds=False` skips the bounds (for
    planners that call this inside a search loop). `work_stealing` None means on for "stream", off otherwise.
    """
    L = _check_inputs(problem, assignment, true_lengths, mode, max_lag, trainer)
    if stale_policy not in STALE_POLICIES:
        raise ValueError(f"stale_policy must be one of {STALE_POLICIES}, got {stale_policy!r}")
    G, n = L.shape
    m = problem.instances
    P = np.asarray(problem.prompts.prompt_lens, dtype=np.int64)
    spec, orders, scale, m_eff = problem.spec, [np.asarray(o, dtype=np.int64) for o in assignment.orders], 1.0, m
    if mode == "single":
        if single_scaling is None:
            raise ValueError("mode='single' needs single_scaling(m) -> speed-up of one m-device instance")
        s = float(single_scaling(m))
        if not s > 0:
            raise ValueError(f"single_scaling({m}) must be > 0, got {s}")
        spec = InstanceSpec(slots=spec.slots * m, kv_budget=None if spec.kv_budget is None else spec.kv_budget * m)
        orders = [np.sort(np.concatenate(orders))]  # one engine, dataset order (FCFS)
        scale, m_eff = 1.0 / s, 1
    tok = L + P[:, None]  # prompt + response tokens per sample
    M = trainer.minibatch
    steal = (mode == "stream") if work_stealing is None else bool(work_stealing)
    steal = steal and mode != "single" and m > 1
    steal_kw = {"work_stealing": steal, "steal_load": _steal_load(problem) if steal else None}

    if mode == "stream":
        cl = Cluster(orders, L, P, spec, problem.cost, kv_policy=kv_policy, cost_scale=scale, **steal_kw)
        tr = _Trainer(trainer, max_lag, stale_policy, sync_time, sync_pauses_rollout, cl, G, tok)
        tr.tags = np.asarray(assignment.minibatch, dtype=np.int64) if assignment.minibatch is not None else None
        cl.gate = tr.gate
        cl.on_group_done = tr.group_done
        while True:
            ti, tt = cl.peek_time(), tr.peek()
            if ti == INF and tt == INF:
                break
            if tt <= ti:
                tr.handle()
            else:
                cl.step()
        if tr.trained != G:
            raise RuntimeError(f"stream simulation stalled: {tr.trained}/{G} groups trained, "
                               f"{cl.unfinished_groups()} unfinished (planner {assignment.planner!r})")
        rec = {k: np.asarray(v, dtype=np.float64) for k, v in tr.rec.items()}
        lags = np.concatenate(tr.lags) if tr.lags else np.zeros(0)
        sample_tokens, stale_dropped, regenerated = tr.sample_tokens, tr.stale_dropped, tr.regenerated
        trace = cl.trace()
        total_time = float(rec["sync_end"][-1])
        syncs = len(rec["sync_end"])
    else:
        cl = Cluster(orders, L, P, spec, problem.cost, kv_policy=kv_policy, cost_scale=scale, **steal_kw)
        cl.run()
        trace = cl.trace()
        R = trace.makespan
        by_finish = np.argsort(trace.group_finish, kind="stable")
        K = trainer.num_minibatches(G)
        rec = {k: np.zeros(K) for k in ("ready", "start", "finish", "sync_end", "groups", "tokens")}
        lag_parts, sample_tokens = [], []
        t = R
        for k in range(K):
            gs = by_finish[k * M:(k + 1) * M]
            toks = tok[gs].ravel()
            dur = trainer.train_time(float(toks.sum()))
            rec["ready"][k] = trace.group_finish[gs].max()
            rec["start"][k], rec["finish"][k] = t, t + dur
            rec["groups"][k], rec["tokens"][k] = len(gs), toks.sum()
            lag_parts.append(k - trace.seq_version[(gs[:, None] * n + np.arange(n)).ravel()])
            sample_tokens.append(toks)
            t += dur
        rec["sync_end"][:] = rec["finish"]
        rec["sync_end"][-1] = t + sync_time
        total_time = t + sync_time
        lags = np.concatenate(lag_parts)
        stale_dropped, regenerated, syncs = 0, 0, 1

    # ------------------------------------------------------------------ metrics
    rollout_end = trace.makespan
    total_L = float(L.sum())
    all_tokens = float(tok.sum())
    devices = m * devices_per_instance
    met: Dict[str, float] = {}
    met["bubble/padding"] = generation_padding(total_L, spec.slots, trace.steps)
    met.update(mx.training_padding(sample_tokens, trainer.micro_batch, trainer.dp))
    met["bubble/skewness"] = skewness(trace.busy)
    met["bubble/tail_share"] = tail_share(trace.seq_finish)
    busy_end = rec["sync_end"] if mode == "stream" else rec["finish"]
    if mode != "stream":
        busy_end = busy_end.copy()
        busy_end[-1] = total_time
    met.update(mx.sorting_metrics(trace.group_finish, rec["ready"], rec["start"], busy_end, rec["groups"], M,
                                  rollout_end, total_time))
    met.update(lag_stats(lags, max_lag))
    met["lag/stale_dropped"] = float(stale_dropped)
    met["lag/regenerated_groups"] = float(regenerated)
    met["throughput/e2e_tps"] = all_tokens / (devices * total_time) if total_time > 0 else 0.0
    met["throughput/perf_throughput"] = all_tokens / ((devices + trainer_devices) * total_time) \
        if total_time > 0 else 0.0
    met["throughput/rollout_tps"] = total_L / rollout_end if rollout_end > 0 else 0.0
    met["time/iteration"] = total_time
    met["time/rollout"] = rollout_end
    met["time/train"] = float(np.sum(rec["finish"] - rec["start"]))
    met["time/weight_sync"] = syncs * sync_time
    met["time/first_minibatch"] = float(rec["start"][0]) if len(rec["start"]) else 0.0
    met["rollout/makespan_busy"] = float(trace.busy.max()) if len(trace.busy) else 0.0
    met["rollout/steps"] = float(trace.steps.sum())
    met["rollout/preemptions"] = float(trace.preemptions.sum())
    met["rollout/steals"] = float(trace.steals.sum()) if trace.steals is not None else 0.0

    bounds: Dict[str, float] = {}
    above: Dict[str, float] = {}
    if with_bounds:
        bounds = mx.lower_bounds(L, P, m_eff, spec, problem.cost, trainer=trainer, sync_time=sync_time,
                                 orders=orders, scale=scale, syncs=1)
        R_LB = bounds["rollout/R_LB"]
        met["bubble/skew_gap"] = met["rollout/makespan_busy"] / R_LB - 1.0 if R_LB > 0 else float("nan")
        above["time/rollout"] = mx.percent_above(rollout_end, R_LB)
        above["rollout/makespan_busy"] = mx.percent_above(met["rollout/makespan_busy"], R_LB)
        e2e_key = "e2e/stream_LB" if mode == "stream" else "e2e/barrier_LB"
        above["time/iteration"] = mx.percent_above(total_time, bounds[e2e_key])
        above["rollout/steps"] = mx.percent_above(met["rollout/steps"], bounds["steps/LB"])
    else:
        met["bubble/skew_gap"] = float("nan")
    qt, qq = mx.queue_series(trace.group_finish, rec["start"], rec["groups"])
    return SimResult(mode=mode, planner=assignment.planner, metrics=met, bounds=bounds, above=above,
                     mb_ready=rec["ready"], mb_start=rec["start"], mb_finish=rec["finish"],
                     mb_sync_end=rec["sync_end"], mb_groups=rec["groups"].astype(np.int64),
                     mb_tokens=rec["tokens"], queue_t=qt, queue_q=qq, lags=np.asarray(lags), trace=trace,
                     params={"max_lag": max_lag, "minibatch": M, "alpha": trainer.alpha,
                             "overhead": trainer.overhead, "sync_time": sync_time, "instances": m,
                             "slots": problem.spec.slots, "single_scale": 1.0 / scale,
                             "work_stealing": float(steal)})
