"""A rollout instance: one Ray actor that owns one vLLM engine and works through its plan queue.

API (what the dispatcher and the driver call; all methods are Ray actor methods):

    RolloutInstance.options(...).remote(index, engine_config)   # or create_instance()/start_instances()
      .start() -> dict                      engine up; {"pid", "node_id", "platform", "start_seconds", ...}
      .submit(groups, stolen=False) -> int  append GroupRequests to the ordered queue; returns queue length
      .drain_finished() -> list[GroupResult]  groups finished since the last call (raises if the loop died)
      .status() -> dict                     queued, running_groups, running_seqs, finished_total, version,
                                            busy_seconds, steps, generated_tokens, paused, stolen_in,
                                            stolen_out, weight_syncs, error, loop_silent_s,
                                            weights_wait_s
      .steal_unstarted(k) -> list[GroupRequest]   remove up to k not-started groups (from the queue's tail)
      .pause() / .resume()                  stop / restart admitting queued groups (in-flight ones go on)
      .init_weight_sync(master_addr, master_port, rank_offset, world_size) -> dict
      .receive_weights(version, manifest, bucket_bytes=...) -> dict   joins one broadcast round
      .weights_checksum() -> dict[str, float]    per HF name, of the weights last received and loaded
      .set_version(v)                       version stamped on tokens generated from now on
      .shutdown()

`submit` takes `stolen=` so the thief's results carry `stolen=True`; `receive_weights` takes `bucket_bytes=`
(sender and receivers must plan the same buckets); `SampleResult` carries `token_versions` (the version in
force at each token's engine step).

Why the engine step loop: a background thread drives vLLM V1's `LLMEngine.add_request/step`, so
continuous batching spans queue entries (a new group is admitted as soon as slots free up, not when the
previous batch ends) and a weight update lands between two engine steps. Every token is stamped with
the version in force at the step that produced it. Groups are admitted while the engine runs fewer
than `slots` sequences (vLLM's `max_num_seqs` = B), so groups not yet admitted stay in this actor's
queue, in plan order, where the dispatcher can steal them.

The engine runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0): on CPU one process per instance, and
the weight-sync worker extension lives in the actor's own process.
"""
from __future__ import annotations

import collections
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple, Union

import ray

from mindspeed_asp.errors import ConfigError
from mindspeed_asp.runtime.platform import Platform, current_platform
from mindspeed_asp.runtime.ray_utils import actor_env
from mindspeed_asp.runtime.requests import EngineConfig, GroupRequest, GroupResult, SampleResult
from mindspeed_asp.runtime.weight_sync.buckets import DEFAULT_BUCKET_BYTES
from mindspeed_asp.runtime.weight_sync.communicators import DEFAULT_TIMEOUT_S

#: engine steps an instance keeps for `step_log` (the driver reads them once per plan window)
STEP_LOG_MAX = 20000
WORKER_EXTENSION = "mindspeed_asp.runtime.worker_extension.AspWorkerExtension"


@dataclass
class _Sample:
    token_ids: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    versions: List[int] = field(default_factory=list)
    finish_reason: Optional[str] = None


@dataclass
class _Running:
    req: GroupRequest
    t_enqueued: float
    t_started: float
    stolen: bool
    samples: List[_Sample]
    pending: int


def model_eos_token_id(model_path: str) -> Optional[int]:
    """EOS id from the model's generation/config JSON (vLLM ignores it without a tokenizer)."""
    for fname in ("generation_config.json", "config.json"):
        p = Path(model_path) / fname
        if p.exists():
            try:
                eos = json.loads(p.read_text()).get("eos_token_id")
            except ValueError:
                continue
            if isinstance(eos, list):
                eos = eos[0] if eos else None
            if eos is not None:
                return int(eos)
    return None


class RolloutInstanceImpl:
    """The actor's body (also usable in-process for debugging: it needs no Ray itself)."""

    def __init__(self, index: int, config: Union[EngineConfig, Dict[str, Any]],
                 platform_kind: Optional[str] = None) -> None:
        self.index = int(index)
        self.config = config if isinstance(config, EngineConfig) else EngineConfig(**config)
        if platform_kind:
            os.environ["ASP_PLATFORM"] = platform_kind
        self.platform: Platform = current_platform()
        self._engine: Any = None
        self._lock = threading.RLock()  # queue and bookkeeping
        self._engine_lock = threading.Lock()  # engine calls: step vs. weight load
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._queue: Deque[Tuple[GroupRequest, float, bool]] = collections.deque()
        self._running: Dict[str, _Running] = {}
        self._req_map: Dict[str, Tuple[str, int]] = {}
        self._running_seqs = 0
        self._finished: List[GroupResult] = []
        self._version = 0
        self._paused = False
        self._error: Optional[str] = None
        self._eos: Optional[int] = None
        self._vocab_size = 0
        self._prefix_caching = False
        self._prefix_reset_pending = False
        self._req_counter = 0
        # per engine step (active sequences, KV tokens, prefill tokens, seconds): the driver fits its cost
        # model online from these (runtime/online_cost.py); bounded, read with `step_log(since)`
        self._step_log: Deque[Tuple[int, int, int, float]] = collections.deque(maxlen=STEP_LOG_MAX)
        self._step_count = 0
        self._prefill_pending = 0
        self._stats = {"finished_total": 0, "busy_seconds": 0.0, "steps": 0, "generated_tokens": 0,
                       "stolen_in": 0, "stolen_out": 0, "weight_syncs": 0, "weight_sync_seconds": 0.0}
        self._start_info: Dict[str, Any] = {}
        # liveness of the step loop, for the driver's stall watch (runtime/stall_watch.py): when the loop
        # last came round (monotonic; None until it runs), and since when a weight load waits for the engine
        self._loop_beat: Optional[float] = None
        self._weights_wait_since: Optional[float] = None

    # ------------------------------------------------------------------------------------------ life
    def start(self) -> Dict[str, Any]:
        """Build the engine and start the step loop; idempotent."""
        if self._engine is not None:
            return self._start_info
        t0 = time.perf_counter()
        threads = int(os.environ.get("OMP_NUM_THREADS", "1") or 1)
        import torch

        torch.set_num_threads(max(1, threads))
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        cfg = self.config
        extra = dict(cfg.extra)
        extra.setdefault("logprobs_mode", "processed_logprobs")
        extra.setdefault("disable_log_stats", True)
        # Off by default: after a weight update, cached prompt blocks would hold KV computed by the old
        # weights, and vLLM can only drop them once no running request uses them (see receive_weights).
        extra.setdefault("enable_prefix_caching", False)
        try:
            args = EngineArgs(
                model=cfg.model_path,
                skip_tokenizer_init=True,
                enforce_eager=cfg.enforce_eager,
                dtype=cfg.dtype,
                max_model_len=cfg.max_model_len,
                max_num_seqs=cfg.slots,
                gpu_memory_utilization=cfg.gpu_memory_utilization,
                seed=cfg.seed,
                tensor_parallel_size=cfg.tensor_parallel_size,
                worker_extension_cls=WORKER_EXTENSION,
                **extra,
            )
        except TypeError as exc:
            raise ConfigError(f"invalid vLLM engine option: {exc}", key="engine.extra") from exc
        self._engine = LLMEngine.from_engine_args(args)
        self._eos = model_eos_token_id(cfg.model_path)
        self._vocab_size = int(getattr(self._engine.model_config, "get_vocab_size", lambda: 0)() or 0)
        self._prefix_caching = bool(extra["enable_prefix_caching"])
        t_warm = time.perf_counter()
        self._warmup()
        warmup_seconds = time.perf_counter() - t_warm
        self._loop_beat = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name=f"asp-instance-{self.index}", daemon=True)
        self._thread.start()
        self._start_info = {"index": self.index, "pid": os.getpid(), "platform": self.platform.kind,
                            "node_id": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None,
                            "start_seconds": time.perf_counter() - t0, "slots": cfg.slots,
                            "eos_token_id": self._eos, "workers": cfg.tensor_parallel_size,
                            "warmup_seconds": warmup_seconds}
        return self._start_info

    def _warmup(self) -> None:
        """Run one short request before serving: the first engine steps pay one-off kernel set-up costs
        (seconds on CPU) that would otherwise stall the first real groups and the first weight sync."""
        from vllm import SamplingParams

        self._engine.add_request("asp-warmup", {"prompt_token_ids": [2, 3, 4, 5]},
                                 SamplingParams(max_tokens=4, ignore_eos=True, logprobs=0, seed=0))
        while self._engine.has_unfinished_requests():
            self._engine.step()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._engine is not None:
            with self._engine_lock:
                try:
                    self._engine.collective_rpc("asp_close_weight_sync")
                except Exception:  # noqa: BLE001 - best-effort close of an engine being torn down
                    pass
                shutdown = getattr(self._engine, "shutdown", None)
                if callable(shutdown):
                    try:
                        shutdown()
                    except Exception:  # noqa: BLE001 - best-effort shutdown of an engine being torn down
                        pass
            self._engine = None

    # ---------------------------------------------------------------------------------------- queue
    def submit(self, groups: Sequence[GroupRequest], stolen: bool = False) -> int:
        """Append groups to the queue in order; a group the engine could never run is refused here."""
        for g in groups:
            self._validate(g)
        now = time.time()
        with self._lock:
            for g in groups:
                self._queue.append((g, now, bool(stolen)))
            if stolen:
                self._stats["stolen_in"] += len(groups)
            n = len(self._queue)
        self._wake.set()
        return n

    def steal_unstarted(self, k: int) -> List[GroupRequest]:
        """Remove up to `k` groups that have not been admitted to the engine, from the queue's tail."""
        with self._lock:
            taken = []
            while self._queue and len(taken) < max(0, int(k)):
                taken.append(self._queue.pop()[0])
            self._stats["stolen_out"] += len(taken)
        taken.reverse()
        return taken

    def drain_finished(self) -> List[GroupResult]:
        with self._lock:
            out, self._finished = self._finished, []
            err = self._error
        if err and not out:
            raise RuntimeError(f"rollout instance {self.index} failed: {err}")
        return out

    def pause(self) -> None:
        with self._lock:
            self._paused = True

    def resume(self) -> None:
        with self._lock:
            self._paused = False
        self._wake.set()

    def status(self) -> Dict[str, Any]:
        """Counters and state; `loop_silent_s` (seconds since the step loop last came round, 0 before it
        runs or after it ended) and `weights_wait_s` (seconds a weight load has waited for the engine to
        finish its step, 0 when none waits) tell a hung engine from a busy one."""
        now = time.monotonic()
        beat, wait_since = self._loop_beat, self._weights_wait_since
        alive = self._thread is not None and self._thread.is_alive()
        with self._lock:
            return dict(self._stats, index=self.index, queued=len(self._queue),
                        running_groups=len(self._running), running_seqs=self._running_seqs,
                        version=self._version, paused=self._paused, error=self._error,
                        prefix_reset_pending=self._prefix_reset_pending,
                        started=self._engine is not None,
                        loop_silent_s=now - beat if alive and beat is not None else 0.0,
                        weights_wait_s=now - wait_since if wait_since is not None else 0.0)

    # -------------------------------------------------------------------------------------- weights
    def set_version(self, v: int) -> None:
        with self._engine_lock:
            self._version = int(v)

    def init_weight_sync(self, master_addr: str, master_port: int, rank_offset: int, world_size: int,
                         timeout_s: float = DEFAULT_TIMEOUT_S) -> Dict[str, Any]:
        self._require_engine()
        with self._engine_lock:
            reps = self._engine.collective_rpc(
                "asp_init_weight_sync",
                args=(self.platform.kind, master_addr, int(master_port), int(rank_offset), int(world_size),
                      float(timeout_s)))
        self._loop_beat = time.monotonic()  # the loop waited for the group's join, not for a hung step
        return {"workers": reps}

    def receive_weights(self, version: int, manifest: Sequence[Tuple[str, Tuple[int, ...], str]],
                        bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Dict[str, Any]:
        """Join one broadcast round between two engine steps; afterwards tokens carry `version`."""
        self._require_engine()
        t0 = time.perf_counter()
        self._weights_wait_since = time.monotonic()
        with self._engine_lock:
            self._weights_wait_since = None
            t_locked = time.perf_counter()
            reps = self._engine.collective_rpc("asp_receive_weights",
                                               args=(int(version), list(manifest), int(bucket_bytes)))
            reset = self._reset_prefix_cache()
            self._version = int(version)
        self._loop_beat = time.monotonic()  # the loop waited for this load, not for a hung step
        dt = time.perf_counter() - t0
        with self._lock:
            self._stats["weight_syncs"] += 1
            self._stats["weight_sync_seconds"] += dt
        return {"index": self.index, "version": int(version), "seconds": dt,
                "wait_for_step_seconds": t_locked - t0, "prefix_cache_reset": reset, "workers": reps}

    def _reset_prefix_cache(self) -> bool:
        """Drop cached prompt blocks after an update (caller holds the engine lock).

        vLLM refuses while running requests hold blocks; the reset is then retried before every
        admission until it succeeds, and `status()["prefix_reset_pending"]` says so. Until then a new
        request may reuse a prompt block computed by the previous weights (only with prefix caching on).
        """
        if not self._prefix_caching:
            self._prefix_reset_pending = False
            return True
        ok = bool(self._engine.reset_prefix_cache())
        self._prefix_reset_pending = not ok
        return ok

    def weights_checksum(self) -> Dict[str, float]:
        self._require_engine()
        with self._engine_lock:
            return self._engine.collective_rpc("asp_weights_checksum")[0]

    # ----------------------------------------------------------------------------------------- loop
    def _validate(self, g: GroupRequest) -> None:
        if len(g.prompt_token_ids) >= self.config.max_model_len:
            raise ValueError(f"group {g.group_id}: prompt of {len(g.prompt_token_ids)} tokens does not fit "
                             f"max_model_len {self.config.max_model_len}")
        vocab = self._vocab_size
        if vocab and (max(g.prompt_token_ids) >= vocab or min(g.prompt_token_ids) < 0):
            raise ValueError(f"group {g.group_id}: prompt token ids must lie in [0, {vocab})")

    def _require_engine(self) -> None:
        if self._engine is None:
            raise RuntimeError(f"rollout instance {self.index} not started: call start() first")

    def _sampling_params(self, g: GroupRequest, i: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        stop_ids = list(g.stop_token_ids)
        if not g.ignore_eos and self._eos is not None and self._eos not in stop_ids:
            stop_ids.append(self._eos)
        # sample i's own bounds: its imposed length as min = max (GroupRequest.sample_lengths), else the group's
        lo, hi = g.sample_limits(i)
        return SamplingParams(n=1, max_tokens=hi, min_tokens=lo, temperature=g.temperature,
                              seed=None if g.seed is None else g.seed + i, ignore_eos=g.ignore_eos,
                              stop_token_ids=stop_ids, logprobs=0, output_kind=RequestOutputKind.DELTA)

    def _admit(self) -> None:
        """Move queued groups into the engine while it runs fewer than `slots` sequences."""
        if self._prefix_reset_pending:
            with self._engine_lock:
                self._reset_prefix_cache()
        while True:
            with self._lock:
                if self._paused or not self._queue or self._running_seqs >= self.config.slots:
                    return
                g, t_enq, stolen = self._queue.popleft()
                self._running[g.group_id] = _Running(g, t_enq, time.time(), stolen,
                                                     [_Sample() for _ in range(g.n)], g.n)
                self._running_seqs += g.n
                self._prefill_pending += g.n * len(g.prompt_token_ids)
            for i in range(g.n):
                self._req_counter += 1
                rid = f"{g.group_id}#{i}#{self._req_counter}"
                with self._lock:
                    self._req_map[rid] = (g.group_id, i)
                with self._engine_lock:
                    self._engine.add_request(rid, {"prompt_token_ids": list(g.prompt_token_ids)},
                                             self._sampling_params(g, i))

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._loop_beat = time.monotonic()
                self._admit()
                if not self._running:
                    self._wake.wait(timeout=0.05)
                    self._wake.clear()
                    continue
                active, kv, prefill = self._step_load()
                with self._engine_lock:
                    version = self._version
                    t0 = time.perf_counter()
                    outputs = self._engine.step()
                    dt = time.perf_counter() - t0
                with self._lock:
                    self._step_log.append((active, kv, prefill, dt))
                    self._step_count += 1
                self._collect(outputs, version, dt)
        except Exception as exc:  # noqa: BLE001 - surfaced through status() and drain_finished()
            import traceback

            with self._lock:
                self._error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"

    def _step_load(self) -> Tuple[int, int, int]:
        """What the next engine step runs: sequences, KV tokens they hold, prompt tokens admitted since the
        last step (its prefill)."""
        with self._lock:
            kv = 0
            for run in self._running.values():
                plen = len(run.req.prompt_token_ids)
                kv += sum(plen + len(s.token_ids) for s in run.samples if s.finish_reason is None)
            prefill, self._prefill_pending = self._prefill_pending, 0
            return self._running_seqs, kv, prefill

    def step_log(self, since: int = 0) -> Tuple[int, List[Tuple[int, int, int, float]]]:
        """Engine steps numbered `since` and later still held: (next `since`, [(active, kv_tokens,
        prefill_tokens, seconds)])."""
        with self._lock:
            total = self._step_count
            held = len(self._step_log)
            first = total - held
            start = max(int(since), first)
            rows = list(self._step_log)[start - first:]
            return total, rows

    def _collect(self, outputs: Sequence[Any], version: int, dt: float) -> None:
        now = time.time()
        new_tokens = 0
        with self._lock:
            self._stats["steps"] += 1
            self._stats["busy_seconds"] += dt
            for out in outputs:
                key = self._req_map.get(out.request_id)
                if key is None:
                    continue
                gid, i = key
                run = self._running[gid]
                s = run.samples[i]
                comp = out.outputs[0]
                toks = list(comp.token_ids)
                s.token_ids.extend(toks)
                lps = comp.logprobs or []
                for j, tok in enumerate(toks):
                    entry = lps[j] if j < len(lps) else None
                    s.logprobs.append(float(entry[tok].logprob) if entry and tok in entry else float("nan"))
                s.versions.extend([version] * len(toks))
                new_tokens += len(toks)
                if out.finished:
                    s.finish_reason = comp.finish_reason or "stop"
                    del self._req_map[out.request_id]
                    run.pending -= 1
                    self._running_seqs -= 1
                    if run.pending == 0:
                        self._finish_group(run, now)
            self._stats["generated_tokens"] += new_tokens

    def _finish_group(self, run: _Running, now: float) -> None:
        samples = [SampleResult(token_ids=s.token_ids, logprobs=s.logprobs,
                                min_version=min(s.versions) if s.versions else self._version,
                                max_version=max(s.versions) if s.versions else self._version,
                                finish_reason=s.finish_reason or "stop", token_versions=s.versions)
                   for s in run.samples]
        g = run.req
        self._finished.append(GroupResult(group_id=g.group_id, prompt_id=g.prompt_id, instance=self.index,
                                          samples=samples, prompt_token_ids=list(g.prompt_token_ids),
                                          t_enqueued=run.t_enqueued, t_started=run.t_started,
                                          t_finished=now, stolen=run.stolen, minibatch=g.minibatch))
        del self._running[g.group_id]
        self._stats["finished_total"] += 1


#: The Ray actor. Threaded (max_concurrency > 1) so status/drain/steal/weights calls run while the
#: engine loop works in its background thread. Callers set resources with `.options()` or use
#: `create_instance`, which does it from the platform.
RolloutInstance = ray.remote(max_concurrency=16)(RolloutInstanceImpl)


def create_instance(index: int, config: EngineConfig, platform: Optional[Platform] = None,
                    num_cpus: float = 1.0, threads: int = 1, env: Optional[Dict[str, str]] = None,
                    loopback: bool = True, scheduling_strategy: Any = None, actor_cls: Any = None) -> Any:
    """An instance actor with the platform's resources and one-thread environment (not started yet).

    `loopback=False` for a cluster of several hosts (see `actor_env`); `scheduling_strategy` places it (the
    rollout pool passes its placement-group bundle); `actor_cls` is another actor class with this API.
    """
    platform = platform or current_platform()
    env_vars = actor_env(platform, threads=threads, loopback=loopback)
    env_vars.update(env or {})
    opts: Dict[str, Any] = dict(num_cpus=num_cpus, runtime_env={"env_vars": env_vars},
                                name=None, max_restarts=0)
    opts.update(platform.ray_actor_resources(config.tensor_parallel_size))
    if scheduling_strategy is not None:
        opts["scheduling_strategy"] = scheduling_strategy
    return (actor_cls or RolloutInstance).options(**opts).remote(index, config, platform.kind)


def start_instances(configs: Sequence[EngineConfig], platform: Optional[Platform] = None,
                    timeout_s: float = 300.0, retries: int = 1, num_cpus: float = 1.0, threads: int = 1,
                    env: Optional[Dict[str, str]] = None) -> Tuple[List[Any], List[Dict[str, Any]]]:
    """Create and start one instance per config, one after another, each with a timeout and retries.

    Sequential because two vLLM instances started at the same moment can hang at start-up on a small
    host; a start that exceeds `timeout_s` kills that actor and tries a fresh one.
    """
    actors, infos = [], []
    for i, cfg in enumerate(configs):
        last_exc: Optional[BaseException] = None
        for attempt in range(retries + 1):
            actor = create_instance(i, cfg, platform, num_cpus=num_cpus, threads=threads, env=env)
            try:
                info = ray.get(actor.start.remote(), timeout=timeout_s)
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as exc:
                last_exc = exc
                ray.kill(actor, no_restart=True)
                continue
            info["attempts"] = attempt + 1
            actors.append(actor)
            infos.append(info)
            break
        else:
            for a in actors:
                ray.kill(a, no_restart=True)
            raise RuntimeError(f"rollout instance {i} did not start within {timeout_s:.0f} s after "
                               f"{retries + 1} attempts: {last_exc}")
    return actors, infos
