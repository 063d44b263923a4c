"""The simulated RL pipeline: instances, a streaming trainer, the max-lag bound and weight sync.

Why: planners are judged end to end (docs/design.md#metrics). A plan that minimises the rollout makespan can
still starve a streaming trainer, so the simulator couples the instance model (engine.py) with the trainer in
one event loop and reports every metric and bound under the project's names.

Modes:
- "stream": the runtime's asynchronous modes under the runtime's policy (`mindspeed_asp/core/policy.py`, the
  same `LagPolicy` the runtime's dispatcher and sample queue drive; docs/design.md#shared-policy).
  Instances follow their plan queues (asp; `dispatch="fifo"`: one queue in dataset order, the runtime's
  async mode). A group is dispatched (its first sample admitted) only while the policy admits it
  (`accepted < (version + max_lag + 1) * M`). An update starts when M groups are ready and the policy's
  waiting rule allows it (no group still generating would miss its deadline, dispatch version + max_lag);
  it takes the M first in the policy's order (oldest dispatch version, then the plan's minibatch tag when
  the assignment has tags, then arrival), takes `alpha*tokens + overhead` seconds, then syncs weights
  (`sync_time`; instances pause unless `sync_pauses_rollout=False`) and bumps the version. Under these rules
  no group goes stale; the audit still checks every ready group, and a stale one would be regenerated
  (`stale_policy="regenerate"`, the runtime's default) or dropped (`"drop"`) as the runtime does. Lag of a
  trained sample = update index - the policy version at its first admission (the oldest that produced a
  token).
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
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np

from mindspeed_asp.core.policy import (DEFAULT_STALE_POLICY, STALE_POLICIES, LagPolicy, check_stale_policy, is_stale,
                                  train_key)
from mindspeed_asp.core.problem import Assignment, InstanceSpec, PlanningProblem
from mindspeed_asp.core.fluid import group_moments
from mindspeed_asp.core.metrics import (DeviceCount, colocated_devices, e2e_tps, generation_padding, lag_stats,
                                   skewness, split_devices, tail_share)
from mindspeed_asp.sim import bounds as mx
from mindspeed_asp.sim.engine import DISPATCH, INF, InstanceSim
from mindspeed_asp.sim.trace import InstanceTrace
from mindspeed_asp.sim.train_time import TrainerModel

MODES = ("stream", "stock", "single")
__all__ = ["MODES", "STALE_POLICIES", "SimResult", "run_devices", "simulate_pipeline"]


@dataclass
class SimResult:
    """Everything one simulated run measured.

    `metrics` uses docs/design.md#metrics names; `bounds` the lower bounds; `above` "% above bound" for
    time/rollout (vs rollout/R_LB), time/iteration (vs the e2e bound of the mode) and steps (vs steps/LB).
    Per-minibatch arrays: `mb_ready` (all its groups finished), `mb_start`, `mb_finish` (update done),
    `mb_sync_end`, `mb_groups`, `mb_tokens`. `queue_t`/`queue_q` is the ready-queue occupancy step function.
    `lags` holds the lag of every trained sample. `trace` is the instance trace (Gantt data).
    `mb_group_ids` lists the trained groups in training order (split by `mb_groups`). `devices` is what
    `throughput/e2e_tps` divided by (`mindspeed_asp.core.metrics.DeviceCount`).
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
    mb_group_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    devices: Optional[DeviceCount] = None

    def summary(self) -> Dict[str, object]:
        """JSON-ready dict (no per-sample arrays)."""
        out: Dict[str, object] = {"mode": self.mode, "planner": self.planner, "metrics": dict(self.metrics),
                                  "bounds": dict(self.bounds), "percent_above_bound": dict(self.above),
                                  "params": dict(self.params)}
        if self.devices is not None:
            out["devices"] = self.devices.to_dict()
        return out


class _Trainer:
    """Streaming trainer state inside the event loop; every decision is the shared `LagPolicy`'s.

    Events to the policy: dispatched (gate), finished (`group_done`), trained and stale (`try_start`).
    """

    def __init__(self, trainer: TrainerModel, max_lag: int, stale_policy: str, sync_time: float,
                 pause: bool, cl: InstanceSim, G: int, tokens_per_sample: np.ndarray,
                 tags: Optional[np.ndarray]) -> None:
        self.t = trainer
        self.M = trainer.minibatch
        self.max_lag = max_lag
        self.lag = LagPolicy(max_lag, self.M)
        self.stale_policy = stale_policy
        self.sync = sync_time
        self.pause = pause
        self.cl = cl
        self.G = G
        self.tok = tokens_per_sample  # [G, n]
        self.tags = None if tags is None else tags.tolist()  # plan minibatch tag per group (-1 = untagged)
        self.order = "oldest" if tags is None else "plan_tag"
        self.version = 0  # = the index of the next update once the previous one is synced
        self.busy = False
        self.finished = 0  # finished groups not sent back (trained, ready or dropped)
        self.arrival = 0
        self.ready: List[tuple] = []  # heap (policy train key, g)
        self.events: List[tuple] = []
        self._seq = 0
        self.rec: Dict[str, list] = {k: [] for k in ("ready", "start", "finish", "sync_end", "groups", "tokens")}
        self.lags: List[np.ndarray] = []
        self.sample_tokens: List[np.ndarray] = []
        self.group_ids: List[int] = []
        self.dropped_groups = 0
        self.regenerated = 0
        self.trained = 0

    def gate(self, g: int, now: float) -> Optional[float]:
        """Dispatch iff the policy admits one more group at the current version; else wait for `notify`."""
        if self.lag.admits(self.version):
            self.lag.on_dispatched(self.version)
            return None
        return INF

    def group_done(self, g: int, t: float) -> None:
        v = int(self.cl.rec.group_version[g])
        self.lag.on_finished(v)
        self.finished += 1
        tag = None if self.tags is None else self.tags[g]
        heapq.heappush(self.ready, (train_key(v, tag, self.arrival, self.order), g))
        self.arrival += 1
        self.try_start(t)

    def _remove_stale(self, now: float) -> int:
        """The audit: remove every ready group this update could no longer train within the bound (regenerate
        or drop it, as the runtime's queue does); returns how many. Never fires under the policy's rules."""
        k, eta, ready = self.version, self.max_lag, self.ready
        removed = 0
        while ready and is_stale(k, ready[0][0][0], eta):
            key, g = heapq.heappop(ready)
            self.lag.on_stale(key[0])
            removed += 1
            if self.stale_policy == "drop":
                self.dropped_groups += 1
            else:
                self.finished -= 1
                self.regenerated += 1
                self.cl.requeue(g, now)
        return removed

    def try_start(self, now: float) -> None:
        if self.busy or not self.ready:
            return
        all_done = self.finished == self.G
        take = self.M if len(self.ready) >= self.M else (len(self.ready) if all_done else 0)
        if take == 0 or self.lag.must_wait(self.version, take):
            return
        if self._remove_stale(now):
            return self.try_start(now)
        items = [heapq.heappop(self.ready) for _ in range(take)]
        for key, _ in items:
            self.lag.on_trained(key[0])
        groups = np.array([g for _, g in items], dtype=np.int64)
        n = self.cl.nsamp
        sids = (groups[:, None] * n + np.arange(n)[None, :]).ravel()
        lag = self.version - self.cl.rec.seq_version[sids]
        toks = self.tok.ravel()[sids]
        tokens = float(toks.sum())
        dur = self.t.train_time(tokens)
        self.busy = True
        self.rec["ready"].append(float(self.cl.rec.group_finish[groups].max()))
        self.rec["start"].append(now)
        self.rec["finish"].append(now + dur)
        self.rec["groups"].append(len(items))
        self.rec["tokens"].append(tokens)
        self.lags.append(lag)
        self.sample_tokens.append(toks)
        self.group_ids.extend(groups.tolist())
        self.trained += len(items)
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
        self.cl.version = self.version
        self.busy = False
        self.cl.notify(t)
        self.try_start(t)


@dataclass
class _Run:
    """What one simulated run produced, before the metrics (per-minibatch records as arrays)."""

    trace: InstanceTrace
    rec: Dict[str, np.ndarray]
    lags: np.ndarray
    sample_tokens: List[np.ndarray]
    group_ids: np.ndarray
    stale_dropped: int  # samples
    regenerated: int  # groups
    total_time: float
    syncs: int


def _steal_load(problem: PlanningProblem) -> Optional[np.ndarray]:
    """Predicted tokens per group (the runtime dispatcher's steal load), or None without an estimate."""
    if problem.estimate is None:
        return None
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
                      single_scaling: Optional[Callable[[int], float]] = None,
                      stale_policy: str = DEFAULT_STALE_POLICY, sync_pauses_rollout: bool = True,
                      kv_policy: str = "preempt", devices_per_instance: int = 1,
                      trainer_devices: Optional[int] = None,
                      with_bounds: bool = True, work_stealing: Optional[bool] = None,
                      dispatch: str = "plan", group_capacity: Optional[int] = None) -> SimResult:
    """Simulate one window (iteration) of `problem` dispatched by `assignment`, with the true lengths.

    `trainer.minibatch` is M in groups. `sync_time` is one weight-sync round (seconds). `devices_per_instance`
    and `trainer_devices` only set the devices `throughput/e2e_tps` divides by (`run_devices`;
    docs/design.md#e2e_tps). `with_bounds=False` skips the bounds (for
    planners that call this inside a search loop). `work_stealing` None means on for "stream", off otherwise.
    `dispatch="fifo"` hands groups out in dataset order from one queue (the runtime's async mode); a shared
    plan (`assignment.shared`) is handed out from one queue in its own order (`dispatch="shared"`).
    `group_capacity` (stream mode) is the most groups one instance holds in flight when the lag budget is dealt
    out; None means the runtime driver's `ceil(slots / n) + 1`.
    """
    L = _check_inputs(problem, assignment, true_lengths, mode, max_lag, trainer)
    check_stale_policy(stale_policy)
    if dispatch not in DISPATCH:
        raise ValueError(f"dispatch must be one of {DISPATCH}, got {dispatch!r}")
    spec, orders, scale, m_eff = _instances(problem, assignment, mode, single_scaling)
    # a shared plan: the plan's order from one queue, least-loaded (no stealing: nothing is pinned)
    queue_kind = "shared" if dispatch == "plan" and assignment.shared and mode != "single" else dispatch
    steal = (mode == "stream") if work_stealing is None else bool(work_stealing)
    steal = steal and mode != "single" and problem.instances > 1 and queue_kind == "plan"
    P = np.asarray(problem.prompts.prompt_lens, dtype=np.int64)
    cl = InstanceSim(orders, L, P, spec, problem.cost, kv_policy=kv_policy, cost_scale=scale, work_stealing=steal,
                     steal_load=_steal_load(problem) if steal else None, dispatch=queue_kind,
                     isolated=assignment.isolated if steal else None)
    tok = L + P[:, None]  # prompt + response tokens per sample
    if mode == "stream":
        run = _run_stream(cl, assignment, trainer, tok, max_lag, stale_policy, sync_time, sync_pauses_rollout,
                          group_capacity)
    else:
        run = _run_barrier(cl, trainer, tok, sync_time)
    devices = run_devices(mode, problem.instances, devices_per_instance, trainer_devices)
    met = _metrics(run, L, tok, spec, trainer, mode, max_lag, sync_time, devices)
    bounds: Dict[str, float] = {}
    above: Dict[str, float] = {}
    if with_bounds:
        bounds, above = _bounds(run, met, L, P, problem, spec, orders, scale, m_eff, trainer, sync_time, mode)
    else:
        met["bubble/skew_gap"] = float("nan")
    qt, qq = mx.queue_series(run.trace.group_finish, run.rec["start"], run.rec["groups"])
    rec = run.rec
    return SimResult(mode=mode, planner=assignment.planner, metrics=met, bounds=bounds, above=above,
                     mb_ready=rec["ready"], mb_start=rec["start"], mb_finish=rec["finish"],
                     mb_sync_end=rec["sync_end"], mb_groups=rec["groups"].astype(np.int64),
                     mb_tokens=rec["tokens"], queue_t=qt, queue_q=qq, lags=np.asarray(run.lags), trace=run.trace,
                     params={"max_lag": max_lag, "minibatch": trainer.minibatch, "alpha": trainer.alpha,
                             "overhead": trainer.overhead, "sync_time": sync_time, "instances": problem.instances,
                             "slots": problem.spec.slots, "single_scale": 1.0 / scale,
                             "work_stealing": float(steal), "devices": devices.total},
                     mb_group_ids=run.group_ids, devices=devices)


def run_devices(mode: str, instances: int, devices_per_instance: int = 1,
                trainer_devices: Optional[int] = None) -> DeviceCount:
    """The devices a simulated run uses (the e2e_tps denominator).

    "stream": the trainer trains while the instances generate, so it has devices of its own: a split of
    `instances * devices_per_instance` rollout devices plus `trainer_devices` (None = `devices_per_instance`,
    one instance's worth, the least that holds the model the instances serve). "stock"/"single": the barrier
    trains after the rollout on the same devices, so `trainer_devices=None` counts them once (colocated, as
    stock MindSpeed-RL); an explicit count makes it a barrier beside a separate trainer (the CPU runtime's
    stock mode)."""
    if mode == "stream":
        return split_devices(instances, devices_per_instance,
                             devices_per_instance if trainer_devices is None else trainer_devices)
    if trainer_devices is None:
        return colocated_devices(instances * devices_per_instance)
    return split_devices(instances, devices_per_instance, trainer_devices)


def _instances(problem: PlanningProblem, assignment: Assignment, mode: str,
               single_scaling: Optional[Callable[[int], float]]):
    """(spec, orders, cost scale, instances) of the simulated cluster: the problem's, or for "single" one big
    instance with every device (slots and KV times m, step cost / single_scaling(m), dataset order)."""
    m = problem.instances
    spec, orders = problem.spec, [np.asarray(o, dtype=np.int64) for o in assignment.orders]
    if mode != "single":
        return spec, orders, 1.0, m
    if single_scaling is None:
        raise ValueError("mode='single' needs single_scaling(m) -> speed-up of one m-device instance")
    s = float(single_scaling(m))
    if not s > 0:
        raise ValueError(f"single_scaling({m}) must be > 0, got {s}")
    spec = InstanceSpec(slots=spec.slots * m, kv_budget=None if spec.kv_budget is None else spec.kv_budget * m)
    return spec, [np.sort(np.concatenate(orders))], 1.0 / s, 1


def _run_stream(cl: InstanceSim, assignment: Assignment, trainer: TrainerModel, tok: np.ndarray, max_lag: int,
                stale_policy: str, sync_time: float, sync_pauses_rollout: bool,
                group_capacity: Optional[int] = None) -> _Run:
    """The instances and the streaming trainer in one event loop (trainer events first on ties)."""
    G = cl.G
    tags = np.asarray(assignment.minibatch, dtype=np.int64) if assignment.minibatch is not None else None
    tr = _Trainer(trainer, max_lag, stale_policy, sync_time, sync_pauses_rollout, cl, G, tok, tags)
    cl.gate = tr.gate
    # the budget is dealt out as the runtime's dispatcher does, with its capacity of groups in flight per
    # instance (runtime/driver.py: ceil(slots / n) + 1)
    if group_capacity is not None and int(group_capacity) < 1:
        raise ValueError(f"group_capacity must be >= 1, got {group_capacity}")
    cl.dispatcher.budget = lambda: tr.lag.budget(tr.version)
    cl.dispatcher.group_capacity = (max(1, math.ceil(cl.B / cl.nsamp)) + 1 if group_capacity is None
                                    else int(group_capacity))
    cl.on_group_done = tr.group_done
    while True:
        ti, tt = cl.peek_time(), tr.peek()
        if ti == INF and tt == INF:
            break
        if tt <= ti:
            tr.handle()
        else:
            cl.step()
    if tr.trained + tr.dropped_groups != G:
        raise RuntimeError(f"stream simulation stalled: {tr.trained}/{G} groups trained, "
                           f"{cl.unfinished_groups()} unfinished (planner {assignment.planner!r})")
    rec = {k: np.asarray(v, dtype=np.float64) for k, v in tr.rec.items()}
    return _Run(trace=cl.trace(), rec=rec, lags=np.concatenate(tr.lags) if tr.lags else np.zeros(0),
                sample_tokens=tr.sample_tokens, group_ids=np.asarray(tr.group_ids, dtype=np.int64),
                stale_dropped=tr.dropped_groups * cl.nsamp, regenerated=tr.regenerated,
                total_time=float(rec["sync_end"][-1]), syncs=len(rec["sync_end"]))


def _run_barrier(cl: InstanceSim, trainer: TrainerModel, tok: np.ndarray, sync_time: float) -> _Run:
    """MindSpeed-RL's iteration: the whole window rolls out, then ceil(G/M) minibatches train in the policy's
    order (a single version, so arrival = completion order), then one weight sync."""
    cl.run()
    trace = cl.trace()
    G, n, M = cl.G, cl.nsamp, trainer.minibatch
    arrival = np.empty(G, dtype=np.int64)
    arrival[np.argsort(trace.group_finish, kind="stable")] = np.arange(G)
    arr = arrival.tolist()
    by_finish = np.array(sorted(range(G), key=lambda g: train_key(0, None, arr[g], "oldest")), dtype=np.int64)
    K = trainer.num_minibatches(G)
    rec = {k: np.zeros(K) for k in ("ready", "start", "finish", "sync_end", "groups", "tokens")}
    lag_parts, sample_tokens = [], []
    t = trace.makespan
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
    return _Run(trace=trace, rec=rec, lags=np.concatenate(lag_parts), sample_tokens=sample_tokens,
                group_ids=by_finish, stale_dropped=0, regenerated=0, total_time=t + sync_time, syncs=1)


def _metrics(run: _Run, L: np.ndarray, tok: np.ndarray, spec: InstanceSpec, trainer: TrainerModel, mode: str,
             max_lag: int, sync_time: float, devices: DeviceCount) -> Dict[str, float]:
    """Every metric under its docs/design.md#metrics name."""
    trace, rec, total_time = run.trace, run.rec, run.total_time
    rollout_end = trace.makespan
    total_L = float(L.sum())
    all_tokens = float(tok.sum())
    met: Dict[str, float] = {}
    met["bubble/padding"] = generation_padding(total_L, spec.slots, trace.steps)
    met.update(mx.training_padding(run.sample_tokens, trainer.micro_batch, trainer.dp))
    met["bubble/skewness"] = skewness(trace.busy)
    met["bubble/tail_share"] = tail_share(trace.seq_finish)
    busy_end = rec["sync_end"] if mode == "stream" else rec["finish"]
    if mode != "stream":
        busy_end = busy_end.copy()
        busy_end[-1] = total_time
    met.update(mx.sorting_metrics(trace.group_finish, rec["ready"], rec["start"], busy_end, rec["groups"],
                                  trainer.minibatch, rollout_end, total_time))
    met.update(lag_stats(run.lags, max_lag))
    met["lag/stale_dropped"] = float(run.stale_dropped)
    met["lag/regenerated_groups"] = float(run.regenerated)
    met["throughput/e2e_tps"] = e2e_tps(all_tokens, total_time, devices)
    met["throughput/rollout_tps"] = total_L / rollout_end if rollout_end > 0 else 0.0
    met["time/iteration"] = total_time
    met["time/rollout"] = rollout_end
    met["time/train"] = float(np.sum(rec["finish"] - rec["start"]))
    met["time/weight_sync"] = run.syncs * sync_time
    met["time/first_minibatch"] = float(rec["start"][0]) if len(rec["start"]) else 0.0
    met["rollout/makespan_busy"] = float(trace.busy.max()) if len(trace.busy) else 0.0
    met["rollout/steps"] = float(trace.steps.sum())
    met["rollout/preemptions"] = float(trace.preemptions.sum())
    met["rollout/steals"] = float(trace.steals.sum()) if trace.steals is not None else 0.0
    return met


def _bounds(run: _Run, met: Dict[str, float], L: np.ndarray, P: np.ndarray, problem: PlanningProblem,
            spec: InstanceSpec, orders, scale: float, m_eff: int, trainer: TrainerModel, sync_time: float,
            mode: str):
    """Lower bounds and "% above bound" (also sets `bubble/skew_gap` in `met`)."""
    bounds = mx.lower_bounds(L, P, m_eff, spec, problem.cost, trainer=trainer, sync_time=sync_time,
                             orders=orders, scale=scale, syncs=1)
    R_LB = bounds["rollout/R_LB"]
    met["bubble/skew_gap"] = met["rollout/makespan_busy"] / R_LB - 1.0 if R_LB > 0 else float("nan")
    e2e_key = "e2e/stream_LB" if mode == "stream" else "e2e/barrier_LB"
    above = {"time/rollout": mx.percent_above(run.trace.makespan, R_LB),
             "rollout/makespan_busy": mx.percent_above(met["rollout/makespan_busy"], R_LB),
             "time/iteration": mx.percent_above(run.total_time, bounds[e2e_key]),
             "rollout/steps": mx.percent_above(met["rollout/steps"], bounds["steps/LB"])}
    return bounds, above
