"""The run loop of the asynchronous runtime, one code path for the three modes (docs/design.md section 6).

- `stock`: MindSpeed-RL's default schedule. Iteration k takes the next M groups in dataset order, cuts them
  into contiguous chunks (one per instance), waits for the slowest instance, trains, syncs weights.
- `async`: multi-instance and bounded lag, no plan: groups go in dataset order to the least-loaded
  instance whenever the max-lag counter admits them; the trainer consumes finished groups as they arrive.
- `asp`: the same, but every window of groups is placed by the offline planner from the length history
  (re-planned as observed lengths come in), each instance pulls its own plan queue, and an instance that
  drains steals not-started groups from the most loaded queue.

One driver process owns the dispatcher, the sample queue with the max-lag counter and the reference
trainer; the rollout instances are Ray actors, held by a `RolloutPool` (placement, liveness, submit/poll,
the weight-sync group), that generate in their own background loops while the driver polls them. Every
trained sample's lag is audited and logged, each sync is verified by checksums, versions increase by one per
update, and a dead instance's groups are re-dispatched to the others (the sync group is re-formed without
it); no group is trained twice.

Checkpoints and signals (docs/runtime.md, "Checkpoints, resume and signals"): every `run.checkpoint_every`
updates and whenever the run stops, the driver writes its whole state (`runtime/checkpoint.py`); SIGINT or
SIGTERM stops the loop after the current update (`runtime/stop_signals.py`), and `resume=` continues a run
from its latest checkpoint: the groups that were still generating are generated again, everything else goes on.
"""
from __future__ import annotations

import math
import os
from concurrent.futures import Future, ThreadPoolExecutor
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

import numpy as np

from mindspeed_asp.errors import InputError, RunError
from mindspeed_asp.run_report import StartupProgress
from mindspeed_asp.runtime.dispatcher import MODE_POLICY, Dispatcher, Ticket
from mindspeed_asp.metrics import e2e_tps, split_devices
from mindspeed_asp.runtime.metrics_log import GroupSpan, RunRecorder, offpolicy_fields
from mindspeed_asp.runtime.ray_utils import RaySession
from mindspeed_asp.runtime.rollout_pool import CALL_TIMEOUT_S, RolloutPool
from mindspeed_asp.runtime.run_config import RunConfig, dump_config
from mindspeed_asp.runtime.stall_watch import EngineStalled, StallWatch
from mindspeed_asp.runtime.stop_signals import StopSignals
from mindspeed_asp.runtime.types import RequestId

if TYPE_CHECKING:
    from mindspeed_asp.policy import LagPolicy
    from mindspeed_asp.runtime.demo_task import DemoTask
    from mindspeed_asp.runtime.platform import Platform
    from mindspeed_asp.runtime.replan import WindowPlanner
    from mindspeed_asp.runtime.sample_queue import SampleQueue
    from mindspeed_asp.runtime.trainer import GRPOTrainer
    from mindspeed_asp.scheduler.plan import DispatchPlan
    from mindspeed_asp.types import PromptSet

POLL_S = 0.05
#: vLLM's per-request INFO lines would bury the progress bar; warnings and errors still show.
QUIET_ENV = {"VLLM_LOGGING_LEVEL": "WARNING"}


@dataclass
class _GroupInfo:
    """What the driver knows about one group (gid = epoch * P + prompt index)."""

    gid: int
    epoch: int
    prompt_index: int
    dispatch_version: int = -1
    window: int = 0


def _progress(total: int, enabled: bool, initial: int = 0):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc="train", unit="step", file=sys.stderr, disable=not enabled,
                leave=True, dynamic_ncols=True)


class Driver:
    """Runs one training run of `cfg` (mode from `cfg.asp.mode`) and writes everything under `out_dir`."""

    def __init__(self, cfg: RunConfig, out_dir: str | Path, progress: bool = True,
                 after_step: Optional[Callable[["Driver", Dict[str, Any]], None]] = None,
                 manage_ray: bool = True, resume: Optional[str | Path] = None,
                 handle_signals: bool = True, pool: Optional[RolloutPool] = None,
                 keep_pool: bool = False) -> None:
        self.cfg = cfg
        self.mode = cfg.asp.mode
        self.max_lag = 0 if self.mode == "stock" else cfg.asp.max_lag
        self.M = cfg.asp.minibatch_groups
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.progress = progress
        self.after_step = after_step
        self.manage_ray = manage_ray
        self.version = 0
        self.sync_rounds: List[Dict[str, Any]] = []
        self.infos: Dict[int, _GroupInfo] = {}
        self.results_by_gid: Dict[int, Any] = {}
        self.spans: Dict[int, GroupSpan] = {}
        self.trained_gids: List[int] = []
        self.minibatch_tag: Dict[int, int] = {}  # gid -> the plan's minibatch tag
        self.steals_logged = 0  # dispatcher.steals already written to the trace
        self.peak_rss = 0.0
        # built by _setup: the config-derived parts before Ray starts, the pool and the trainer once it is up
        self.platform: Optional[Platform] = None
        self.model_path = ""
        self.task: Optional[DemoTask] = None
        self.prompt_set: Optional[PromptSet] = None
        self.prompt_list: List[Any] = []
        self.P = 0
        self.policy: Optional[LagPolicy] = None  # admission, waiting and staleness (mindspeed_asp/policy.py)
        self.queue: Optional[SampleQueue] = None
        self.dispatcher: Optional[Dispatcher] = None
        self.recorder: Optional[RunRecorder] = None
        self.planner: Optional[WindowPlanner] = None
        self.plan_file: Optional[DispatchPlan] = None
        self.plan_iteration = 0
        self.step_cursor: Dict[int, int] = {}  # per instance: engine steps already read for the online cost fit
        self.step_refs: Optional[Dict[int, Any]] = None  # step_log calls sent and not read yet (plan ahead)
        self.step_start: Dict[int, int] = {}  # per instance: engine steps before the loop (warm-up), not the run's
        # (gids, PendingPlan, Future of its Assignment): the next window, being planned on `plan_thread` while
        # the loop goes on dispatching and collecting
        self.prepared: Optional[tuple] = None
        self.plan_thread: Optional[ThreadPoolExecutor] = None
        self.loaded_plans: List[Dict[str, Any]] = []  # each loaded window: what it was planned with, its queues
        self.ray_session = RaySession(cfg.run.ray_address, num_cpus=cfg.run.ray_num_cpus,
                                      object_store_mb=cfg.run.ray_object_store_mb, env=QUIET_ENV)
        self.pool: Optional[RolloutPool] = None
        # A started pool handed over by an earlier run of the same engine config (benchmarks run many short
        # runs; starting vLLM takes minutes on a loaded CPU host): adopted, reset to this run's initial
        # weights at version 0, and kept running afterwards (`keep_pool`) for the next run.
        self.shared_pool = pool
        self.keep_pool = bool(keep_pool or pool is not None)
        self.startup: Optional[StartupProgress] = None  # start-up lines on stderr (mindspeed_asp/run_report.py)
        self.trainer: Optional[GRPOTrainer] = None
        # loop state (_loop)
        self.next_gid = 0
        self.window_index = 0
        self.t_last_step: Optional[float] = None
        self.stall_watch = StallWatch(cfg.run.stall_timeout_s)  # hung engines (runtime/stall_watch.py)
        self.bar: Any = None
        # checkpoints, resume and stop signals
        self.resume_dir: Optional[Path] = Path(resume) if resume is not None else None
        self.handle_signals = handle_signals
        self.stop = StopSignals(announce=True)
        self.checkpoint_dir: Optional[Path] = None  # the latest checkpoint this process wrote
        self.resumes: List[Dict[str, Any]] = []  # one row per restart of this run
        self.decode_steps_before: Dict[int, int] = {}  # engine steps of the run's earlier parts, per instance
        self.restored_rng: Optional[Dict[str, Any]] = None  # python/numpy RNG states to set once set-up is done

    # ================================================================== setup
    def _setup(self) -> None:
        from mindspeed_asp.runtime.platform import current_platform, platform_from_name
        from mindspeed_asp.policy import LagPolicy
        from mindspeed_asp.runtime.sample_queue import SampleQueue
        from mindspeed_asp.runtime.tiny_model import ensure_tiny_model

        cfg = self.cfg
        self.startup = StartupProgress(cfg.asp.instances, enabled=self.progress)
        self.platform = platform_from_name(cfg.run.platform) if cfg.run.platform else current_platform()
        if cfg.model.tiny:
            self.model_path = ensure_tiny_model(cfg.model.path, seed=cfg.model.init_seed)
        else:
            self.model_path = cfg.model.path
            if not Path(self.model_path, "config.json").is_file():
                raise RunError(f"model.path {self.model_path!r} is not an HF model directory (no config.json)")
        self.startup.model_ready(self.model_path)
        self.task, self.prompt_set = task_and_prompts(cfg)
        self.task.to_jsonl(self.out / "dataset.jsonl")
        self.prompt_list = self.task.prompts()
        self.P = len(self.prompt_list)
        self.policy = LagPolicy(self.max_lag, self.M)
        self.queue = SampleQueue(self.policy, stale_policy=cfg.asp.stale_policy)
        capacity = None if self.mode == "stock" else max(1, math.ceil(cfg.asp.slots / cfg.data.n)) + 1
        self.dispatcher = Dispatcher(MODE_POLICY[self.mode], cfg.asp.instances, capacity=capacity,
                                     work_stealing=cfg.asp.work_stealing, clock=time.time, lag=self.policy)
        # e2e_tps over every device the run uses: one per instance plus the trainer's (docs/design.md section 5)
        self.recorder = RunRecorder(self.out, mode=self.mode, instances=cfg.asp.instances, slots=cfg.asp.slots,
                                    minibatch_groups=self.M, max_lag=self.max_lag, clock=time.time,
                                    target_reward=cfg.run.target_reward,
                                    devices=split_devices(cfg.asp.instances, 1, cfg.trainer.devices))
        if self.mode == "asp" and cfg.asp.plan_path:
            from mindspeed_asp.scheduler.plan import DispatchPlan

            from mindspeed_asp.runtime.run_config import PLAN_SETTING_KEYS, plan_settings

            self.plan_file = DispatchPlan.load(cfg.asp.plan_path, prompts=self.prompt_set)
            if self.plan_file.instances != cfg.asp.instances:
                raise RunError(f"plan {cfg.asp.plan_path} is for {self.plan_file.instances} instances, "
                               f"the run has asp.instances={cfg.asp.instances}")
            # every setting the plan depends on (asp train checks it before Ray starts; code that calls
            # run_training directly, benchmarks and the demo, gets the same refusal here)
            self.plan_file.check_settings(plan_settings(cfg, len(self.prompt_list)), PLAN_SETTING_KEYS)
        if self.mode == "asp":
            from mindspeed_asp.runtime.replan import WindowPlanner

            self.planner = WindowPlanner(cfg.asp, self.prompt_set, cfg.data.max_new_tokens, cfg.asp.instances,
                                         rollout_log=self.out / "rollout_log.jsonl", seed=cfg.run.seed)
        resumed = None
        if self.resume_dir is not None:
            from mindspeed_asp.runtime.checkpoint import load_state

            resumed = load_state(self.resume_dir)  # hashes verified, keys and types checked
            self._restore(resumed)
        if self.manage_ray:
            self.ray_session.platform = self.platform
            if self.handle_signals:
                with self.stop.shielded():  # a signal while Ray starts is honoured once Ray is whole
                    self.ray_session.open()
            else:
                self.ray_session.open()
        # Ray ends a driver whose GCS is gone about 60 s later, from C++: seen first, the run stops at its next
        # safe point with a checkpoint and a summary, as after a SIGTERM
        self.ray_session.watch(self.stop.request_stop)
        if self.shared_pool is not None:
            self._adopt_pool(self.shared_pool, resumed is not None)
        else:
            self.pool = RolloutPool(self._engine_config(), cfg.asp.instances, self.platform,
                                    threads=cfg.run.instance_threads, start_timeout_s=cfg.run.start_timeout_s,
                                    multi_node=cfg.run.ray_address is not None, on_death=self._on_instance_death,
                                    event=self.recorder.event, progress=self.startup, alive=self.dispatcher.alive,
                                    sync_timeout_s=cfg.run.sync_timeout_s)
            self.pool.start()
        from mindspeed_asp.runtime.trainer import GRPOTrainer

        import torch

        torch.set_num_threads(cfg.trainer.threads)
        self.trainer = GRPOTrainer(self.model_path, lr=cfg.trainer.lr, clip_eps=cfg.trainer.clip_eps,
                                   kl_coef=cfg.trainer.kl_coef, micro_batch_size=cfg.trainer.micro_batch_size,
                                   seed=cfg.run.seed, max_grad_norm=cfg.trainer.max_grad_norm,
                                   dtype=cfg.model.dtype, objective=cfg.trainer.objective,
                                   iw_cap=cfg.trainer.iw_cap, iw_mode=cfg.trainer.iw_mode)
        self.pool.open_sync_group()
        if resumed is not None:
            self._resume_weights()
        elif self.shared_pool is not None:  # the previous run's weights and version go: version 0 = the model's
            self.pool.sync(0, self.trainer.named_weights, verify=cfg.run.verify_weights)
        self.pool.warmup(self.prompt_list[0][1], timeout_s=cfg.run.start_timeout_s)
        if resumed is not None:
            from mindspeed_asp.runtime.checkpoint import STATE_FILE, restoring, set_rng_state

            # the run proceeds: only now are the run's files cut back to the checkpoint (rollout log, metrics)
            if self.planner is not None:
                with restoring(self.resume_dir / STATE_FILE, "planner"):
                    self.planner.load_state_dict(resumed["planner"])
            set_rng_state(self.restored_rng)
            self.recorder.continue_clock()
        self.recorder.open_steps()

    def _adopt_pool(self, pool: RolloutPool, resuming: bool) -> None:
        """Take over a started pool: its liveness list becomes the dispatcher's, its events and deaths this
        run's, and whatever the previous run left generating is finished and discarded (its group ids would
        collide with this run's)."""
        import ray

        if resuming:
            raise RunError("a resumed run starts its own rollout instances (no shared pool)")
        from dataclasses import replace

        # the engine seed may differ: every request carries its own sampling seed (seed + sample index)
        if pool.count != self.cfg.asp.instances or replace(pool.engine, seed=0) != replace(self._engine_config(),
                                                                                           seed=0):
            raise RunError(f"the shared rollout pool runs {pool.count} instances of {pool.engine}, this run needs "
                           f"asp.instances={self.cfg.asp.instances} of {self._engine_config()}")
        self.pool = pool
        self.dispatcher.alive = pool.alive
        pool.on_death, pool.event, pool.progress = self._on_instance_death, self.recorder.event, self.startup
        pool.sync_timeout_s = self.cfg.run.sync_timeout_s  # this run's bound, from the group it forms next
        deadline = time.time() + self.cfg.run.start_timeout_s
        for j in pool.live():
            h = pool.handles[j]
            ray.get(h.steal_unstarted.remote(1 << 30), timeout=60)
            while ray.get(h.status.remote(), timeout=60)["running_groups"] > 0:
                if time.time() > deadline:
                    raise RunError(f"rollout instance {j} still generates the previous run's groups after "
                                   f"run.start_timeout_s={self.cfg.run.start_timeout_s:.0f} s")
                time.sleep(POLL_S)
            ray.get(h.drain_finished.remote(), timeout=60)
        # engine steps before this run are not its own (the summary counts this run's decode steps only)
        self.decode_steps_before = {j: -n for j, n in pool.decode_steps().items()}

    def _sample_memory(self) -> None:
        """Peak resident memory of the run: the driver (trainer) plus every instance process and its
        children, each process counted once (Ray's own daemons are not counted), sampled per update."""
        try:
            import psutil
        except ImportError:
            return
        procs = {}
        for pid in self.pool.pids:
            try:
                p = psutil.Process(pid)
                procs[p.pid] = p
                procs.update({c.pid: c for c in p.children(recursive=True)})
            except Exception:  # noqa: BLE001 - a process that just died
                continue
        procs[os.getpid()] = psutil.Process(os.getpid())
        total = 0
        for p in procs.values():
            try:
                total += p.memory_info().rss
            except Exception:  # noqa: BLE001
                continue
        self.peak_rss = max(self.peak_rss, total / (1 << 30))

    def _engine_config(self):
        from mindspeed_asp.runtime.types import EngineConfig

        cfg = self.cfg
        return EngineConfig(model_path=self.model_path, slots=cfg.asp.slots, max_model_len=cfg.model.max_model_len,
                            dtype=cfg.model.dtype, gpu_memory_utilization=cfg.model.memory_fraction,
                            seed=cfg.run.seed)

    # ================================================================== main loop
    def run(self) -> Dict[str, Any]:
        """Run `run.steps` updates; returns the summary dict (also written to summary.json).

        The Ray it started (a local one) is stopped afterwards; an existing cluster (`run.ray_address`) is
        only disconnected from, and a Ray this process already had is left as it was.
        """
        from mindspeed_asp.run_dir import lock_run_dir

        lock = lock_run_dir(self.out)  # before anything is written into it; a second run there is refused
        installed = self.stop.install() if self.handle_signals else False
        try:
            self._setup()
            self.stop.arm()  # from here a first signal waits for the end of the current update
            self._loop()
            self._save_checkpoint()
            summary = self._finish()
        finally:
            self._shutdown()
            self.ray_session.close()
            if installed:
                self.stop.restore()
            lock.release()
        return summary

    def _loop(self) -> None:
        cfg = self.cfg
        self.startup.all_ready()
        self.bar = _progress(cfg.run.steps, self.progress, initial=self.version)  # a resumed run starts at v
        self._read_engine_steps()  # the warm-up's steps are not the run's
        self.step_start = dict(self.step_cursor)
        try:
            while self.version < cfg.run.steps:
                if self.stop.requested is not None:  # SIGINT/SIGTERM: a safe point, between two updates
                    break
                self._ensure_work_loaded()
                self._dispatch()
                got = self._poll()
                self._watch_engines()
                if self._try_train():
                    every = cfg.run.checkpoint_every
                    if every and self.version % every == 0 and self.version < cfg.run.steps:
                        self._save_checkpoint()
                    continue
                if not got:
                    self._wait_idle()
        finally:
            self.bar.close()

    # ------------------------------------------------------------------ loading windows
    def _needed_groups(self) -> int:
        return self.cfg.run.steps * self.M + self.queue.dropped_stale

    def _ensure_work_loaded(self) -> None:
        """Stock: load iteration k's M groups once the previous iteration is trained. Streaming modes: load
        the next window when the dispatcher has handed out the previous one."""
        if self.next_gid >= self._needed_groups():
            return
        if self.mode == "stock":
            if self.dispatcher.idle() and self.queue.occupancy() == 0:
                self._load(self.M)
            return
        # Lazily: a window is planned only when the previous one is fully handed out and the max-lag counter
        # admits more work, so it is planned with every length observed up to that moment.
        window = self.cfg.asp.replan_every * self.M if self.cfg.asp.replan_every > 0 else self.P
        if self.dispatcher.queued() == 0 and self.policy.admits(self.version):
            self._load(window)

    def _load(self, size: int) -> None:
        if self.plan_file is not None and self.next_gid < self.P:
            return self._load_from_plan_file()
        size = min(size, self._needed_groups() - self.next_gid)
        gids = list(range(self.next_gid, self.next_gid + size))
        self.next_gid += size
        for g in gids:
            self.infos[g] = _GroupInfo(g, g // self.P, g % self.P, window=self.window_index)
        if self.planner is not None:
            ahead = self.prepared is not None and self.prepared[0] == gids
            if ahead:
                _, pending, future = self.prepared
                plan = self.planner.finish(pending, future.result())  # waits only if it is still planning
            else:
                if self.prepared is not None:  # planned for other groups (stale drops changed the count)
                    self.prepared[2].cancel()
                plan = self._plan_window(gids)
            self.prepared = None
            self.loaded_plans.append({"window": self.window_index, "groups": len(gids), "planner": plan.planner,
                                      "ahead": ahead, "plan_seconds": plan.plan_seconds, "cost": plan.cost,
                                      "rho": plan.rho, "queues": plan.queues, "shared": plan.shared,
                                      "isolated": plan.isolated,
                                      "searched": plan.searched,
                                      "minibatch": [plan.minibatch[g] for g in gids], "gids": gids})
            tickets = [Ticket(g, plan.predicted_tokens[g]) for g in gids]
            self.minibatch_tag.update(plan.minibatch)
            self.dispatcher.load_window(tickets, plan_queues=plan.queues, shared=plan.shared,
                                        isolated=plan.isolated)
            self.recorder.event("plan", window=self.window_index, groups=len(gids),
                                with_history=plan.with_history, planner=plan.planner, ahead=ahead,
                                shared=plan.shared, isolated=len(plan.isolated),
                                plan_seconds=round(plan.plan_seconds, 4), cost=plan.cost, rho=plan.rho)
        else:
            caps = {g: float(self.prompt_list[g % self.P][2]) for g in gids}
            self.dispatcher.load_window([Ticket(g, caps[g]) for g in gids])
        self.window_index += 1

    def _plan_window(self, gids: List[int]):
        """Plan `gids` with the engine steps read so far (the online cost fit) and the measured rho. With
        `asp.plan_ahead` a window planned here is one the loop could not plan ahead: dispatch waits for it, so
        it reuses the last search's choice instead of searching (`WindowPlanner.prepare`, `urgent`)."""
        if self.cfg.asp.online_fit:
            self._read_engine_steps()
        return self.planner.plan(gids, urgent=bool(self.cfg.asp.plan_ahead))

    def _read_engine_steps(self, wait: bool = True) -> bool:
        """Hand the engine steps each live instance ran since the last read to the planner's cost fit.

        `wait=False` (planning ahead) only sends the calls, or takes their answers once all are in, and
        returns whether they were taken: the loop is not held up while a busy instance answers."""
        import ray

        if self.step_refs is None:
            self.step_refs = {j: self.pool.handles[j].step_log.remote(self.step_cursor.get(j, 0))
                              for j in self.pool.live()}
        refs = self.step_refs
        if not wait and refs:
            ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=0)
            if len(ready) < len(refs):
                return False
        self.step_refs = None
        for j, ref in refs.items():
            try:
                total, rows = ray.get(ref, timeout=30)
            except Exception:  # noqa: BLE001 - a dead instance is the pool's to notice; its steps are lost
                continue
            if j in self.step_cursor and self.planner is not None:  # the first read only sets the cursor
                self.planner.add_engine_steps(rows)
            self.step_cursor[j] = int(total)
        return True

    def _plan_ahead(self) -> None:
        """Streaming asp: while the driver waits, start planning the next window on a thread of its own, so
        that loading it later costs no planning time and the loop goes on collecting and dispatching while
        the planner searches; only once every group of the previous epoch of the window's prompts came back,
        so the plan sees the same per-prompt history as at load time (docs/runtime.md "Planning each
        window"). Only a copy of the history is taken here, on the loop's thread (the loop writes the history);
        the length estimate and the search (`WindowPlanner.solve`) run on the planning thread."""
        if self.planner is None or self.mode != "asp" or self.prepared is not None or self.plan_file is not None:
            return
        window = self.cfg.asp.replan_every * self.M if self.cfg.asp.replan_every > 0 else self.P
        size = min(window, self._needed_groups() - self.next_gid)
        if size <= 0:
            return
        gids = list(range(self.next_gid, self.next_gid + size))
        if any(g >= self.P and g - self.P not in self.spans for g in gids):
            return  # a prompt's previous-epoch lengths are still coming: plan when the window is due
        if self.cfg.asp.online_fit and not self._read_engine_steps(wait=False):
            return  # the instances' step logs are on their way: plan at the next idle moment
        pending = self.planner.prepare(gids)
        if self.plan_thread is None:
            self.plan_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asp-plan")
        future: Future = self.plan_thread.submit(self.planner.solve, pending)
        self.prepared = (gids, pending, future)

    def _write_engine_steps(self) -> None:
        """engine_steps.jsonl: every engine step of the run per instance (active sequences, KV tokens, prefill
        tokens, seconds), for fitting this machine's cost model afterwards (benchmarks/bench_runtime.py)."""
        import json

        import ray

        from mindspeed_asp.atomic import write_text

        lines = []
        for j in self.pool.live():
            try:
                _, rows = ray.get(self.pool.handles[j].step_log.remote(self.step_start.get(j, 0)), timeout=30)
            except Exception:  # noqa: BLE001 - an instance that died: its steps are lost
                continue
            lines.extend(json.dumps({"instance": j, "active": r[0], "kv_tokens": r[1], "prefill_tokens": r[2],
                                     "step_time": r[3]}) for r in rows)
        write_text(self.out / "engine_steps.jsonl", "\n".join(lines) + ("\n" if lines else ""))

    def _load_from_plan_file(self) -> None:
        """Epoch 0 of an asp run with `asp.plan_path`: the file's next iteration, queues as planned offline
        (later epochs are re-planned from the observed lengths)."""
        plan = self.plan_file
        it = plan.iterations()[self.plan_iteration]
        self.plan_iteration += 1
        gids = [int(r) for r in plan.iteration_rows(it)]
        queues = [[int(r) for r in plan.instance_rows(it, j)] for j in range(self.cfg.asp.instances)]
        self.next_gid = max(self.next_gid, max(gids) + 1)
        tickets = []
        for g in gids:
            self.infos[g] = _GroupInfo(g, 0, g, window=self.window_index)
            pid = self.prompt_list[g][0]
            self.minibatch_tag[g] = int(plan.minibatch_of(pid))
            tickets.append(Ticket(g, float(plan.predicted(pid).get("pred_group_max", 1.0)) * self.cfg.data.n))
        shared = plan.is_shared(it)
        isolated = [int(r) for r in plan.isolated_rows(it)]
        self.dispatcher.load_window(tickets, plan_queues=queues, shared=shared, isolated=isolated)
        self.recorder.event("plan", window=self.window_index, groups=len(gids), with_history=-1,
                            planner=f"file:{plan.path}", shared=shared, isolated=len(isolated))
        self.window_index += 1

    # ------------------------------------------------------------------ dispatch and polling
    def _dispatch(self) -> None:
        from mindspeed_asp.runtime.types import GroupRequest

        for group in self.queue.take_stale():  # regenerate policy: back to the front, counted by the queue
            gid = group.group_id.gid
            self.dispatcher.done.discard(gid)
            self.dispatcher.requeue(gid, predicted=float(self.prompt_list[gid % self.P][2]))
            self.recorder.event("regenerate", gid=gid)
        picks = self.dispatcher.fill(self.version)  # as many as the lag policy admits (stock: its M groups)
        if not picks:
            return
        by_inst: Dict[int, List[Any]] = defaultdict(list)
        for j, t in picks:
            info = self.infos[t.gid]
            info.dispatch_version = self.version
            pid, ids, cap = self.prompt_list[info.prompt_index]
            by_inst[j].append(GroupRequest(
                group_id=RequestId(t.gid, t.attempt), prompt_id=pid, prompt_token_ids=list(ids), n=self.cfg.data.n,
                max_new_tokens=int(cap), temperature=self.cfg.data.temperature,
                seed=self.cfg.run.seed * 1_000_003 + t.gid * 101 + t.attempt,
                stop_token_ids=[self.task.eos_token_id],
                minibatch=int(self.minibatch_tag.get(t.gid, -1))))
        for j, reqs in by_inst.items():
            self.pool.submit(j, reqs)  # an unreachable instance is marked dead: its groups go back to the queue
        for s in self.dispatcher.steals[self.steals_logged:]:
            self.recorder.event("steal", thief=s.thief, victim=s.victim, gid=s.gid)
        self.steals_logged = len(self.dispatcher.steals)

    def _poll(self) -> int:
        """Collect finished groups from every live instance; returns how many arrived."""
        got = 0
        for j, res in self.pool.poll():
            got += self._accept_result(j, res)
        if got:
            self.recorder.queue(self.queue.occupancy())
        return got

    def _accept_result(self, j: int, res: Any) -> int:
        gid = res.group_id.gid
        if not self.dispatcher.on_finished(j, gid):
            self.recorder.event("late_result_refused", instance=j, gid=gid)
            return 0
        info = self.infos[gid]
        lengths = [len(s.token_ids) for s in res.samples]
        span = GroupSpan(instance=j, gid=gid, submit=float(res.t_enqueued) - self.recorder.t0,
                         start=float(res.t_started) - self.recorder.t0, end=float(res.t_finished) - self.recorder.t0,
                         prompt_tokens=len(res.prompt_token_ids) * len(res.samples),
                         response_tokens=int(sum(lengths)), sample_lengths=lengths,
                         version=min(int(s.min_version) for s in res.samples),
                         window=info.window if self.mode == "stock" else 0)
        self.recorder.group(span)
        self.spans[gid] = span
        if self.planner is not None:
            self.planner.observe(res.prompt_id, info.epoch, lengths, gid=gid, instance=j)
        self.results_by_gid[gid] = res
        self.queue.put(res, version=info.dispatch_version)
        return 1

    def _on_instance_death(self, j: int, exc: BaseException) -> None:
        """The pool lost instance j (others live): its in-flight and queued groups go to the live ones, and
        results it may still deliver are refused, so each group is trained exactly once."""
        lost = self.dispatcher.on_instance_dead(j)
        self.recorder.event("instance_died", instance=j, redispatched=len(lost), error=type(exc).__name__)

    def _watch_engines(self) -> None:
        """Drop an instance whose engine hung (its step loop silent for run.stall_timeout_s while its actor
        still answers): its groups go to the live instances, as for a dead actor (runtime/stall_watch.py)."""
        if not self.stall_watch.due():
            return
        for j, why in self.stall_watch.check(self.pool.statuses(CALL_TIMEOUT_S)):
            self.recorder.event("instance_stalled", instance=j, reason=why)
            self.pool.mark_dead(j, EngineStalled(f"rollout instance {j}: {why}"))

    def _wait_idle(self) -> None:
        """Nothing arrived and nothing to train: sleep a poll interval, counting starved trainer time."""
        t0 = time.time()
        if self.prepared is None and self.planner is not None and self.cfg.asp.plan_ahead:
            self._plan_ahead()  # starts the next window's search on the planning thread (returns at once)
        time.sleep(POLL_S)
        rollout_active = self.dispatcher.in_flight_count() > 0
        if rollout_active:
            self.recorder.trainer_starved(t0 - self.recorder.t0, time.time() - self.recorder.t0)
        if self.t_last_step is not None and time.time() - self.t_last_step > self.cfg.run.step_timeout_s:
            raise RunError(f"no update for {self.cfg.run.step_timeout_s:.0f} s (run.step_timeout_s): "
                           f"{self.dispatcher.in_flight_count()} groups in flight, "
                           f"{self.queue.occupancy()} queued")

    # ------------------------------------------------------------------ training
    def _try_train(self) -> bool:
        if self.t_last_step is None:
            self.t_last_step = time.time()
        if self.policy.must_wait(self.version):  # a group still generating is due now (stock: max_lag 0)
            return False
        prefer = "plan_tag" if self.mode == "asp" else "oldest"
        batch = self.queue.next_minibatch(self.version, self.M, prefer=prefer)
        if batch is None:
            return False
        self._train(batch)
        return True

    def _train(self, batch: List[Any]) -> None:
        step = self.version
        t_ready = time.time()
        rewards = [[self.task.reward(g.prompt_id, s.token_ids) for s in g.samples] for g in batch]
        stats = self.trainer.train_step(batch, rewards)
        t_trained = time.time()
        sync = self.pool.sync(self.trainer.version, self.trainer.named_weights, verify=self.cfg.run.verify_weights)
        self.sync_rounds.append(sync)
        self.version = self.trainer.version
        if self.version != step + 1:
            raise RunError(f"trainer version {self.version} after update {step}: versions must grow by one")
        t_end = time.time()
        if self.planner is not None:  # trainer seconds of this update (train + sync), for the measured rho
            self.planner.add_update((t_trained - t_ready) + float(sync.get("seconds", 0.0)))
        lags = self.queue.log_rows[-1].lags
        gids = [g.group_id.gid for g in batch]
        for g in gids:
            self.spans[g].trained = True
        self.trained_gids.extend(gids)
        iter_s = t_end - self.t_last_step
        tokens = int(stats["tokens_total"])
        rec = {
            "step": step, "version": self.version, "t_end": t_end - self.recorder.t0,
            "time/iteration": iter_s, "time/rollout": t_ready - self.t_last_step,
            "time/train": t_trained - t_ready, "time/weight_sync": sync.get("seconds", 0.0),
            "tokens/trained": tokens, "tokens/response": int(stats["tokens"]),
            "throughput/e2e_tps": e2e_tps(tokens, iter_s, self.recorder.devices),
            "reward/mean": float(np.mean([r for rs in rewards for r in rs])),
            "loss": float(stats["loss"]), "grad_norm": float(stats["grad_norm"]),
            "clip_frac": float(stats["clip_frac"]), "kl": float(stats["kl"]),
            "bubble/padding_train": float(stats["bubble/padding_train"]),
            "response_len/mean": float(stats["response_len_mean"]),
            "queue/groups": self.queue.occupancy(), "in_flight": self.dispatcher.in_flight_count(),
            "weights/verified": bool(sync.get("verified", False)),
            "gids": gids, **{k: v for k, v in self.queue.counters().items() if k != "queue/occupancy"},
            **offpolicy_fields(stats),
        }
        self._sample_memory()
        rec["memory/rss_gib"] = self.peak_rss
        self.recorder.log_step(rec, lags)
        self.recorder.queue(self.queue.occupancy())
        self.t_last_step = t_end
        self.bar.update(1)
        self.bar.set_postfix(reward=f"{rec['reward/mean']:.3f}", lag=max(lags) if lags else 0,
                             queue=rec["queue/groups"], tps=f"{tokens / max(iter_s, 1e-9):.0f}")
        if self.after_step is not None:
            self.after_step(self, rec)

    # ================================================================== finish
    def _finish(self) -> Dict[str, Any]:
        steps = self._decode_steps_total()
        if steps:
            self.recorder.decode_steps = steps
        if self.planner is not None:
            self.planner.save_history(self.out / "length_history.jsonl")
        self._write_engine_steps()
        sync_s = [r["seconds"] for r in self.sync_rounds]
        extra = {
            "config": dump_config(self.cfg), "platform": self.platform.kind,
            "weight_sync/rounds": len(self.sync_rounds),
            "weight_sync/verified_all": all(r["verified"] for r in self.sync_rounds),
            "weight_sync/mean_s": float(np.mean(sync_s)) if sync_s else 0.0,
            "versions": [r["version"] for r in self.sync_rounds],
            "trained_groups": len(self.trained_gids),
            "trained_unique": len(set(self.trained_gids)),
            "steals": len(self.dispatcher.steals), "redispatched": self.dispatcher.redispatched,
            "instances_alive": len(self.pool.live()),
            "instance_nodes": list(self.pool.nodes),
            "memory/peak_rss_gib": self.peak_rss,
            "plan/windows": self.loaded_plans,  # asp: what each window was planned with, its queues and tags
            **self.queue.counters(),
            # a run stopped by SIGINT/SIGTERM before run.steps: partial, resumable from its checkpoint
            "interrupted": self.version < self.cfg.run.steps, "stop_signal": self.stop.requested_name,
            "stop_reason": self.stop.reason,
            "steps_planned": self.cfg.run.steps, "resumes": self.resumes,
            "checkpoint": None if self.checkpoint_dir is None else {"dir": str(self.checkpoint_dir),
                                                                  "version": self.version},
        }
        summary = self.recorder.write(extra)
        if self.cfg.run.plots:
            from mindspeed_asp.runtime.run_plots import plot_run

            plot_run(self.out)
        return summary

    def _shutdown(self) -> None:
        if self.plan_thread is not None:
            self.plan_thread.shutdown(wait=False, cancel_futures=True)
        if self.ray_session.lost is not None:
            self.pool = None  # no GCS to ask: its actors go with Ray's processes (RaySession.close, stop_local_ray)
        if self.pool is not None and not (self.keep_pool and self.stop.requested is None):
            self.pool.shutdown(graceful=not self.stop.aborted)  # a second signal: kill, do not ask
        if self.recorder is not None:
            self.recorder.close()


    # ================================================================== checkpoints and resume
    def _decode_steps_total(self) -> Dict[int, int]:
        """Engine steps per instance over the whole run (earlier parts included); {} when not all known."""
        now = self.pool.decode_steps()
        if len(now) != self.pool.count or (self.resumes and not self.decode_steps_before):
            return {}
        return {j: self.decode_steps_before.get(j, 0) + n for j, n in now.items()}

    def _save_checkpoint(self) -> None:
        """Write the run's whole state as its latest checkpoint (atomic; runtime/checkpoint.py). Groups in
        flight are saved as such and generated again by a resumed run."""
        from mindspeed_asp.runtime.checkpoint import rng_state, write_checkpoint

        self.recorder.event("checkpoint", version=self.version, in_flight=self.dispatcher.in_flight_count(),
                            queued=self.queue.occupancy(), signal=self.stop.requested_name)
        state = {
            "version": self.version, "mode": self.mode, "config": dump_config(self.cfg),
            "driver": {"next_gid": self.next_gid, "window_index": self.window_index,
                       "plan_iteration": self.plan_iteration, "steals_logged": self.steals_logged,
                       "minibatch_tag": self.minibatch_tag, "infos": [asdict(i) for i in self.infos.values()],
                       "sync_rounds": self.sync_rounds, "trained_gids": self.trained_gids,
                       "peak_rss": self.peak_rss, "decode_steps": self._decode_steps_total(),
                       "resumes": self.resumes},
            "policy": self.policy.state_dict(), "dispatcher": self.dispatcher.state_dict(),
            "queue": self.queue.state_dict(), "recorder": self.recorder.state_dict(),
            "planner": None if self.planner is None else self.planner.state_dict(), "rng": rng_state(),
        }
        self.checkpoint_dir = write_checkpoint(self.out, state, self.trainer)

    def _restore(self, state: Dict[str, Any]) -> None:
        """Put a checkpoint's state into the freshly built policy, dispatcher, queue and recorder (before the
        instances start; the planner's, which cuts the rollout log back, at the end of `_setup`). The groups
        that were in flight go back to the queues. Nothing in the run directory is written here."""
        from mindspeed_asp.runtime.checkpoint import STATE_FILE, check_rng_state, check_rollout_log, restoring

        where = self.resume_dir / STATE_FILE
        if state["mode"] != self.mode:
            raise RunError(f"checkpoint in {self.resume_dir} is a {state['mode']} run, this one {self.mode}")
        with restoring(where, "driver"):
            d = state["driver"]
            self.version = int(state["version"])
            self.next_gid, self.window_index = int(d["next_gid"]), int(d["window_index"])
            self.plan_iteration, self.steals_logged = int(d["plan_iteration"]), int(d["steals_logged"])
            self.minibatch_tag = {int(g): int(tag) for g, tag in d["minibatch_tag"].items()}
            self.infos = {int(i["gid"]): _GroupInfo(**i) for i in d["infos"]}
            self.sync_rounds = list(d["sync_rounds"])
            self.trained_gids = [int(g) for g in d["trained_gids"]]
            self.peak_rss = float(d["peak_rss"])
            self.decode_steps_before = {int(j): int(n) for j, n in d["decode_steps"].items()}
            self.resumes = list(d["resumes"])
        with restoring(where, "policy"):
            self.policy.load_state_dict(state["policy"])
        with restoring(where, "dispatcher"):
            self.dispatcher.load_state_dict(state["dispatcher"])
            regenerate = self.dispatcher.abandon_in_flight()
        with restoring(where, "queue"):
            self.queue.load_state_dict(state["queue"])
            self.results_by_gid = {e["group"].group_id.gid: e["group"] for e in state["queue"]["pending"]}
        with restoring(where, "recorder"):
            self.recorder.load_state_dict(state["recorder"], defer_files=True)  # metrics.jsonl: open_steps
            self.spans = {g.gid: g for g in self.recorder.groups}  # the latest span of each group
        if self.planner is not None:
            if not isinstance(state["planner"], dict):
                raise InputError("an asp run's checkpoint needs a planner section", path=str(where), key="planner")
            check_rollout_log(self.planner.rollout_log, state["planner"], where)
        with restoring(where, "rng"):
            check_rng_state(state["rng"])
        self.restored_rng = state["rng"]
        self.resumes.append({"from_version": self.version, "regenerate": len(regenerate),
                             "kept": self.queue.occupancy(), "checkpoint": self.resume_dir.name})
        self.recorder.event("resumed", version=self.version, regenerate=regenerate, kept=self.queue.occupancy())

    def _resume_weights(self) -> None:
        """The trainer takes the checkpoint's weights, optimizer and RNG; the instances, started from the model
        path, get the same weights under the checkpoint's version before the first dispatch."""
        from mindspeed_asp.runtime.checkpoint import trainer_file

        path = trainer_file(self.resume_dir)
        try:
            self.trainer.load_checkpoint(path)
        except (RuntimeError, ValueError, KeyError, EOFError) as exc:  # torch's unpickling and shape refusals
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RunError(f"checkpoint {path}: cannot restore the trainer ({first})") from exc
        if self.trainer.version != self.version:
            raise RunError(f"checkpoint {self.resume_dir}: trainer at version {self.trainer.version}, run state "
                           f"at {self.version}")
        sync = self.pool.sync(self.version, self.trainer.named_weights, verify=self.cfg.run.verify_weights)
        self.recorder.event("resume_sync", version=self.version, seconds=round(float(sync.get("seconds", 0.0)), 3),
                            verified=bool(sync.get("verified", False)))


def task_and_prompts(cfg: RunConfig):
    """The run's task and its PromptSet (the dataset a plan file must have been built for)."""
    from mindspeed_asp.runtime.demo_task import DemoTask
    from mindspeed_asp.types import PromptSet

    task = DemoTask(cfg.data.num_prompts, seed=cfg.data.seed, max_new_tokens=cfg.data.max_new_tokens)
    prompts = task.prompts()
    ps = PromptSet(prompt_ids=np.array([p[0] for p in prompts], dtype=object),
                   prompt_lens=np.array([len(p[1]) for p in prompts], dtype=np.int64), n=cfg.data.n,
                   origin=f"demo task (num_prompts={cfg.data.num_prompts}, seed={cfg.data.seed})")
    return task, ps


def run_training(cfg: RunConfig, out_dir: str | Path, progress: bool = True,
                 after_step: Optional[Callable[[Driver, Dict[str, Any]], None]] = None,
                 manage_ray: bool = True, resume: Optional[str | Path] = None) -> Dict[str, Any]:
    """Run one training run and return its summary (see Driver); `resume` is a checkpoint directory
    (`runtime.checkpoint.latest_checkpoint`) to continue from."""
    return Driver(cfg, out_dir, progress=progress, after_step=after_step, manage_ray=manage_ray,
                  resume=resume).run()
