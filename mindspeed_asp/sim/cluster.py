"""The cluster model: N devices, colocated stock vs a rollout/trainer split, at steady state.

Why: the question before moving a run from stock MindSpeed-RL to ASP is "on my N devices, how many should
generate, how many train, at which max_lag, and how much faster than stock?". `simulate_pipeline` models the
instances, the streaming trainer and the lag bound of one window; this module adds what the comparison needs
around it (docs/simulator.md, "Cluster model"):

- a device count and split: rollout instances x TP per instance + trainer devices, or colocated (every device
  generates as N/TP instances, then every device trains);
- a trainer time model tied to devices and counting the extra forward passes (reference, old log-prob):
  `update = tokens * t_tok * (1 + extra_passes * fwd_fraction) / (devices * efficiency) + overhead`;
- the weight sync of a split (bytes / bandwidth, instances paused) and the colocated switch (reshard the
  weights to the inference layout and back, offload and onload optimizer and gradient state);
- several consecutive windows, so streaming modes reach a steady state: the throughput is measured over the
  middle windows, fill (up to the end of the first window's updates) and drain (after the last middle window)
  are reported apart;
- one throughput definition, MindSpeed-RL's e2e_tps: (prompt + response tokens) / (every device the run uses
  x seconds): trainer + rollout devices for a split, all N once for colocated stock.

Planning stays above the simulator (docs/design.md#layering): callers pass `plan(problem) -> Assignment`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from mindspeed_asp.errors import InputError
from mindspeed_asp.core.metrics import DeviceCount, colocated_devices, e2e_tps, rho_stock, split_devices
from mindspeed_asp.sim.bounds import lower_bounds
from mindspeed_asp.sim.pipeline import simulate_pipeline
from mindspeed_asp.sim.train_time import TrainerModel
from mindspeed_asp.core.problem import Assignment, CostModel, InstanceSpec, LengthEstimate, PlanningProblem, PromptSet

Plan = Callable[[PlanningProblem], Assignment]
#: colocated = MindSpeed-RL's stock (all devices generate, then all train); the split modes:
#: stock_split = the synchronous barrier on the rollout devices with a separate trainer (the runtime's stock),
#: async = least-loaded FIFO dispatch without a plan, asp = the ASP plan with work stealing.
MODES = ("colocated", "stock_split", "async", "asp")
STREAM_MODES = ("async", "asp")


@dataclass(frozen=True)
class TrainerCost:
    """Seconds of one update over `tokens` on `devices` devices.

    `sec_per_token` is one device's forward+backward time per token (1 / training tokens/s per device);
    `extra_passes` forward passes per token (reference model, old log-prob) each cost `fwd_fraction` of a
    forward+backward (2N of 6N FLOPs); `efficiency` is the share of linear scaling kept; `overhead_s` per
    update (optimizer step, launch)."""

    sec_per_token: float
    extra_passes: float = 2.0
    fwd_fraction: float = 1.0 / 3.0
    efficiency: float = 1.0
    overhead_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.sec_per_token >= 0 or self.extra_passes < 0 or not 0 < self.efficiency <= 1 \
                or self.overhead_s < 0 or self.fwd_fraction < 0:
            raise InputError("trainer cost: sec_per_token, extra_passes, overhead >= 0 and efficiency in (0, 1]",
                             key="trainer")

    def alpha(self, devices: int) -> float:
        """Seconds per token of one update on `devices` devices."""
        if devices < 1:
            raise InputError(f"a trainer needs >= 1 device, got {devices}", key="trainer devices")
        return self.sec_per_token * (1.0 + self.extra_passes * self.fwd_fraction) / (devices * self.efficiency)

    def model(self, devices: int, minibatch: int) -> TrainerModel:
        return TrainerModel(alpha=self.alpha(devices), overhead=self.overhead_s, minibatch=minibatch)


@dataclass(frozen=True)
class ClusterModel:
    """Everything but the split: decode cost per TP, KV budgets, slots, trainer, sync and switch times.

    `cost(tp)` is the decode step cost of one instance of tp devices; `kv_split(tp)` / `kv_colocated(tp)`
    its KV budget in tokens when it owns the devices / shares them with the trainer's state (None =
    unbounded). `sync_s` is one weight-sync round of a split (instances pause); `switch_s(devices)` the
    colocated phase switch per iteration (reshard + offload/onload, weight update included)."""

    cost: Callable[[int], CostModel]
    kv_split: Callable[[int], Optional[int]]
    kv_colocated: Callable[[int], Optional[int]]
    slots: int
    trainer: TrainerCost
    sync_s: float
    switch_s: Callable[[int], float]
    name: str = ""
    assumptions: Dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Split:
    """N devices as rollout instances x TP (+ trainer devices); colocated when `rollout_devices` is None."""

    devices: int
    tp: int
    rollout_devices: Optional[int] = None

    def __post_init__(self) -> None:
        if self.devices < 1 or self.tp < 1:
            raise InputError(f"devices ({self.devices}) and TP ({self.tp}) must be >= 1", key="--devices")
        r = self.devices if self.rollout_devices is None else self.rollout_devices
        if r % self.tp or r < self.tp:
            raise InputError(f"{r} rollout devices are not a positive multiple of TP {self.tp}", key="--tp")
        if self.rollout_devices is not None and not 0 < self.rollout_devices < self.devices:
            raise InputError(f"a split needs 0 < rollout devices ({self.rollout_devices}) < devices "
                             f"({self.devices})", key="--devices")

    @property
    def colocated(self) -> bool:
        return self.rollout_devices is None

    @property
    def instances(self) -> int:
        return (self.devices if self.colocated else int(self.rollout_devices)) // self.tp

    @property
    def trainer_devices(self) -> int:
        return self.devices if self.colocated else self.devices - int(self.rollout_devices)

    def device_count(self) -> DeviceCount:
        """The project's e2e_tps denominator (mindspeed_asp/core/metrics.py): all N devices either way."""
        if self.colocated:
            return colocated_devices(self.devices)
        return split_devices(self.instances, self.tp, self.trainer_devices)


@dataclass
class Windows:
    """K consecutive windows (iterations) of `window_groups` groups each, in dataset order."""

    prompts: PromptSet
    truth: np.ndarray  # int64 [K*Gw, n]
    estimate: LengthEstimate
    window_groups: int
    minibatch: int
    max_new_tokens: int

    def __post_init__(self) -> None:
        G = len(self.prompts)
        if self.minibatch < 1 or self.window_groups < 1 or self.window_groups % self.minibatch:
            raise InputError(f"window of {self.window_groups} groups is not a multiple of the minibatch "
                             f"({self.minibatch} groups)", key="--window-groups")
        if G < self.window_groups:
            raise InputError(f"the workload has {G} groups, fewer than one window of {self.window_groups}",
                             key="--workload")

    @property
    def count(self) -> int:
        return len(self.prompts) // self.window_groups

    def window(self, w: int) -> "Windows":
        idx = np.arange(w * self.window_groups, (w + 1) * self.window_groups)
        return self.take(idx)

    def take(self, idx: np.ndarray) -> "Windows":
        return Windows(prompts=self.prompts.subset(idx), truth=self.truth[idx], estimate=self.estimate.subset(idx),
                       window_groups=self.window_groups, minibatch=self.minibatch,
                       max_new_tokens=self.max_new_tokens)

    def tokens(self) -> float:
        """prompt + response tokens of every sample (what e2e_tps counts)."""
        return float(self.truth.sum() + self.truth.shape[1] * np.asarray(self.prompts.prompt_lens).sum())


@dataclass
class ClusterResult:
    """One simulated configuration: steady-state throughput and where the time went."""

    mode: str
    split: Split
    max_lag: int
    e2e_tps: float  # steady state: tokens / (all devices x seconds)
    window_s: float  # steady-state seconds per window (iteration)
    fill_s: float
    drain_s: float
    total_s: float
    windows: int
    steady_windows: int
    rollout_s: float  # mean per window: time the instances generate (colocated/stock: rollout phase)
    train_s: float  # mean per window: update time
    sync_s: float  # mean per window: weight sync / colocated switch
    lag_max: float
    lag_mean: float
    steals: float
    instance_idle: float  # share of instance-time not generating over the whole run
    planner: str = ""
    rho_stock: float = float("nan")  # barrier modes: train time / rollout time of a window (metrics.rho_stock)

    def row(self) -> Dict[str, object]:
        s = self.split
        return {"mode": self.mode, "devices": s.devices, "tp": s.tp, "rollout_devices": s.devices - s.trainer_devices
                if not s.colocated else s.devices, "trainer_devices": s.trainer_devices, "instances": s.instances,
                "colocated": s.colocated, "max_lag": self.max_lag, "e2e_tps": self.e2e_tps,
                "window_s": self.window_s, "fill_s": self.fill_s, "drain_s": self.drain_s, "total_s": self.total_s,
                "windows": self.windows, "steady_windows": self.steady_windows, "rollout_s": self.rollout_s,
                "train_s": self.train_s, "sync_s": self.sync_s, "lag_max": self.lag_max, "lag_mean": self.lag_mean,
                "steals": self.steals, "instance_idle": self.instance_idle, "rho_stock": self.rho_stock}


def _problem(wins: Windows, split: Split, spec: InstanceSpec, cost: CostModel, max_lag: int, rho: float,
             steal: bool) -> PlanningProblem:
    return PlanningProblem(prompts=wins.prompts, estimate=wins.estimate, instances=split.instances, spec=spec,
                           minibatch=wins.minibatch, cost=cost, max_new_tokens=int(wins.max_new_tokens), rho=rho,
                           seed=0, max_lag=max_lag, work_stealing=steal)


def simulate_barrier(model: ClusterModel, wins: Windows, split: Split, plan: Plan, skip: int = 1) -> ClusterResult:
    """Synchronous iterations, each window alone: rollout on the instances, then ceil(Gw/M) updates, then the
    sync (split: `sync_s`; colocated: `switch_s(N)`, every device training). Every window is a steady state;
    the throughput is still taken over the streaming modes' middle windows so both count the same tokens."""
    tp, coloc = split.tp, split.colocated
    spec = InstanceSpec(slots=model.slots, kv_budget=(model.kv_colocated if coloc else model.kv_split)(tp))
    cost = model.cost(tp)
    trainer = model.trainer.model(split.trainer_devices, wins.minibatch)
    sync = model.switch_s(split.devices) if coloc else model.sync_s
    times, rollouts, trains, lags, idle = [], [], [], [], []
    for w in range(wins.count):
        win = wins.window(w)
        problem = _problem(win, split, spec, cost, max_lag=0, rho=0.0, steal=False)
        res = simulate_pipeline(problem, plan(problem), win.truth, mode="stock", max_lag=0, trainer=trainer,
                                sync_time=sync, with_bounds=False, work_stealing=False)
        m = res.metrics
        times.append(m["time/iteration"])
        rollouts.append(m["time/rollout"])
        trains.append(m["time/train"])
        lags.append(res.lags)
        idle.append(1.0 - float(res.trace.busy.sum()) / (split.instances * m["time/iteration"]))
    total = float(np.sum(times))
    lag = np.concatenate(lags)
    K = wins.count
    mid = range(skip, K - 1) if K >= skip + 2 else range(K)  # the streaming modes' steady windows
    steady = float(np.sum([times[w] for w in mid]))
    tokens = float(np.sum([wins.window(w).tokens() for w in mid]))
    return ClusterResult(mode="colocated" if coloc else "stock_split", split=split, max_lag=0,
                         e2e_tps=e2e_tps(tokens, steady, split.device_count()), window_s=steady / len(mid),
                         fill_s=0.0, rho_stock=rho_stock(float(np.mean(trains)), float(np.mean(rollouts))),
                         drain_s=0.0, total_s=total, windows=K, steady_windows=len(mid),
                         rollout_s=float(np.mean(rollouts)), train_s=float(np.mean(trains)), sync_s=sync,
                         lag_max=float(lag.max()), lag_mean=float(lag.mean()), steals=0.0,
                         instance_idle=float(np.mean(idle)))


def simulate_stream(model: ClusterModel, wins: Windows, split: Split, mode: str, max_lag: int, plan: Plan,
                    skip: int = 1) -> ClusterResult:
    """A split in a streaming mode over all windows at once: each window planned alone (asp) and appended to
    the instances' queues, as the runtime's re-planner does; `async` hands groups out FIFO. Steady state =
    the windows after the first `skip` and before the last one."""
    if split.colocated:
        raise InputError("streaming modes need a split (rollout devices < devices)", key="--devices")
    if mode not in STREAM_MODES:
        raise InputError(f"unknown streaming mode {mode!r}; choose from {', '.join(STREAM_MODES)}", key="--planners")
    K = wins.count
    if K < skip + 2:
        raise InputError(f"steady state needs >= {skip + 2} windows, the workload gives {K}", key="--windows")
    tp, M, Gw = split.tp, wins.minibatch, wins.window_groups
    spec = InstanceSpec(slots=model.slots, kv_budget=model.kv_split(tp))
    cost = model.cost(tp)
    trainer = model.trainer.model(split.trainer_devices, M)
    steal = mode == "asp"
    orders: List[List[np.ndarray]] = [[] for _ in range(split.instances)]
    queue: List[np.ndarray] = []  # the windows' shared orders, one after the other
    tags = []
    shared = []
    isolated: List[np.ndarray] = []
    for w in range(K):
        win = wins.window(w)
        tok = float(win.tokens())
        r_lb = lower_bounds(win.truth, win.prompts.prompt_lens, split.instances, spec, cost)["rollout/R_LB"]
        rho = trainer.train_time(tok) / r_lb if r_lb > 0 else 1.0
        problem = _problem(win, split, spec, cost, max_lag, rho, steal)
        a = plan(problem)
        shared.append(a.shared)
        isolated.append(np.asarray(a.isolated, dtype=np.int64) + w * Gw)
        queue.append(a.shared_order() + w * Gw)
        for j, o in enumerate(a.orders):
            orders[j].append(np.asarray(o, dtype=np.int64) + w * Gw)
        mb = np.asarray(a.minibatch, dtype=np.int64)
        tags.append(np.where(mb >= 0, mb + w * (Gw // M), -1))
    full = [np.concatenate(o) if o else np.zeros(0, dtype=np.int64) for o in orders]
    # every window unpinned: one shared queue, window after window; a mix of pinned and shared windows is
    # simulated pinned (the shared ones as dealt, with stealing), an approximation of the runtime's FIFO
    all_shared = bool(shared) and all(shared)
    if all_shared:
        q = np.concatenate(queue)
        full = [q[j::split.instances] for j in range(split.instances)]
    tag = np.concatenate(tags)
    assignment = Assignment(orders=full, minibatch=tag if (tag >= 0).any() else np.full(len(tag), -1),
                            planner=mode, shared=all_shared,
                            isolated=np.concatenate(isolated) if isolated else np.zeros(0, dtype=np.int64))
    all_wins = wins.take(np.arange(K * Gw))
    problem = _problem(all_wins, split, spec, cost, max_lag, 1.0, steal)
    res = simulate_pipeline(problem, assignment, all_wins.truth, mode="stream", max_lag=max_lag, trainer=trainer,
                            sync_time=model.sync_s, with_bounds=False, work_stealing=steal,
                            dispatch="fifo" if mode == "async" else "plan")
    upw = Gw // M
    u1, u2 = upw * skip, upw * (K - 1)
    end = res.mb_sync_end
    steady = float(end[u2 - 1] - end[u1 - 1])
    tokens = float(res.mb_tokens[u1:u2].sum())
    total = float(res.metrics["time/iteration"])
    steady_w = K - 1 - skip
    busy = float(res.trace.busy.sum())
    return ClusterResult(mode=mode, split=split, max_lag=max_lag,
                         e2e_tps=e2e_tps(tokens, steady, split.device_count()),
                         window_s=steady / steady_w, fill_s=float(end[u1 - 1]), drain_s=total - float(end[u2 - 1]),
                         total_s=total, windows=K, steady_windows=steady_w,
                         rollout_s=float(res.metrics["time/rollout"]) / K, train_s=res.metrics["time/train"] / K,
                         sync_s=model.sync_s * upw, lag_max=float(res.metrics["lag/max"]),
                         lag_mean=float(res.metrics["lag/mean"]), steals=float(res.metrics["rollout/steals"]),
                         instance_idle=1.0 - busy / (split.instances * total))


def simulate(model: ClusterModel, wins: Windows, split: Split, mode: str, max_lag: int, plan: Plan) -> ClusterResult:
    """One configuration in one mode (MODES)."""
    if mode == "colocated":
        if not split.colocated:
            raise InputError("mode colocated uses every device: give no rollout split", key="--planners")
        return simulate_barrier(model, wins, split, plan)
    if mode == "stock_split":
        return simulate_barrier(model, wins, split, plan)
    return simulate_stream(model, wins, split, mode, max_lag, plan)


def split_grid(devices: int, tp: int, lo: float = 0.25, hi: float = 0.875) -> List[int]:
    """Rollout device counts from lo*N to hi*N in steps of TP (at least one device left to train)."""
    start = max(tp, int(np.ceil(lo * devices / tp)) * tp)
    stop = min(devices - 1, int(np.floor(hi * devices)))
    return [r for r in range(start, stop + 1, tp)]


def best_per_bound(rows: Sequence[Dict[str, object]], bounds: Sequence[int]) -> List[Dict[str, object]]:
    """For each staleness bound b: the fastest streaming row with max_lag <= b and its ratio over colocated."""
    stock = [r for r in rows if r["mode"] == "colocated"]
    base = max((float(r["e2e_tps"]) for r in stock), default=float("nan"))
    out = []
    for b in sorted(set(bounds)):
        cands = [r for r in rows if r["mode"] in STREAM_MODES + ("stock_split",) and int(r["max_lag"]) <= b]
        if not cands:
            continue
        best = max(cands, key=lambda r: float(r["e2e_tps"]))
        out.append({"bound": b, "best": best, "speedup_vs_colocated": float(best["e2e_tps"]) / base
                    if base > 0 else float("nan")})
    return out
