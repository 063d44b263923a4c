"""The rollout instances of one run: placement, start-up, submit/poll, liveness and the weight-sync group.

Why a class of its own: the driver decides what to dispatch and when to train; everything about the Ray
actors themselves (where they run, whether they are alive, how to reach them, the weight-sync group over
the live ones) is here, with one liveness list (`alive`). A call that fails on an instance marks it dead
once, tells the driver (`on_death`, which re-dispatches its groups) and re-forms the sync group without it.

Placement (docs/runtime.md, "Rollout pool and placement"): one Ray placement group per run with one bundle
per instance (`{"CPU": 1}` plus the instance's accelerators), strategy SPREAD. Reserving every bundle before
the first vLLM start makes a cluster that cannot hold `asp.instances` fail fast with a named error instead of
an actor pending forever; SPREAD puts instances on different nodes where the cluster has several (rollout
instances never talk to each other, so spreading costs nothing and shares host memory and cores out), and
still packs them onto one node when only one fits. A retried start reuses the same bundle.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from mindspeed_asp.errors import RunError, WeightSyncError
from mindspeed_asp.utils.run_report import StartupProgress
from mindspeed_asp.runtime.platform import Platform
from mindspeed_asp.runtime.requests import EngineConfig, GroupRequest
from mindspeed_asp.runtime.weight_sync.communicators import DEFAULT_TIMEOUT_S

POLL_S = 0.05
#: Deadline of one submit / drain / status call on a live instance; past it the instance counts as dead.
CALL_TIMEOUT_S = 60.0
PLACEMENT_STRATEGY = "SPREAD"


def instance_bundle(platform: Platform, devices: int, num_cpus: float = 1.0) -> Dict[str, float]:
    """The placement-group bundle of one instance: its CPU and, off CPU, its `devices` accelerators."""
    bundle: Dict[str, float] = {"CPU": float(num_cpus)}
    res = platform.ray_actor_resources(devices)
    if "num_gpus" in res:
        bundle["GPU"] = float(res["num_gpus"])
    bundle.update({k: float(v) for k, v in res.get("resources", {}).items()})
    return bundle


def engine_config(cfg: Any, model_path: str) -> EngineConfig:
    """The engine every instance of a standalone run (`RunConfig` `cfg`) starts with."""
    return EngineConfig(model_path=model_path, slots=cfg.asp.slots, max_model_len=cfg.model.max_model_len,
                        dtype=cfg.model.dtype, gpu_memory_utilization=cfg.model.memory_fraction, seed=cfg.run.seed)


class RolloutPool:
    """`count` rollout instances of `engine`, placed by Ray, with their liveness and weight-sync group.

    `on_death(j, exc)` runs when instance j is found dead while others live (the driver re-dispatches its
    groups there); `event(kind, **fields)` records what happened (instance starts). `multi_node` is True on
    an existing cluster: the sync group then meets at this node's IP instead of the loopback address.
    `actor_cls` is the actor class (default `RolloutInstance`; a test may pass a lighter one with its API).
    `progress` tells the user which instance is starting and when each is ready (a vLLM start takes a minute).
    `alive` is the run's one liveness list when the caller shares it (the driver passes its dispatcher's, so
    the instance the pool marks dead is at once the instance the dispatcher stops feeding); else the pool's own.
    `sync_timeout_s` bounds one weight-sync round (joining the group, each broadcast, each instance's load).
    """

    def __init__(self, engine: EngineConfig, count: int, platform: Platform, *, threads: int = 1,
                 start_timeout_s: float = 180.0, multi_node: bool = False,
                 on_death: Optional[Callable[[int, BaseException], None]] = None,
                 event: Optional[Callable[..., None]] = None, actor_cls: Any = None,
                 progress: Optional[StartupProgress] = None, alive: Optional[List[bool]] = None,
                 sync_timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if count < 1:
            raise ValueError("a rollout pool needs at least one instance")
        if alive is not None and len(alive) != count:
            raise ValueError(f"the shared liveness list has {len(alive)} entries for {count} instances")
        self.engine = engine
        self.count = int(count)
        self.platform = platform
        self.threads = threads
        self.start_timeout_s = float(start_timeout_s)
        self.sync_timeout_s = float(sync_timeout_s)
        self.multi_node = multi_node
        self.on_death = on_death
        self.event = event or (lambda kind, **fields: None)
        self.actor_cls = actor_cls
        self.progress = progress if progress is not None else StartupProgress(count, enabled=False)
        self.handles: List[Any] = []
        self.alive: List[bool] = alive if alive is not None else [True] * count
        self.pids: List[int] = []
        self.nodes: List[Optional[str]] = []
        self.placement: Any = None
        self.sender: Any = None

    # ================================================================== start-up
    def start(self) -> None:
        """Reserve one bundle per instance, then start instances one after the other (simultaneous vLLM
        starts can hang on a small host), each retried once in its bundle."""
        import ray
        from ray.util.placement_group import placement_group

        bundle = instance_bundle(self.platform, self.engine.tensor_parallel_size)
        self.placement = placement_group([dict(bundle) for _ in range(self.count)], strategy=PLACEMENT_STRATEGY)
        try:
            ray.get(self.placement.ready(), timeout=self.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RunError(f"the Ray cluster cannot hold asp.instances={self.count} rollout instances of "
                           f"{bundle} each within run.start_timeout_s={self.start_timeout_s:.0f} s "
                           f"(cluster resources: {ray.cluster_resources()})") from None
        for j in range(self.count):
            self._start_one(j)

    def _start_one(self, j: int) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from mindspeed_asp.runtime.instance import create_instance

        strategy = PlacementGroupSchedulingStrategy(placement_group=self.placement, placement_group_bundle_index=j)
        last: Optional[BaseException] = None
        for attempt in range(2):
            self.progress.instance_starting(j, attempt)
            actor = create_instance(j, self.engine, platform=self.platform, threads=self.threads,
                                    loopback=not self.multi_node, scheduling_strategy=strategy,
                                    actor_cls=self.actor_cls)
            try:
                info = ray.get(actor.start.remote(), timeout=self.start_timeout_s)
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayError) as exc:
                last = exc
                ray.kill(actor, no_restart=True)
                continue
            self.handles.append(actor)
            self.alive[j] = True
            self.pids.append(int(info.get("pid", 0)))
            self.nodes.append(info.get("node_id"))
            self.event("instance_started", instance=j, attempt=attempt, node=info.get("node_id"),
                       seconds=float(info.get("start_seconds", 0.0)))
            self.progress.instance_ready(j, float(info.get("start_seconds", 0.0)))
            return
        raise RunError(f"rollout instance {j} did not start within {self.start_timeout_s:.0f} s "
                       f"(twice): {last}")

    def warmup(self, prompt_token_ids: Sequence[int], timeout_s: float) -> None:
        """One short request per instance before the clock starts, so the first iteration does not carry the
        engines' first-step costs (equal for every mode, but it would blur the comparison)."""
        import ray

        for j in self.live():
            ray.get(self.handles[j].submit.remote([GroupRequest(
                group_id=f"warmup-{j}", prompt_id="warmup", prompt_token_ids=list(prompt_token_ids), n=2,
                max_new_tokens=8, seed=0)]), timeout=CALL_TIMEOUT_S)
        deadline = time.time() + timeout_s
        pending = set(self.live())
        while pending:
            for j in sorted(pending):
                if ray.get(self.handles[j].drain_finished.remote(), timeout=CALL_TIMEOUT_S):
                    pending.discard(j)
            if pending and time.time() > deadline:
                raise RunError(f"instances {sorted(pending)} did not finish a warm-up request within "
                               f"run.start_timeout_s={timeout_s:.0f} s")
            time.sleep(POLL_S)

    # ================================================================== liveness
    def adopt(self, engine: EngineConfig, count: int, on_death: Callable[[int, BaseException], None],
              event: Callable[..., None], progress: Optional[StartupProgress], sync_timeout_s: float,
              start_timeout_s: float, poll_s: float = 0.05) -> None:
        """Handed over to a new run (benchmarks run many short runs on one pool: starting vLLM takes minutes on
        a loaded CPU host): the run's engine must be this pool's (the seed aside: every request carries its
        own sampling seed), its deaths, events and bounds become the run's, and whatever the previous run left
        generating is finished and discarded (its group ids would collide with the new run's)."""
        import ray
        from dataclasses import replace

        if count != self.count or replace(engine, seed=0) != replace(self.engine, seed=0):
            raise RunError(f"the shared rollout pool runs {self.count} instances of {self.engine}, this run needs "
                           f"asp.instances={count} of {engine}")
        self.on_death, self.event, self.progress, self.sync_timeout_s = on_death, event, progress, sync_timeout_s
        deadline = time.time() + start_timeout_s
        for j in self.live():
            h = self.handles[j]
            ray.get(h.steal_unstarted.remote(1 << 30), timeout=60)
            while ray.get(h.status.remote(), timeout=60)["running_groups"] > 0:
                if time.time() > deadline:
                    raise RunError(f"rollout instance {j} still generates the previous run's groups after "
                                   f"run.start_timeout_s={start_timeout_s:.0f} s")
                time.sleep(poll_s)
            ray.get(h.drain_finished.remote(), timeout=60)

    def live(self) -> List[int]:
        """Indices of the instances alive now (the one liveness record of the run)."""
        return [j for j, ok in enumerate(self.alive) if ok]

    def mark_dead(self, j: int, exc: BaseException) -> None:
        """Instance j failed a call or hung: drop it once, kill its actor (a hung one would keep its devices
        and could answer late), let the driver re-dispatch, re-form the sync group without it."""
        if not self.alive[j]:
            return
        self.alive[j] = False
        self._kill(j)
        if not any(self.alive):
            raise RunError(f"every rollout instance died (last: instance {j}, {type(exc).__name__}: {exc})")
        if self.on_death is not None:
            self.on_death(j, exc)
        if self.sender is not None:
            self.open_sync_group()

    def _kill(self, j: int) -> None:
        import ray

        try:
            ray.kill(self.handles[j], no_restart=True)
        except Exception:  # noqa: BLE001 - best effort: the actor may be gone already
            pass

    def statuses(self, timeout_s: float = 30.0) -> Dict[int, Any]:
        """`status()` of every live instance, or the exception its call raised (asked of all at once)."""
        import ray

        refs = {j: self.handles[j].status.remote() for j in self.live()}
        out: Dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        for j, ref in refs.items():
            try:
                out[j] = ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
            except Exception as exc:  # noqa: BLE001 - the caller decides what a failed call means
                out[j] = exc
        return out

    def find_dead(self) -> Dict[int, str]:
        """Live instances to drop after a failed sync round, with why: the status call fails, or the round's
        weight load has waited half the round's timeout or more for the engine to finish its step (the engine
        hung inside a step, so the instance never joined the broadcast). Half: the hung instance's load was
        sent at the round's start and has waited the whole round; a healthy one waits at most one step."""
        stuck_after_s = 0.5 * self.sync_timeout_s
        dead: Dict[int, str] = {}
        for j, st in self.statuses().items():
            if isinstance(st, BaseException):
                dead[j] = f"its status call failed ({type(st).__name__})"
            elif float(st.get("weights_wait_s", 0.0) or 0.0) >= stuck_after_s:
                dead[j] = (f"its weight load waited {float(st['weights_wait_s']):.0f} s for the engine to finish "
                           "a step: a hung engine step")
        return dead

    # ================================================================== work
    def submit(self, j: int, requests: Sequence[GroupRequest]) -> bool:
        """Append `requests` to instance j's queue; False (and j marked dead) when it cannot be reached."""
        import ray

        try:
            ray.get(self.handles[j].submit.remote(list(requests)), timeout=CALL_TIMEOUT_S)
            return True
        except Exception as exc:  # noqa: BLE001 - any failure to reach the actor means it is gone
            self.mark_dead(j, exc)
            return False

    def poll(self) -> List[Tuple[int, Any]]:
        """Finished groups of every live instance since the last poll, as (instance, GroupResult)."""
        import ray

        refs = {j: self.handles[j].drain_finished.remote() for j in self.live()}
        out: List[Tuple[int, Any]] = []
        for j, ref in refs.items():
            try:
                results = ray.get(ref, timeout=CALL_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001
                self.mark_dead(j, exc)
                continue
            out.extend((j, r) for r in results)
        return out

    def decode_steps(self) -> Dict[int, int]:
        """Engine steps per live instance that answers (for the run summary)."""
        import ray

        steps = {}
        for j in self.live():
            try:
                steps[j] = int(ray.get(self.handles[j].status.remote(), timeout=30).get("steps", 0))
            except Exception:  # noqa: BLE001
                pass
        return steps

    # ================================================================== weight sync
    def sync_address(self) -> str:
        """Where the sync group meets: loopback on a local Ray, this node's IP on a cluster of hosts."""
        if not self.multi_node:
            return "127.0.0.1"
        import ray

        return ray.util.get_node_ip_address()

    def open_sync_group(self) -> None:
        """(Re-)form the weight-sync group: the trainer's sender (rank 0) and every live instance."""
        from mindspeed_asp.runtime.weight_sync.instance_sync import init_weight_sync
        from mindspeed_asp.runtime.weight_sync.sender import WeightSyncSender

        if self.sender is not None:
            self.sender.close()
        live = [self.handles[j] for j in self.live()]
        self.sender = WeightSyncSender(self.platform, self.sync_address(), world_size=1 + len(live),
                                       timeout_s=self.sync_timeout_s)
        init_weight_sync(self.sender, live)

    def sync(self, version: int, weights: Callable[[], Iterable[Tuple[str, Any]]],
             verify: bool = True) -> Dict[str, Any]:
        """Push `weights()` as `version` to every live instance and verify; a dead instance is dropped (the
        group re-formed) and the round retried once over the others."""
        from mindspeed_asp.runtime.weight_sync.instance_sync import sync_weights

        for attempt in range(2):
            live = [self.handles[j] for j in self.live()]
            try:
                stats = sync_weights(self.sender, live, version, weights())
                break
            except WeightSyncError as exc:
                dead = self.find_dead()
                if not dead or attempt == 1:
                    raise
                for j, why in dead.items():
                    self.event("instance_dropped_from_sync", instance=j, version=version, reason=why)
                    self.mark_dead(j, WeightSyncError(f"instance {j}: {why} ({exc})"))
        if verify and not stats.verified:
            raise WeightSyncError(f"weight sync to version {version} was not verified")
        return {"version": version, "seconds": stats.seconds, "bytes": stats.bytes, "verified": stats.verified,
                "instances": len(live)}

    # ================================================================== end
    def shutdown(self, graceful: bool = True) -> None:
        """Close the sync group, stop and kill every instance, free the placement group (best effort).
        `graceful=False` (an aborted run) skips asking each engine to stop and kills the actors at once."""
        import ray

        if self.sender is not None:
            try:
                self.sender.close()
            except Exception:  # noqa: BLE001
                pass
            self.sender = None
        for j, a in enumerate(self.handles):
            if self.alive[j] and graceful:
                try:
                    ray.get(a.shutdown.remote(), timeout=CALL_TIMEOUT_S)
                except Exception:  # noqa: BLE001
                    pass
            self._kill(j)
        if self.placement is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self.placement)
            except Exception:  # noqa: BLE001
                pass
            self.placement = None
