"""The run loop of the asynchronous runtime, one code path for the three modes (docs/design.md#runtime-loop).

- `stock`: MindSpeed-RL's default schedule. Iteration k takes the next M groups in dataset order, cuts them
  into contiguous chunks (one per instance), waits for the slowest instance, trains, syncs weights.
- `async`: multi-instance and bounded lag, no plan: groups go in dataset order to the least-loaded
  instance whenever the max-lag counter admits them; the trainer consumes finished groups as they arrive.
- `asp`: the same, but every window of groups is placed by the offline planner from the length history
  (re-planned as observed lengths come in), each instance pulls its own plan queue, and an instance that
  drains steals not-started groups from the most loaded queue.

One driver process owns the rollout control (`runtime/rollout_control.py`: max-lag policy, dispatcher and
sample queue, the same one the MindSpeed-RL integration's rollout driver uses), the window feed
(`runtime/window_feed.py`: which groups load next, planned how) and the reference trainer; the rollout
instances are Ray actors, held by a `RolloutPool` (placement, liveness, submit/poll, the weight-sync group),
that generate in their own background loops while the driver polls them. Every trained sample's lag is
audited and logged, each sync is verified by checksums, versions increase by one per update, and a dead
instance's groups are re-dispatched to the others (the sync group is re-formed without it); no group is
trained twice.

Checkpoints and signals (docs/runtime.md, "Checkpoints, resume and signals"): every `run.checkpoint_every`
updates and whenever the run stops, the driver writes its whole state (`runtime/run_state.py`); SIGINT or
SIGTERM stops the loop after the current update (`runtime/stop_signals.py`), and `resume=` continues a run
from its latest checkpoint: the groups that were still generating are generated again, everything else goes on.
"""
from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from mindspeed_asp.errors import RunError
from mindspeed_asp.core.metrics import split_devices
from mindspeed_asp.utils.run_report import StartupProgress
from mindspeed_asp.runtime.engine_steps import EngineStepLog
from mindspeed_asp.runtime.run_recorder import GroupSpan, RunRecorder
from mindspeed_asp.runtime.ray_utils import RaySession
from mindspeed_asp.runtime.rollout_control import RolloutControl
from mindspeed_asp.runtime.rollout_pool import CALL_TIMEOUT_S, RolloutPool, engine_config
from mindspeed_asp.runtime.run_config import RunConfig
from mindspeed_asp.runtime.stall_watch import EngineStalled, StallWatch
from mindspeed_asp.runtime.step_record import StepTimes, bar_postfix, step_record
from mindspeed_asp.runtime.tasks import Task, task_and_prompts
from mindspeed_asp.runtime.stop_signals import StopSignals
from mindspeed_asp.runtime.requests import RequestId
from mindspeed_asp.runtime.window_feed import WindowFeed, load_plan_file

if TYPE_CHECKING:
    from mindspeed_asp.runtime.platform import Platform
    from mindspeed_asp.runtime.replan import WindowPlanner
    from mindspeed_asp.runtime.trainer import GRPOTrainer
    from mindspeed_asp.scheduler.plan_file import DispatchPlan
    from mindspeed_asp.core.problem import PromptSet

POLL_S = 0.05
#: vLLM's per-request INFO lines would bury the progress bar; warnings and errors still show.
QUIET_ENV = {"VLLM_LOGGING_LEVEL": "WARNING"}


def _progress(total: int, enabled: bool, initial: int = 0):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc="train", unit="step", file=sys.stderr, disable=not enabled,
                leave=True, dynamic_ncols=True)


class Driver:
    """Runs one training run of `cfg` (mode from `cfg.asp.mode`) and writes everything under `out_dir`.

    `pool`: a started pool handed over by an earlier run of the same engine config (benchmarks run many short
    runs; starting vLLM takes minutes on a loaded CPU host): adopted, reset to this run's initial weights at
    version 0, and kept running afterwards (`keep_pool`) for the next run.
    """

    def __init__(self, cfg: RunConfig, out_dir: str | Path, progress: bool = True,
                 after_step: Optional[Callable[["Driver", Dict[str, Any]], None]] = None,
                 manage_ray: bool = True, resume: Optional[str | Path] = None,
                 handle_signals: bool = True, pool: Optional[RolloutPool] = None,
                 keep_pool: bool = False) -> None:
        self.cfg = cfg
        self.mode = cfg.asp.mode
        self.M = cfg.asp.minibatch_groups
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.progress = progress
        self.after_step = after_step
        self.manage_ray = manage_ray
        self.version = 0
        self.sync_rounds: List[Dict[str, Any]] = []
        self.spans: Dict[int, GroupSpan] = {}  # the latest span of each finished group
        self.steals_logged = 0  # dispatcher.steals already written to the trace
        self.peak_rss = 0.0
        # admission, dispatch, finished groups and minibatches: one rollout control, shared with the
        # MindSpeed-RL rollout driver
        self.control = RolloutControl(self.mode, cfg.asp.instances, cfg.asp.max_lag, self.M, cfg.asp.slots,
                                      cfg.data.n, work_stealing=cfg.asp.work_stealing,
                                      stale_policy=cfg.asp.stale_policy)
        # built by _setup: the config-derived parts before Ray starts, the pool and the trainer once it is up
        self.platform: Optional[Platform] = None
        self.model_path = ""
        self.task: Optional[Task] = None
        self.prompt_set: Optional[PromptSet] = None
        self.prompt_list: List[Any] = []
        self.recorder: Optional[RunRecorder] = None
        self.planner: Optional[WindowPlanner] = None
        self.plan_file: Optional[DispatchPlan] = None
        self.feed: Optional[WindowFeed] = None
        self.engine_steps: Optional[EngineStepLog] = None
        self.ray_session = RaySession(cfg.run.ray_address, num_cpus=cfg.run.ray_num_cpus,
                                      object_store_mb=cfg.run.ray_object_store_mb, env=QUIET_ENV)
        self.pool: Optional[RolloutPool] = None
        self.shared_pool = pool
        self.keep_pool = bool(keep_pool or pool is not None)
        self.startup: Optional[StartupProgress] = None  # start-up lines on stderr (mindspeed_asp/utils/run_report.py)
        self.trainer: Optional[GRPOTrainer] = None
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
        """Everything before the loop: the config's parts (and a checkpoint's state) before Ray starts, then
        Ray, the instances, the trainer, the first weights; the run's files are cut back only at the end."""
        resumed = self._build_parts()
        self._start_ray()
        if self.shared_pool is not None:
            self._adopt_pool(self.shared_pool, resumed is not None)
        else:
            cfg = self.cfg
            self.pool = RolloutPool(engine_config(self.cfg, self.model_path), cfg.asp.instances, self.platform,
                                    threads=cfg.run.instance_threads, start_timeout_s=cfg.run.start_timeout_s,
                                    multi_node=cfg.run.ray_address is not None, on_death=self._on_instance_death,
                                    event=self.recorder.event, progress=self.startup,
                                    alive=self.control.dispatcher.alive, sync_timeout_s=cfg.run.sync_timeout_s)
            self.pool.start()
        self.engine_steps.pool = self.pool
        self._start_trainer(resumed is not None)
        if resumed is not None:
            from mindspeed_asp.runtime.checkpoint import STATE_FILE, restoring, set_rng_state

            # the run proceeds: only now are the run's files cut back to the checkpoint (rollout log, metrics)
            if self.planner is not None:
                with restoring(self.resume_dir / STATE_FILE, "planner"):
                    self.planner.load_state_dict(resumed["planner"])
            set_rng_state(self.restored_rng)
            self.recorder.continue_clock()
        self.task.to_jsonl(self.out / "dataset.jsonl")
        self.recorder.open_steps()

    def _build_parts(self) -> Optional[Dict[str, Any]]:
        """Model, task, recorder, plan file, planner, window feed; a checkpoint's state when resuming (checked
        whole before anything in the run directory changes). Returns that state, or None."""
        from mindspeed_asp.runtime.platform import current_platform, platform_from_name
        from mindspeed_asp.runtime.tiny_model import run_model_path

        cfg = self.cfg
        self.startup = StartupProgress(cfg.asp.instances, enabled=self.progress)
        self.platform = platform_from_name(cfg.run.platform) if cfg.run.platform else current_platform()
        self.model_path = run_model_path(cfg.model)
        self.startup.model_ready(self.model_path)
        self.task, self.prompt_set = task_and_prompts(cfg, self.model_path)
        self.prompt_list = self.task.prompts()
        # e2e_tps over every device the run uses: one per instance plus the trainer's (docs/design.md#e2e_tps)
        self.recorder = RunRecorder(self.out, mode=self.mode, instances=cfg.asp.instances, slots=cfg.asp.slots,
                                    minibatch_groups=self.M, max_lag=self.control.max_lag, clock=time.time,
                                    target_reward=cfg.run.target_reward,
                                    devices=split_devices(cfg.asp.instances, 1, cfg.trainer.devices))
        if self.mode == "asp" and cfg.asp.plan_path:
            self.plan_file = load_plan_file(cfg, self.prompt_set)
        if self.mode == "asp":
            from mindspeed_asp.runtime.replan import WindowPlanner

            self.planner = WindowPlanner(cfg.asp, self.prompt_set, cfg.data.max_new_tokens, cfg.asp.instances,
                                         rollout_log=self.out / "rollout_log.jsonl", seed=cfg.run.seed)
        self.engine_steps = EngineStepLog(self.planner)
        self.feed = WindowFeed(cfg, self.control, self.prompt_list, self.planner, self.plan_file,
                               self.engine_steps, finished=lambda gid: gid in self.spans, event=self.recorder.event)
        if self.resume_dir is None:
            return None
        from mindspeed_asp.runtime.checkpoint import load_state
        from mindspeed_asp.runtime.run_state import restore_state

        resumed = load_state(self.resume_dir)  # hashes verified, keys and types checked
        restore_state(self, resumed)
        return resumed

    def _start_ray(self) -> None:
        """Ray (a local one, or the cluster of run.ray_address), with a signal during its start honoured once
        it is whole; its GCS watched: Ray ends a driver whose GCS is gone about 60 s later, from C++, so the run
        stops first at its next safe point with a checkpoint and a summary, as after a SIGTERM."""
        if self.manage_ray:
            self.ray_session.platform = self.platform
            if self.handle_signals:
                with self.stop.shielded():
                    self.ray_session.open()
            else:
                self.ray_session.open()
        self.ray_session.watch(self.stop.request_stop)

    def _start_trainer(self, resuming: bool) -> None:
        """The reference trainer, the weight-sync group, the first weights (a checkpoint's, or version 0 for
        an adopted pool) and the engines' warm-up."""
        from mindspeed_asp.runtime.trainer import trainer_from_config

        cfg = self.cfg
        self.trainer = trainer_from_config(cfg, self.model_path)
        self.pool.open_sync_group()
        if resuming:
            self._resume_weights()
        elif self.shared_pool is not None:  # the previous run's weights and version go: version 0 = the model's
            self.pool.sync(0, self.trainer.named_weights, verify=cfg.run.verify_weights)
        self.pool.warmup(self.prompt_list[0][1], timeout_s=cfg.run.start_timeout_s)

    def _resume_weights(self) -> None:
        from mindspeed_asp.runtime.run_state import resume_weights

        resume_weights(self)

    def _adopt_pool(self, pool: RolloutPool, resuming: bool) -> None:
        """Take over a started pool (`RolloutPool.adopt`): its liveness list becomes the dispatcher's."""
        if resuming:
            raise RunError("a resumed run starts its own rollout instances (no shared pool)")
        pool.adopt(engine_config(self.cfg, self.model_path), self.cfg.asp.instances, self._on_instance_death,
                   self.recorder.event, self.startup, self.cfg.run.sync_timeout_s, self.cfg.run.start_timeout_s)
        self.pool = pool
        self.control.dispatcher.alive = pool.alive
        # engine steps before this run are not its own (the summary counts this run's decode steps only)
        self.decode_steps_before = {j: -n for j, n in pool.decode_steps().items()}

    # ================================================================== main loop
    def run(self) -> Dict[str, Any]:
        """Run `run.steps` updates; returns the summary dict (also written to summary.json).

        The Ray it started (a local one) is stopped afterwards; an existing cluster (`run.ray_address`) is
        only disconnected from, and a Ray this process already had is left as it was.
        """
        from mindspeed_asp.utils.run_dir import lock_run_dir

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
        self.engine_steps.mark_start()  # the warm-up's steps are not the run's
        try:
            while self.version < cfg.run.steps:
                if self.stop.requested is not None:  # SIGINT/SIGTERM: a safe point, between two updates
                    break
                self.feed.ensure_loaded(self.version)
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

    # ------------------------------------------------------------------ dispatch and polling
    def _dispatch(self) -> None:
        """Hand out what the rollout control admits at the current version, one request per group."""
        from mindspeed_asp.runtime.requests import GroupRequest

        admission = self.control.admit(self.version)  # stock: its M groups; streaming: what the lag admits
        for gid in admission.regenerated:  # stale groups sent back to the front, counted by the queue
            self.recorder.event("regenerate", gid=gid)
        if not admission.picks:
            return
        by_inst: Dict[int, List[Any]] = defaultdict(list)
        for j, t in admission.picks:
            info = self.feed.infos[t.gid]
            info.dispatch_version = self.version
            pid, ids, _ = self.prompt_list[info.prompt_index]
            limits = self.task.limits(info.prompt_index, info.epoch)  # the task's lengths (replay: imposed)
            by_inst[j].append(GroupRequest(
                group_id=RequestId(t.gid, t.attempt), prompt_id=pid, prompt_token_ids=list(ids), n=self.cfg.data.n,
                temperature=self.cfg.data.temperature, seed=self.cfg.run.seed * 1_000_003 + t.gid * 101 + t.attempt,
                stop_token_ids=[self.task.eos_token_id], minibatch=int(self.feed.minibatch_tag.get(t.gid, -1)),
                **limits.request_fields()))
        for j, reqs in by_inst.items():
            self.pool.submit(j, reqs)  # an unreachable instance is marked dead: its groups go back to the queue
        steals = self.control.dispatcher.steals
        for s in steals[self.steals_logged:]:
            self.recorder.event("steal", thief=s.thief, victim=s.victim, gid=s.gid)
        self.steals_logged = len(steals)

    def _poll(self) -> int:
        """Collect finished groups from every live instance; returns how many arrived."""
        got = 0
        for j, res in self.pool.poll():
            got += self._accept_result(j, res)
        if got:
            self.recorder.queue(self.control.queue.occupancy())
        return got

    def _accept_result(self, j: int, res: Any) -> int:
        gid = res.group_id.gid
        if not self.control.finish(j, res):
            self.recorder.event("late_result_refused", instance=j, gid=gid)
            return 0
        info = self.feed.infos[gid]
        lengths = [len(s.token_ids) for s in res.samples]
        t0 = self.recorder.t0
        span = GroupSpan(instance=j, gid=gid, submit=float(res.t_enqueued) - t0, start=float(res.t_started) - t0,
                         end=float(res.t_finished) - t0, prompt_tokens=len(res.prompt_token_ids) * len(res.samples),
                         response_tokens=int(sum(lengths)), sample_lengths=lengths,
                         version=min(int(s.min_version) for s in res.samples),
                         window=info.window if self.mode == "stock" else 0)
        self.recorder.group(span)
        self.spans[gid] = span
        if self.planner is not None:
            self.planner.observe(res.prompt_id, info.epoch, lengths, gid=gid, instance=j)
        return 1

    def _on_instance_death(self, j: int, exc: BaseException) -> None:
        """The pool lost instance j (others live): its in-flight and queued groups go to the live ones, and
        results it may still deliver are refused, so each group is trained exactly once."""
        lost = self.control.instance_dead(j)
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
        self.feed.plan_ahead()  # starts the next window's search on the planning thread (returns at once)
        time.sleep(POLL_S)
        in_flight = self.control.dispatcher.in_flight_count()
        if in_flight > 0:
            self.recorder.trainer_starved(t0 - self.recorder.t0, time.time() - self.recorder.t0)
        if self.t_last_step is not None and time.time() - self.t_last_step > self.cfg.run.step_timeout_s:
            raise RunError(f"no update for {self.cfg.run.step_timeout_s:.0f} s (run.step_timeout_s): "
                           f"{in_flight} groups in flight, {self.control.queue.occupancy()} queued")

    # ------------------------------------------------------------------ training
    def _try_train(self) -> bool:
        if self.t_last_step is None:
            self.t_last_step = time.time()
        batch = self.control.next_minibatch(self.version)  # None while a group still generating is due
        if batch is None:
            return False
        self._train(batch)
        return True

    def _train(self, batch: List[Any]) -> None:
        """One update: rewards, the trainer's step, the weight sync to every instance, the step's record."""
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
        times = StepTimes(self.t_last_step, t_ready, t_trained, time.time())
        if self.planner is not None:  # trainer seconds of this update (train + sync), for the measured rho
            self.planner.add_update((t_trained - t_ready) + float(sync.get("seconds", 0.0)))
        queue = self.control.queue
        lags = queue.log_rows[-1].lags
        gids = [g.group_id.gid for g in batch]
        for g in gids:
            self.spans[g].trained = True
        rec = step_record(step, self.version, times, self.recorder.t0, stats, sync, rewards, gids, queue.counters(),
                          self.control.dispatcher.in_flight_count(), self.recorder.devices)
        self._sample_memory()
        rec["memory/rss_gib"] = self.peak_rss
        self.recorder.log_step(rec, lags)
        self.recorder.queue(queue.occupancy())
        self.t_last_step = times.end
        self.bar.update(1)
        self.bar.set_postfix(**bar_postfix(rec, lags))
        if self.after_step is not None:
            self.after_step(self, rec)

    def _sample_memory(self) -> None:
        from mindspeed_asp.runtime.process_memory import rss_gib

        now = rss_gib(self.pool.pids)
        if now is not None:
            self.peak_rss = max(self.peak_rss, now)

    # ================================================================== finish
    def _finish(self) -> Dict[str, Any]:
        from mindspeed_asp.runtime.run_state import decode_steps_total, summary_fields

        steps = decode_steps_total(self)
        if steps:
            self.recorder.decode_steps = steps
        if self.planner is not None:
            self.planner.save_history(self.out / "length_history.jsonl")
        self.engine_steps.write(self.out / "engine_steps.jsonl")
        summary = self.recorder.write(summary_fields(self))
        if self.cfg.run.plots:
            from mindspeed_asp.runtime.run_plots import plot_run

            plot_run(self.out)
        return summary

    def _shutdown(self) -> None:
        if self.feed is not None:
            self.feed.shutdown()
        if self.ray_session.lost is not None:
            self.pool = None  # no GCS to ask: its actors go with Ray's processes (RaySession.close, stop_local_ray)
        if self.pool is not None and not (self.keep_pool and self.stop.requested is None):
            self.pool.shutdown(graceful=not self.stop.aborted)  # a second signal: kill, do not ask
        if self.recorder is not None:
            self.recorder.close()

    # ================================================================== checkpoints
    def _save_checkpoint(self) -> None:
        """Write the run's whole state as its latest checkpoint (atomic; runtime/checkpoint.py). Groups in
        flight are saved as such and generated again by a resumed run."""
        from mindspeed_asp.runtime.checkpoint import write_checkpoint
        from mindspeed_asp.runtime.run_state import build_state

        self.recorder.event("checkpoint", version=self.version, in_flight=self.control.dispatcher.in_flight_count(),
                            queued=self.control.queue.occupancy(), signal=self.stop.requested_name)
        self.checkpoint_dir = write_checkpoint(self.out, build_state(self), self.trainer)


def run_training(cfg: RunConfig, out_dir: str | Path, progress: bool = True,
                 after_step: Optional[Callable[[Driver, Dict[str, Any]], None]] = None,
                 manage_ray: bool = True, resume: Optional[str | Path] = None) -> Dict[str, Any]:
    """Run one training run and return its summary (see Driver); `resume` is a checkpoint directory
    (`runtime.checkpoint.latest_checkpoint`) to continue from."""
    return Driver(cfg, out_dir, progress=progress, after_step=after_step, manage_ray=manage_ray,
                  resume=resume).run()
