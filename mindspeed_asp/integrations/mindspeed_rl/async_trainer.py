"""An asynchronous replacement of `RayGRPOTrainer.fit`: train from the rollout queue under the max-lag counter.

Stock `fit` runs, per iteration: put prompts -> colocated generate -> reward -> advantage -> ref log-prob ->
old log-prob -> update, all in lockstep. Here a separate pool of vLLM-Ascend instances (rollout_worker.py,
driven by rollout_driver.py) generates continuously; each iteration the trainer

1. takes `global_batch_size` finished groups from the runtime's `SampleQueue` (inside the rollout driver),
   oldest policy version first; the queue audits each sample's lag (trainer version - oldest version that
   produced its tokens) and never hands out a group over `max_lag` (it is regenerated or dropped, per
   `asp.stale_policy`, and counted),
2. writes them into MindSpeed-RL's TransferDock in MindSpeed-RL's row layout (prompts, responses,
   input_ids, lengths, plus ASP's columns: prompt id, behaviour log-probs, policy version),
3. runs MindSpeed-RL's own reward, advantage, reference, old-log-prob and update stages unchanged
   (old log-prob is always recomputed: with lag > 0 the behaviour policy is not the current one),
4. exports the new weights with `MegatronStyleVllmWeightContainer.get_infer_params()` on every Megatron
   rank and broadcasts them over one HCCL group per inference-TP rank to every instance (version += 1),
   with the runtime's protocol (manifest, buckets, bounded-memory checksums, a deadline naming the instance
   and rank that did not answer); the groups are built once per run, and after every sync the instances'
   weights are read back and compared with the actor's,
5. on every MindSpeed-RL checkpoint, saves ASP's state beside it (policy version, plan cursor, trained,
   finished and unfinished groups: resume_state.py) and, when MindSpeed-RL resumes from an iteration,
   continues from that state (versions continue, finished groups are trained, only unfinished ones are
   generated again),
6. logs MindSpeed-RL's metric names (`e2e_tps` with trainer + rollout NPUs in the denominator,
   `vllm_tps`, `update_tps`, `timing/*`) plus ASP's `lag/*`, `bubble/*`, `time/*` and the loss patch's
   `asp/*` off-policy statistics, and appends one record per update to `asp.audit_path` when set.

ASP's code reaches the Megatron actors through Ray's built-in `__ray_call__` (run a function on the actor),
never through methods added to MindSpeed-RL's worker classes: Ray fixes an actor handle's method table when
`@ray.remote` decorates the class at import, and the `train` task receives those classes pickled from the
driver, where no ASP hook runs, so added methods would be missing from every handle.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Sequence, Tuple

from mindspeed_asp.integrations.mindspeed_rl.data_patches import (
    ASP_PROMPT_ID, POLICY_VERSION, ROLLOUT_LOG_PROB, PlanOrderedBatches)
from mindspeed_asp.runtime.types import GroupRequest, GroupResult


# ------------------------------------------------------------------------ pure helpers (CPU-tested)
def groups_to_rows(groups: Sequence[GroupResult], extra: Dict[int, Dict[str, Any]], n: int) -> Dict[str, list]:
    """TransferDock columns for the groups in MindSpeed-RL's layout: group k -> rows [k*n, (k+1)*n).

    `extra[gid]` holds the dataset's additional keys (e.g. `labels`) and the prompt id of a group; each row's
    `policy_version` is the oldest version that produced its sample (what the loss patch's lag uses).
    """
    import torch
    cols: Dict[str, list] = {"prompts": [], "prompt_length": [], "responses": [], "response_length": [],
                             "input_ids": [], ROLLOUT_LOG_PROB: [], POLICY_VERSION: [], ASP_PROMPT_ID: []}
    keys = sorted({k for e in extra.values() for k in e if k != ASP_PROMPT_ID})
    for k in keys:
        cols[k] = []
    for g in groups:
        gid = int(g.group_id)
        if len(g.samples) != n:
            raise ValueError(f"group {g.group_id} has {len(g.samples)} samples, expected n={n}")
        prompt = torch.tensor(g.prompt_token_ids, dtype=torch.int64)
        for s in g.samples:
            r = torch.tensor(s.token_ids, dtype=torch.int64)
            cols["prompts"].append(prompt)
            cols["prompt_length"].append(torch.tensor([len(prompt)]))
            cols["responses"].append(r)
            cols["response_length"].append(torch.tensor([len(r)]))
            cols["input_ids"].append(torch.cat([prompt, r]))
            cols[ROLLOUT_LOG_PROB].append(torch.tensor(s.logprobs, dtype=torch.float32))
            cols[POLICY_VERSION].append(torch.tensor([int(s.min_version)]))
            cols[ASP_PROMPT_ID].append(torch.tensor([int(extra.get(gid, {}).get(ASP_PROMPT_ID, g.prompt_id))]))
            for k in keys:
                cols[k].append(extra[gid][k])
    return cols


OUTPUT_COLUMNS = ("responses", "response_length", "input_ids", ROLLOUT_LOG_PROB, POLICY_VERSION)


def put_groups(put: Callable[[Dict[str, Any], List[int], bool], Any], groups: Sequence[GroupResult],
               extra: Dict[int, Dict[str, Any]], n: int) -> List[int]:
    """Write finished groups into the TransferDock as MindSpeed-RL's own stages would: the prompt columns
    with `is_prompt=True` (what `fit` puts), then the rollout outputs (what the rollout stage collects).

    `put(data, indexes, is_prompt)` is `DataStrategy.put_experience`; rows are [0, len(groups) * n).
    """
    from mindspeed_rl.utils.pad_process import padding_dict_to_tensor_dict
    rows = groups_to_rows(groups, extra, n)
    indexes = list(range(len(groups) * n))
    put(padding_dict_to_tensor_dict({k: v for k, v in rows.items() if k not in OUTPUT_COLUMNS}), indexes, True)
    put(padding_dict_to_tensor_dict({k: rows[k] for k in OUTPUT_COLUMNS}), indexes, False)
    return indexes


def rollout_span(groups: Sequence[GroupResult]) -> float:
    """Wall-clock seconds from the first group's start to the last group's end (instances on any node)."""
    return (max(g.t_finished for g in groups) - min(g.t_started for g in groups)) if groups else 0.0


def iteration_metrics(groups: Sequence[GroupResult], lags: Sequence[int], max_lag: int, instances: int,
                      t_iter: float, wait_s: float, sync_s: float, devices: Any) -> Dict[str, float]:
    """ASP's metrics of one iteration from the trained groups (lag statistics as the runtime computes them).

    `devices`: the topology's `DeviceCount` (or a plain count); `throughput/e2e_tps` is
    `mindspeed_asp.metrics.e2e_tps` over it, the number MindSpeed-RL's own `e2e_tps` divides by here too."""
    from mindspeed_asp.metrics import e2e_tps, lag_stats
    from mindspeed_asp.runtime.metrics_log import TOKEN_LAG_KEY, GroupSpan, group_skewness, token_weighted_lag
    spans = [GroupSpan(g.instance, int(g.group_id), g.t_enqueued, g.t_started, g.t_finished,
                       len(g.prompt_token_ids) * len(g.samples), g.response_tokens,
                       [len(s.token_ids) for s in g.samples], g.min_version, 0) for g in groups]
    sk = group_skewness(spans, instances)
    ls = lag_stats(list(lags), max_lag)
    tokens = sum(s.prompt_tokens + s.response_tokens for s in spans)
    return {
        "lag/mean": ls["lag/mean"], "lag/p99": ls["lag/p99"], "lag/max": ls["lag/max"],
        "lag/frac_over_bound": ls["lag/frac_over_bound"], TOKEN_LAG_KEY: token_weighted_lag(lags, [len(s.token_ids) for g in groups for s in g.samples]),
        "bubble/skewness": sk["skew"], "bubble/after90": sk["after90"],
        "bubble/sorting": wait_s / t_iter if t_iter > 0 else 0.0,
        "time/iteration": t_iter, "time/rollout": rollout_span(groups), "time/weight_sync": sync_s,
        "throughput/e2e_tps": e2e_tps(tokens, t_iter, devices),
    }


def async_timing_metrics(data_strategy: Any, groups: Sequence[GroupResult]) -> None:
    """The timings MindSpeed-RL's `metrics_sort` indexes that only its colocated rollout writes.

    `metrics_sort` reads `timing/resharding_to_infer` unconditionally (written by `generate_sequences`, which
    the asynchronous fit never calls): without it the first update's logging raises KeyError. Here no
    resharding happens on the trainer's devices, so it is 0; `timing/rollout` is the wall-clock span of the
    trained groups' generation.
    """
    data_strategy.update_metrics("timing/rollout", value=[rollout_span(groups), 0.0], cumulate=True)
    data_strategy.update_metrics("timing/resharding_to_infer", value=[0.0], cumulate=True)


READBACK_NAMES = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")


def node_address() -> Tuple[str, int]:
    """This process's node IP and a port free there (bound on every interface: peers on other nodes connect)."""
    import ray
    from mindspeed_asp.runtime.weight_sync import free_port
    return ray.util.get_node_ip_address(), free_port("")


# ------------------------------------------------------------------------ Megatron-side (run by __ray_call__)
def asp_sender_address(worker: Any) -> Tuple[str, int]:
    """The actor's node IP and a port free there: rank 0 of a weight group hosts the group's store."""
    return node_address()


def asp_init_weight_sender(worker: Any, backend: str, host: str, port: int, world_size: int,
                           timeout_s: float) -> bool:
    """Join the weight group of this infer-TP rank as its sender (rank 0), once for the run."""
    from mindspeed_asp.integrations.mindspeed_rl.weight_transfer import WeightSender
    from mindspeed_asp.runtime.platform import current_platform
    platform = current_platform()
    device = platform.device(int(os.environ.get("LOCAL_RANK", "0"))) if platform.is_accelerator else None
    worker._asp_sender = WeightSender(backend, host, port, world_size, device=device, timeout_s=timeout_s)
    return True


def asp_push_weights(worker: Any, version: int, readback: Sequence[str] = READBACK_NAMES) -> Dict[str, Any]:
    """Export vLLM-shaped weights on this Megatron rank (a collective over the actor world) and broadcast them
    from the senders; returns the round's metrics and checksums of the read-back tensors."""
    from mindspeed_asp.integrations.mindspeed_rl import loss_patch
    from mindspeed_asp.runtime.weight_sync import tensor_checksum
    sm = worker.sharding_manager
    sm.onload_infer_params()
    params = sm.vllm_weight_container.get_infer_params()
    out: Dict[str, Any] = {"bytes": 0.0, "checksums": {}}
    try:
        sender = getattr(worker, "_asp_sender", None)
        if sender is not None:
            out.update(sender.send(int(version), list(params.items())))
            out["bytes"] = float(out.get("weight_sync/bytes", 0.0))
            out["checksums"] = {n: tensor_checksum(params[n]) for n in readback if n in params}
    finally:
        sm.offload_infer_params()
    loss_patch.set_trainer_version(int(version))  # the next update trains from these weights
    return out


# ------------------------------------------------------------------------ the fit replacement
def run_settings(topo: Any) -> Dict[str, Any]:
    """The run settings a checkpoint state must share with the run resuming from it."""
    return {"mode": topo.asp.mode, "max_lag": int(topo.asp.max_lag), "instances": int(topo.instances),
            "gbs": int(topo.gbs), "n": int(topo.n)}


def track_colocated_plan(trainer: Any, topo: Any, data_iters: Any) -> None:
    """Plan-ordered windows on MindSpeed-RL's own engines (max_lag 0): MindSpeed-RL's loader skip already puts
    the plan cursor back on resume; ASP's state records the cursor with every checkpoint and, where a state
    of the resumed iteration exists, the cursor is checked against it."""
    from mindspeed_asp.errors import RunError
    from mindspeed_asp.integrations.mindspeed_rl.resume_state import (
        STATE_HOOK, colocated_state, read_state, state_path)
    settings, plan_path = run_settings(topo), getattr(topo.asp, "plan_path", None)
    iteration = trainer.actor_worker.get_iteration()
    load = trainer.actor_worker.megatron_config.load
    if iteration > 0 and load and state_path(load, iteration).is_file():
        saved = read_state(load, iteration, settings)["plan"]["windows_fed"]
        cursor = getattr(data_iters, "iteration", None)
        if cursor is not None and int(cursor) != int(saved):
            raise RunError(f"resumed at iteration {iteration}: the plan-ordered loader is at window {cursor}, the "
                           f"checkpoint's ASP state at {saved} ({state_path(load, iteration)})")
    setattr(trainer, STATE_HOOK, lambda it: colocated_state(it, settings, getattr(data_iters, "iteration", it),
                                                            plan_path))


class AsyncFit:
    """State of one asynchronous run inside the `train` task (the RayGRPOTrainer instance is `trainer`)."""

    def __init__(self, trainer: Any, topo: Any) -> None:
        self.t, self.topo, self.asp = trainer, topo, topo.asp
        self.version = 0
        self.next_gid = 0
        self.windows_fed = 0  # loader batches handed to the driver (the plan cursor)
        self.extra: Dict[int, Dict[str, Any]] = {}
        self.workers: List[List[Any]] = []
        self.driver: Any = None
        self.handlers: List[Any] = list(trainer.actor_worker.actor_handlers)
        self.sampling = dict(trainer.actor_worker.generate_config.dict().get("sampling_config", {}))
        self.audit = open(self.asp.audit_path, "a") if getattr(self.asp, "audit_path", None) else None

    def _call_actors(self, fn: Callable[..., Any], *args: Any) -> List[Any]:
        """Run `fn(worker, *args)` on every Megatron rank (Ray's __ray_call__; see the module docstring)."""
        return [h.__ray_call__.remote(fn, *args) for h in self.handlers]

    # -- setup
    def start_pool(self, state: Dict[str, Any] | None = None) -> None:
        """Start the instances, the weight groups and the rollout driver; with a checkpoint `state`, the driver
        continues it (resume_state.py) and the first sync pushes the checkpointed weights as its version."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        from mindspeed_asp.integrations.mindspeed_rl.rollout_driver import RolloutDriver
        from mindspeed_asp.integrations.mindspeed_rl.rollout_worker import (
            RolloutWorker, ascend_engine_factory, instance_env)
        from mindspeed_asp.integrations.mindspeed_rl.weight_transfer import sync_deadline
        from mindspeed_asp.runtime.platform import current_platform
        gen = self.t.actor_worker.generate_config.dict()
        model_path = self.t.actor_worker.megatron_config.tokenizer_name_or_path
        tp, m, n = self.topo.infer_tp, self.asp.instances, self.topo.n
        mem = float(getattr(self.asp, "rollout_memory_utilization", 0.9))
        cls = ray.remote(resources={"NPU": 1}, num_cpus=1)(RolloutWorker)

        def make(j: int, r: int, addr: str, port: int, pg: Any) -> Any:
            env = instance_env(j, r, tp, addr, port)
            strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=r)
            return cls.options(runtime_env={"env_vars": env}, name=f"asp_rollout_{j}_{r}",
                               scheduling_strategy=strategy).remote(
                j, r, n, self.sampling, lambda g=gen, p=model_path, u=mem: ascend_engine_factory(g, p, u))

        for j in range(m):
            place = instance_placement(tp)
            self.workers.append([make(j, r, place.addr, place.port, place.pg) for r in range(tp)])
        backend = current_platform().dist_backend
        timeout = float(getattr(self.asp, "sync_timeout_s", 600.0))
        # One weight group per infer-TP rank: the Megatron rank holding that shard + rank r of every instance,
        # rendezvous at the sender's node. Built once and reused for every sync.
        refs: Dict[str, Any] = {}
        for r in range(tp):
            host, port = ray.get(self.handlers[r].__ray_call__.remote(asp_sender_address))
            for j in range(m):
                refs[f"instance {j} tp-rank {r}"] = self.workers[j][r].init_weight_group.remote(
                    backend, host, port, 1 + j, 1 + m, timeout)
            refs[f"actor rank {r} (sender)"] = self.handlers[r].__ray_call__.remote(
                asp_init_weight_sender, backend, host, port, 1 + m, timeout)
        sync_deadline(refs, timeout)
        policy = "plan" if self.asp.mode == "asp" else "least_loaded"
        capacity = max(1, self.asp.slots // n)
        self.driver = ray.remote(num_cpus=0, max_concurrency=8)(RolloutDriver).remote(
            self.workers, policy, self.asp.max_lag, self.topo.gbs, capacity, 16, self.asp.work_stealing,
            self.asp.stale_policy)
        if state is not None:
            self.version = int(state["policy_version"])
        self.sync_weights(self.version)  # before any work: an instance refuses to generate without weights
        if state is not None:
            self.restore(state)

    # -- checkpoint (resume_state.py)
    def settings(self) -> Dict[str, Any]:
        return run_settings(self.topo)

    def checkpoint_state(self, iteration: int) -> Dict[str, Any]:
        """ASP's state after `iteration` updates (the trainer's save hook writes it beside Megatron's)."""
        import ray
        from mindspeed_asp.integrations.mindspeed_rl.resume_state import build_state
        snap = ray.get(self.driver.snapshot.remote())
        keep = {int(r.group_id) for r, _, _ in snap["ready"]} | {int(r.group_id) for r, _ in snap["unfinished"]}
        return build_state(iteration, self.settings(), snap, version=self.version, windows_fed=self.windows_fed,
                           next_gid=self.next_gid, extra={g: self.extra[g] for g in keep if g in self.extra},
                           plan_path=getattr(self.asp, "plan_path", None))

    def restore(self, state: Dict[str, Any]) -> None:
        """Continue `state` in the fresh driver: version, plan cursor, trained / finished / unfinished groups."""
        import ray
        from mindspeed_asp.integrations.mindspeed_rl.resume_state import ready_groups, unfinished_groups
        ready, unfinished = ready_groups(state), unfinished_groups(state)
        for req, _, _, extra in ready:
            self.extra[int(req.group_id)] = extra
        for req, _, extra in unfinished:
            self.extra[int(req.group_id)] = extra
        self.version = int(state["policy_version"])
        self.next_gid = int(state["plan"]["next_gid"])
        self.windows_fed = int(state["plan"]["windows_fed"])
        ray.get(self.driver.restore.remote(self.version, state["trained_gids"], [(q, r, v) for q, r, v, _ in ready],
                                           [(q, j) for q, j, _ in unfinished], state["counters"],
                                           state.get("isolated", [])))  # absent in states before isolation

    def skip_fed_windows(self, data_iters: Any, drawn: int) -> int:
        """Advance the loader past the windows the saved run had fed ahead of its updates (MindSpeed-RL's
        launcher skipped `drawn` = consumed samples / batch size of them); returns how many were skipped."""
        from mindspeed_asp.errors import RunError
        cursor = getattr(data_iters, "iteration", None)  # the plan-ordered loader's own cursor
        if cursor is not None and int(cursor) != drawn:
            raise RunError(f"the plan-ordered loader is at window {cursor}, MindSpeed-RL skipped {drawn} batches")
        if drawn > self.windows_fed:
            raise RunError(f"MindSpeed-RL skipped {drawn} loader batches on resume, but the saved run had fed only "
                           f"{self.windows_fed}: the checkpoint and ASP's state disagree")
        skipped = 0
        for _ in range(self.windows_fed - drawn):
            try:
                next(data_iters)
            except StopIteration:
                break
            skipped += 1
        return skipped

    def sync_weights(self, version: int) -> Dict[str, float]:
        """Pause stepping, broadcast, load, read back, bump the version, resume. Raises on any failure."""
        import ray
        from mindspeed_asp.errors import WeightSyncError
        from mindspeed_asp.integrations.mindspeed_rl.weight_transfer import sync_deadline
        from mindspeed_asp.runtime.weight_sync import tensor_checksum
        t0 = time.time()
        timeout = float(getattr(self.asp, "sync_timeout_s", 600.0))
        ray.get(self.driver.pause.remote(timeout))  # a hung engine step fails the sync here, named
        refs = {f"actor rank {i}": ref for i, ref in enumerate(self._call_actors(asp_push_weights, version))}
        for j, ranks in enumerate(self.workers):
            for r, w in enumerate(ranks):
                refs[f"instance {j} tp-rank {r}"] = w.receive_weights.remote()
        got = sync_deadline(refs, timeout)
        bad = {k: v for k, v in got.items() if k.startswith("instance") and v != version}
        if bad:
            raise WeightSyncError(f"weight sync {version}: instances report other versions {bad}")
        sent = sum(float(v.get("bytes", 0.0)) for k, v in got.items() if k.startswith("actor"))
        if sent <= 0:
            raise WeightSyncError(f"weight sync {version}: the actor ranks sent nothing")
        expected = got["actor rank 0"]["checksums"]
        checked = 0
        for j, ranks in enumerate(self.workers):
            engine = ray.get(ranks[0].read_weights.remote(list(expected)))
            for name, want in expected.items():
                if name not in engine:
                    continue
                have = tensor_checksum(engine[name])
                if abs(have - want) > 1e-5 * max(1.0, abs(want)):
                    raise WeightSyncError(f"weight sync {version}: instance {j} holds other values for {name} "
                                          f"after loading (checksum {have:.6g}, actor {want:.6g})")
                checked += 1
        if expected and not checked:
            raise WeightSyncError(f"weight sync {version}: no instance parameter could be read back")
        ray.get(self.driver.set_version.remote(version))
        ray.get(self.driver.resume.remote())
        self.version = version
        return {"time/weight_sync": time.time() - t0, "asp/sync_bytes": sent, "asp/sync_readback": float(checked)}

    # -- data
    def feed_window(self, data_iters: Any) -> bool:
        """Hand the next batch (one window) to the driver, with plan queues when the plan drives dispatch."""
        import ray
        try:
            batch = next(data_iters)
        except StopIteration:
            return False
        requests, extra, gids = [], {}, []
        keys = [k for k in batch if k != "prompts"]
        max_new = int(self.sampling.get("max_tokens", self.topo.max_tokens))
        seed = self.sampling.get("seed")
        for k, prompt in enumerate(batch["prompts"]):
            gid = self.next_gid
            self.next_gid += 1
            gids.append(gid)
            extra[gid] = {key: batch[key][k] for key in keys}
            pid = gid
            if ASP_PROMPT_ID in extra[gid]:
                pid = extra[gid][ASP_PROMPT_ID] = int(extra[gid][ASP_PROMPT_ID].view(-1)[0])
            requests.append(GroupRequest(str(gid), str(pid), [int(x) for x in prompt.tolist()], self.topo.n, max_new,
                                         float(self.sampling.get("temperature", 1.0)),
                                         None if seed is None else int(seed) + gid * self.topo.n))
        self.extra.update(extra)
        queues, shared, isolated = None, False, []
        if self.asp.mode == "asp" and isinstance(data_iters, PlanOrderedBatches):
            shared = data_iters.last_shared
            isolated = [gids[k] for k in data_iters.isolated_positions()]
            sizes = [len(q) for q in data_iters.last_queues]
            queues, start = [], 0
            for s in sizes:
                queues.append(gids[start:start + s])
                start += s
        ray.get(self.driver.load_window.remote(requests, {}, queues, shared, isolated))
        self.windows_fed += 1
        return True

    def take_trainable(self) -> Dict[str, Any]:
        import ray
        return ray.get(self.driver.next_minibatch.remote(self.version))

    def record(self, iteration: int, got: Dict[str, Any], sync: Dict[str, float]) -> None:
        """One audit line per update: what was trained, from which versions, and the sync that followed."""
        if self.audit is None:
            return
        groups = got["groups"]
        self.audit.write(json.dumps({
            "iteration": iteration, "train_version": self.version - 1, "new_version": self.version,
            "group_ids": [g.group_id for g in groups], "prompt_ids": [g.prompt_id for g in groups],
            "instances": [g.instance for g in groups], "lags": got["lags"],
            "min_versions": [g.min_version for g in groups], "counters": got.get("counters", {}),
            "sync": sync}) + "\n")
        self.audit.flush()


class _NodeProbe:
    """Reports the node it runs on: IP, a free port, Ray node id."""

    def address(self) -> Tuple[str, int, str]:
        import ray
        return (*node_address(), ray.get_runtime_context().get_node_id())


@dataclass(frozen=True)
class InstancePlacement:
    """Where one rollout instance runs: its placement group and the rendezvous of its TP world."""

    pg: Any
    addr: str
    port: int
    node_id: str


def instance_placement(tp: int) -> InstancePlacement:
    """A STRICT_PACK placement group for one instance's `tp` ranks, and the rendezvous of its TP world: the IP and
    a free port of the node that holds it (not the train task's node: a 32B instance may sit on another)."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    pg = placement_group([{"NPU": 1, "CPU": 1} for _ in range(tp)], strategy="STRICT_PACK")
    ray.get(pg.ready())
    probe = ray.remote(num_cpus=0)(_NodeProbe).options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=0)).remote()
    try:
        addr, port, node_id = ray.get(probe.address.remote())
    finally:
        ray.kill(probe)
    return InstancePlacement(pg, addr, int(port), node_id)


def asp_fit(self, data_iters: Any) -> None:
    """RayGRPOTrainer.fit for modes `asp`/`async` (separate rollout pool); stock otherwise."""
    from mindspeed_asp.integrations.mindspeed_rl.config_section import topology_from_env
    topo = topology_from_env()
    if topo is None or not topo.separate_pool:
        if topo is not None and topo.colocated_plan:
            track_colocated_plan(self, topo, data_iters)
        return _ORIGINAL_FIT["fit"](self, data_iters)
    import ray
    from codetiming import Timer
    from mindspeed_rl.trainer.utils.compute_utils import compute_grpo_data_metrics
    from mindspeed_rl.utils.loggers import Loggers
    from mindspeed_rl.utils.metrics import Metric
    from mindspeed_rl.utils.utils import compute_tps, metrics_post_processing, metrics_sort
    from mindspeed_rl.workers.scheduler.launcher import RayActorGroup

    from mindspeed_asp.integrations.mindspeed_rl.resume_state import STATE_HOOK, read_state

    logger = Loggers("asp_async_trainer")
    run = AsyncFit(self, topo)
    iteration = self.actor_worker.get_iteration()
    state = None
    if iteration > 0:  # MindSpeed-RL resumed from a checkpoint: continue ASP's state of that iteration
        state = read_state(self.actor_worker.megatron_config.load, iteration, run.settings())
    run.start_pool(state)
    if state is None:
        for _ in range(topo.asp.max_lag + 1):  # keep the instances fed up to the lag bound
            run.feed_window(data_iters)
    else:
        skipped = run.skip_fed_windows(data_iters, self.actor_worker.get_consumed_train_samples() // topo.gbs)
        logger.info(f"asp: resumed at iteration {iteration}, policy version {run.version}: "
                    f"{len(state['ready'])} finished groups kept, {len(state['unfinished'])} to generate again, "
                    f"{skipped} fed windows skipped")
    setattr(self, STATE_HOOK, run.checkpoint_state)
    tps_kwargs = dict(self.kwargs)
    tps_kwargs["actor_resource"] = {"num_npus": topo.total_npus}  # trainer + rollout NPUs, like-for-like
    tps_kwargs["use_integrated_worker"] = True
    self.skip_actor_log_prob = False  # the proximal log-prob is always recomputed
    self.actor_worker.skip_actor_log_prob = False
    n, gbs = topo.n, topo.gbs
    while iteration < self.train_iters:
        metrics = Metric()
        with Timer(name="iteration", logger=None) as all_timer:
            got = run.take_trainable()
            groups = got["groups"]
            run.feed_window(data_iters)
            put_groups(lambda d, i, p: self.data_strategy.put_experience(d, i, is_prompt=p), groups, run.extra, n)
            async_timing_metrics(self.data_strategy, groups)
            rule_reward = []
            for reward_worker in self.reward_list:
                if isinstance(reward_worker, RayActorGroup):
                    reward_worker.compute_rm_score(blocking=self.blocking)
                else:
                    rule_reward.append(reward_worker.compute_rm_score.remote())
            ray.get(rule_reward)
            self.compute_advantage(blocking=True, guarantee_order=self.guarantee_order)
            self.ref_worker.compute_ref_log_prob(blocking=self.blocking)
            self.actor_worker.compute_log_prob(blocking=self.blocking)
            self.actor_worker.wait_all_ref_objs_run_over()
            self.ref_worker.wait_all_ref_objs_run_over()
            self.actor_worker.update(self.kl_ctrl, self.skip_actor_log_prob)
            grpo_data_metrics = compute_grpo_data_metrics(self.transfer_dock, gbs * n, self.tokenizer, gbs * n,
                                                          self.guarantee_order)
            metrics_result = self.data_strategy.get_metrics()
            sync = run.sync_weights(run.version + 1)
        metrics_result = metrics_post_processing(metrics_result)
        metrics_result = metrics_sort(metrics_result, all_timer.last)
        metrics_result["timing/weight_sync"] = sync["time/weight_sync"]
        lmt = self.actor_worker.rl_config.log_max_throughput
        metrics.update(value=metrics_result)
        metrics.update(value=grpo_data_metrics)
        metrics.update("e2e_tps", compute_tps(tps_kwargs, grpo_data_metrics, gbs, n, all_timer.last, lmt))
        metrics.update("update_tps", compute_tps(tps_kwargs, grpo_data_metrics, gbs, n,
                                                 metrics_result["timing/update"], lmt))
        metrics.update("vllm_tps", compute_tps(tps_kwargs, grpo_data_metrics, gbs, n,
                                               max(rollout_span(groups), 1e-9), lmt))
        asp_m = iteration_metrics(groups, got["lags"], topo.asp.max_lag, topo.asp.instances, all_timer.last,
                                  got["wait_s"], sync["time/weight_sync"], topo.devices)
        asp_m.update({f"asp/{k}": float(v) for k, v in got.get("counters", {}).items()})
        asp_m["asp/policy_version"] = float(run.version)
        asp_m["asp/devices"] = float(topo.devices.total)  # e2e_tps' denominator, for `asp compare`
        asp_m["asp/sync_readback"] = sync["asp/sync_readback"]
        metrics.update(value=asp_m)
        iteration += 1
        run.record(iteration, got, sync)
        logger.info(metrics.metric, iteration, self.train_iters)
        self.data_strategy.clear_main()
        if self.tensorboard is not None:
            for k, v in metrics.metric.items():
                self.tensorboard.add_scalar(f"train/{k}", v, iteration)
        if iteration % self.save_interval == 0 or iteration == self.train_iters:
            self.save_checkpoint(iteration)
    ray.get(run.driver.stop.remote())
    logger.info("after asp async grpo training is done")
    ray.shutdown()


_ORIGINAL_FIT: Dict[str, Callable[..., Any]] = {}


def fit_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Registered on RayGRPOTrainer.fit: keeps the original for stock mode and dispatches to asp_fit."""
    _ORIGINAL_FIT["fit"] = orig

    def fit(self, data_iters):
        return asp_fit(self, data_iters)
    fit.__wrapped__ = orig  # type: ignore[attr-defined]
    return fit


TRAINER_PATCHES = [("mindspeed_rl.trainer.grpo_trainer_hybrid.RayGRPOTrainer.fit", fit_wrapper)]
