"""An asynchronous replacement of `RayGRPOTrainer.fit`: train from the rollout queue under the max-lag counter.

Stock `fit` runs, per iteration: put prompts -> colocated generate -> reward -> advantage -> ref log-prob ->
old log-prob -> update, all in lockstep. Here a separate pool of vLLM-Ascend instances (rollout_worker.py,
driven by lockstep_rollout.py) generates continuously; each iteration the trainer

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
   and rank that did not answer); the groups are built once per run, after the engines were built (their
   own deadline, `asp.engine_start_timeout_s`). After every sync each instance checksums its embeddings,
   norm and LM head on its own device (floats come back, compared after generation resumed), and on the
   first sync (and every `asp.weight_probe_every` syncs) a fixed prompt decoded greedily on every instance
   must get the same log-probs from MindSpeed-RL's own log-prob forward on the Megatron ranks (a functional
   check that the engine computes with the trainer's weights). A dead instance ends the run at the
   trainer's next call with a RunError naming it (lockstep_rollout.py),
5. on every MindSpeed-RL checkpoint, saves ASP's state beside it (policy version, plan cursor, trained,
   finished and unfinished groups: resume_state.py) and, when MindSpeed-RL resumes from an iteration,
   continues from that state (versions continue, finished groups are trained, only unfinished ones are
   generated again),
6. logs MindSpeed-RL's metric names (`e2e_tps` with trainer + rollout NPUs in the denominator,
   `update_tps` over the trainer's NPUs, `vllm_tps` over the rollout NPUs: see `throughput_metrics`,
   `timing/*`) plus ASP's `lag/*`, `bubble/*`, `time/*` and the loss patch's `asp/*` off-policy statistics,
   to MindSpeed-RL's loggers (tensorboard, wandb, swanlab) as stock `fit` does, and appends one record per
   update to `asp.audit_path` when set.

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
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from mindspeed_asp.integrations.mindspeed_rl.data_patches import (
    ASP_PROMPT_ID, POLICY_VERSION, ROLLOUT_LOG_PROB, PlanOrderedBatches)
from mindspeed_asp.errors import AspError, RunError, WeightSyncError
from mindspeed_asp.runtime.requests import GroupRequest, GroupResult

#: how often a taken port is probed again before giving up (the probe-then-bind window: finding 16)
PORT_ATTEMPTS = 4
PLACEMENT_TIMEOUT_S = 300.0  # instance_placement's default; a run passes asp.placement_timeout_s
WEIGHT_PROBE_TEXT = "The quick brown fox jumps over the lazy dog. Count with me: one, two, three,"


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
    `mindspeed_asp.core.metrics.e2e_tps` over it, the number MindSpeed-RL's own `e2e_tps` divides by here too."""
    from mindspeed_asp.core.metrics import e2e_tps, lag_stats
    from mindspeed_asp.runtime.run_recorder import TOKEN_LAG_KEY, GroupSpan, group_skewness, token_weighted_lag
    spans = [GroupSpan(g.instance, int(g.group_id), g.t_enqueued, g.t_started, g.t_finished,
                       len(g.prompt_token_ids) * len(g.samples), g.response_tokens,
                       [len(s.token_ids) for s in g.samples], g.min_version, 0) for g in groups]
    sk = group_skewness(spans, instances)
    ls = lag_stats(list(lags), max_lag)
    tokens = sum(s.prompt_tokens + s.response_tokens for s in spans)
    return {
        "lag/mean": ls["lag/mean"], "lag/p99": ls["lag/p99"], "lag/max": ls["lag/max"],
        "lag/frac_over_bound": ls["lag/frac_over_bound"],
        TOKEN_LAG_KEY: token_weighted_lag(lags, [len(s.token_ids) for g in groups for s in g.samples]),
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


def generation_time(groups: Sequence[GroupResult]) -> float:
    """Seconds in which at least one of `groups` was generating: the union of their [start, finish] intervals.

    `vllm_tps`' time. Unlike `rollout_span` (first start to last finish), gaps in which none of these groups
    ran (an update trains groups of two windows, generated one after the other with other windows' groups
    in between) are not counted; the instances' time shared with groups of other windows still is, as
    stock's rollout time is its whole generate phase."""
    spans = sorted((float(g.t_started), float(g.t_finished)) for g in groups)
    total, end = 0.0, float("-inf")
    for a, b in spans:
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def throughput_metrics(kwargs: Dict[str, Any], data_metrics: Dict[str, Any], gbs: int, n: int, t_iter: float,
                       t_update: float, groups: Sequence[GroupResult], topo: Any,
                       log_max_throughput: bool = False) -> Dict[str, float]:
    """MindSpeed-RL's three throughputs, each like-for-like with stock's (`compute_tps`: tokens of the batch
    per device per second):

    - `e2e_tps`: over every NPU of the run (trainer + rollout pool) and the iteration's wall clock;
    - `update_tps`: over the trainer's NPUs (`actor_resource.num_npus`, stock's whole world) and
      `timing/update`: the same update on the same devices as stock;
    - `vllm_tps`: over the rollout pool's NPUs (instances x infer TP: the devices that generated) and this
      update's groups' generation time (`generation_time`), not over the trainer's NPUs too.
    """
    from mindspeed_rl.utils.utils import compute_tps

    def over(npus: int, seconds: float) -> float:
        kw = dict(kwargs, actor_resource={"num_npus": int(npus)}, use_integrated_worker=True)
        return float(compute_tps(kw, data_metrics, gbs, n, max(float(seconds), 1e-9), log_max_throughput))
    return {"e2e_tps": over(topo.total_npus, t_iter), "update_tps": over(topo.train_npus, t_update),
            "vllm_tps": over(topo.rollout_npus, generation_time(groups))}


def compare_probe(label: str, tokens: Sequence[int], engine_logprobs: Sequence[float],
                  trainer_logprobs: Sequence[float], tolerance: float) -> float:
    """Compare one instance's greedy probe with the trainer's forward on the same tokens; returns the mean
    absolute log-prob difference.

    The engine decoded `tokens` greedily and reported each one's log-prob; the trainer's forward
    (teacher-forced on the same tokens, temperature 1) gives its own. Both run the weights of one sync, so
    they agree up to numerics (bf16 kernels: a few 0.01 nats); weights loaded wrong (a mis-permuted qkv, a
    layer left at its dummy values, shards swapped) move them by nats. WeightSyncError when the mean
    difference exceeds `tolerance` (or a log-prob is missing or not finite), naming the instance, the first
    position whose difference exceeds `tolerance`, its token and both log-probs."""
    import math
    if len(engine_logprobs) != len(tokens) or len(trainer_logprobs) != len(tokens) or not tokens:
        raise WeightSyncError(f"weight probe of {label}: {len(tokens)} tokens, {len(engine_logprobs)} engine and "
                              f"{len(trainer_logprobs)} trainer log-probs")
    diffs = [abs(float(a) - float(b)) for a, b in zip(engine_logprobs, trainer_logprobs)]
    bad = [i for i, d in enumerate(diffs) if not math.isfinite(d) or d > tolerance]
    mean = sum(diffs) / len(diffs) if all(math.isfinite(d) for d in diffs) else float("nan")
    if not (mean <= tolerance):
        i = bad[0] if bad else max(range(len(diffs)), key=lambda k: diffs[k])
        raise WeightSyncError(
            f"weight probe of {label}: the engine's greedy decode and the trainer's forward on the same weights "
            f"disagree, mean |log-prob difference| {mean:.4g} > tolerance {tolerance:g} over {len(tokens)} "
            f"tokens; first diverging position {i} (token {int(tokens[i])}): engine {float(engine_logprobs[i]):.4f}, "
            f"trainer {float(trainer_logprobs[i]):.4f}; {len(bad)} of {len(tokens)} positions over the tolerance. "
            f"The instance does not compute with the trainer's weights (loader, layout or sync broken)")
    return mean


def probe_prompt(tokenizer: Any, vocab_limit: Optional[int] = None) -> List[int]:
    """The fixed prompt of the weight probe: a fixed sentence in the run's tokenizer, else fixed token ids."""
    ids: List[int] = []
    try:
        ids = [int(t) for t in list(tokenizer.tokenize(WEIGHT_PROBE_TEXT))]
    except Exception:  # noqa: BLE001 - a tokenizer without `tokenize`: fixed ids below the vocabulary size
        ids = []
    if len(ids) < 4:
        vocab = int(vocab_limit or getattr(tokenizer, "vocab_size", 0) or 1000)
        ids = [(17 + 7919 * k) % vocab for k in range(16)]
    return ids


def surface(fn: Callable[[], Any]) -> Any:
    """Run `fn` (a `ray.get`); an ASP error raised inside an actor is re-raised as itself (RunError,
    WeightSyncError...), so the run ends with the named error rather than Ray's wrapper."""
    import ray
    try:
        return fn()
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, AspError):
            raise cause from exc
        raise


def address_in_use(exc: BaseException) -> bool:
    """Whether a failure (maybe wrapped by Ray, whose message carries the remote traceback) is EADDRINUSE."""
    text = f"{exc} {getattr(exc, 'cause', '')}".lower()
    return "address already in use" in text or "eaddrinuse" in text or "errno 98" in text


def device_peak_gib() -> Optional[float]:
    """This process's peak reserved device memory (GiB) since the last call, then the peak is reset: called
    once per sync, it spans the previous update and this export. None on CPU."""
    from mindspeed_asp.runtime.platform import current_platform
    platform = current_platform()
    if not platform.is_accelerator:
        return None
    mod = platform.torch_module
    peak = getattr(mod, "max_memory_reserved", None)
    if not callable(peak):
        return None
    value = float(peak()) / 2 ** 30
    reset = getattr(mod, "reset_peak_memory_stats", None)
    if callable(reset):
        reset()
    return value


def empty_device_cache() -> None:
    """Release the caching allocator's free blocks on this process's device, as stock does after
    `exit_infer_mode` (`torch.cuda.empty_cache()`, mapped to NPU by transfer_to_npu); no-op on CPU."""
    from mindspeed_asp.runtime.platform import current_platform
    platform = current_platform()
    hook = getattr(platform, "empty_cache", None)
    if callable(hook):
        hook()
        return
    if platform.is_accelerator:
        fn = getattr(platform.torch_module, "empty_cache", None)
        if callable(fn):
            fn()


READBACK_NAMES = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")


def node_address() -> Tuple[str, int]:
    """This process's node IP and a port free there (bound on every interface: peers on other nodes connect)."""
    import ray
    from mindspeed_asp.runtime.weight_sync.group_store import free_port
    return ray.util.get_node_ip_address(), free_port("")


# ------------------------------------------------------------------------ Megatron-side (run by __ray_call__)
def asp_sender_address(worker: Any) -> Tuple[str, int]:
    """The actor's node IP and a port free there: rank 0 of a weight group hosts the group's store."""
    return node_address()


def asp_dist_backend(worker: Any) -> str:
    """The weight-sync collective of this Megatron rank's platform: resolved where the sender runs (a CPU-only
    head node running the train task would otherwise pick gloo for NPU tensors)."""
    from mindspeed_asp.runtime.platform import current_platform
    return current_platform().dist_backend


def asp_host_weight_store(worker: Any, host: str, port: int, timeout_s: float) -> bool:
    """Bind this infer-TP rank's weight-group store at host:port on the sender's node: returns once bound,
    raises (EADDRINUSE) at once when another process took the port since it was probed."""
    from mindspeed_asp.runtime.weight_sync.group_store import host_store
    host_store(host, port, timeout_s, label="actor sender")
    return True


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
    from mindspeed_asp.runtime.weight_sync.checksums import tensor_checksum
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
        del params
        sm.offload_infer_params()
        out["peak_mem_gib"] = device_peak_gib()  # the previous update and this export (before releasing)
        empty_device_cache()  # the infer-TP buffers stay reserved in the allocator otherwise (7B: 15 GB)
    loss_patch.set_trainer_version(int(version))  # the next update trains from these weights
    return out


def asp_probe_log_probs(worker: Any, sequences: Sequence[Sequence[int]],
                        prompt_len: int) -> Optional[List[List[float]]]:
    """The trainer's side of the weight probe, on every Megatron rank (its TP/PP collectives need them all):
    MindSpeed-RL's own log-prob forward (`actor_hybrid.compute_log_prob`, the stage that computes
    `old_log_prob`) on `sequences` (the probe prompt + each instance's greedy tokens), at temperature 1 (the
    engine's greedy log-probs have no temperature). The last pipeline stage returns each sequence's response
    log-probs; the other ranks None.

    Rows are repeated to a whole number of micro-batches and the sequence padded to a multiple of 128 (what
    pipeline and sequence-parallel shapes need); padding sits after the response, so a causal forward's
    response positions do not see it."""
    import torch
    rows = [list(map(int, s)) for s in sequences]
    if not rows or len({len(r) for r in rows}) != 1 or len(rows[0]) <= prompt_len:
        raise WeightSyncError(f"weight probe: sequences of equal length beyond the prompt ({prompt_len}) needed")
    n, length = len(rows), len(rows[0])
    response = length - int(prompt_len)
    actor = worker.actor_hybrid.train_actor
    mbs = max(1, int(getattr(actor, "micro_batch_size", 1) or 1))
    while len(rows) % mbs:
        rows.append(rows[-1])
    width = -(-length // 128) * 128
    ids = torch.zeros(len(rows), width, dtype=torch.int64)
    ids[:, :length] = torch.tensor(rows, dtype=torch.int64)
    batch = {"input_ids": ids, "responses": ids[:, prompt_len:length].clone(),
             "prompt_length": torch.full((len(rows), 1), int(prompt_len), dtype=torch.int64),
             "response_length": torch.full((len(rows), 1), response, dtype=torch.int64)}
    temperature = getattr(actor, "temperature", 1.0)
    sm = worker.sharding_manager
    sm.enter_forward_mode()
    try:
        actor.temperature = 1.0
        output, _ = worker.actor_hybrid.compute_log_prob(batch)
    finally:
        actor.temperature = temperature
        sm.exit_forward_mode()
        empty_device_cache()
    if not worker.parallel_state.is_pipeline_last_stage(ignore_virtual=True):
        return None
    log_probs = torch.cat(list(output), dim=0).to(torch.float32)
    return log_probs[:n, :response].cpu().tolist()


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
        self.placements: List[InstancePlacement] = []
        self.driver: Any = None
        self.syncs = 0  # weight syncs done in this process (the first one probes the instances)
        self.last_probe: Dict[str, float] = {}
        self.startup: Dict[str, float] = {}  # start-up timings, logged for shell/ascend_first_run.sh
        self.handlers: List[Any] = list(trainer.actor_worker.actor_handlers)
        self.sampling = dict(trainer.actor_worker.generate_config.dict().get("sampling_config", {}))
        self.audit = open(self.asp.audit_path, "a") if getattr(self.asp, "audit_path", None) else None

    def _call_actors(self, fn: Callable[..., Any], *args: Any) -> List[Any]:
        """Run `fn(worker, *args)` on every Megatron rank (Ray's __ray_call__; see the module docstring)."""
        return [h.__ray_call__.remote(fn, *args) for h in self.handlers]

    # -- setup
    def start_pool(self, state: Dict[str, Any] | None = None) -> None:
        """Start the instances, the weight groups and the rollout driver; with a checkpoint `state`, the driver
        continues it (resume_state.py) and the first sync pushes the checkpointed weights as its version.

        Three waits, each with its own deadline and an error naming what is missing: the placement groups
        (free NPUs), the engines' construction (`asp.engine_start_timeout_s`, default 1800 s: dummy load,
        memory profile and a cold op cache take minutes), then the weight groups (`asp.sync_timeout_s`)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        from mindspeed_asp.integrations.mindspeed_rl.lockstep_rollout import LockstepRollout
        from mindspeed_asp.integrations.mindspeed_rl.rollout_worker import (
            RolloutWorker, ascend_engine_factory, instance_env)
        gen = self.t.actor_worker.generate_config.dict()
        model_path = self.t.actor_worker.megatron_config.tokenizer_name_or_path
        tp, m, n = self.topo.infer_tp, self.asp.instances, self.topo.n
        mem = float(self.asp.rollout_memory_utilization)
        cls = ray.remote(resources={"NPU": 1}, num_cpus=1)(RolloutWorker)

        def spawn(j: int, place: InstancePlacement) -> List[Any]:
            out = []
            for r in range(tp):
                env = instance_env(j, r, tp, place.addr, place.port)
                strategy = PlacementGroupSchedulingStrategy(placement_group=place.pg, placement_group_bundle_index=r)
                out.append(cls.options(runtime_env={"env_vars": env}, name=rank_actor_name(j, r),
                                       scheduling_strategy=strategy).remote(
                    j, r, n, self.sampling, lambda g=gen, p=model_path, u=mem: ascend_engine_factory(g, p, u)))
            return out

        placement_timeout = float(self.asp.placement_timeout_s)
        t0 = time.time()
        self.workers, self.placements = start_instances(
            m, tp, lambda j: instance_placement(tp, placement_timeout, instance=j), spawn,
            float(self.asp.engine_start_timeout_s))
        t1 = time.time()
        timeout = float(self.asp.sync_timeout_s)
        # One weight group per infer-TP rank: the Megatron rank holding that shard + rank r of every instance,
        # rendezvous at the sender's node. Built once and reused for every sync.
        for r in range(tp):
            backend = surface(lambda: ray.get(self.handlers[r].__ray_call__.remote(asp_dist_backend),
                                              timeout=timeout))
            form_weight_group(r, self.handlers[r], [ranks[r] for ranks in self.workers], backend, timeout)
        self.startup = {"engines": float(m * tp), "engines_s": t1 - t0, "groups": float(tp),
                        "groups_s": time.time() - t1}
        labels = [[rank_actor_name(j, r) for r in range(tp)] for j in range(m)]
        # the rollout control the standalone runtime uses, configured from the same asp: keys (one capacity
        # rule, one training order per mode; runtime/rollout_control.py)
        self.driver = ray.remote(num_cpus=0, max_concurrency=8)(LockstepRollout).remote(
            self.workers, self.asp.mode, self.asp.max_lag, self.topo.gbs, self.asp.slots, n, 16,
            self.asp.work_stealing, self.asp.stale_policy, labels)
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
                                           state.get("isolated", []),  # absent in states before isolation
                                           state.get("dispatch")))  # absent in states before one restart rule

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

    def probe_due(self) -> bool:
        """Whether this sync runs the functional weight probe: the run's first sync, then every
        `asp.weight_probe_every` syncs (0: the first only; -1: never)."""
        every = int(self.asp.weight_probe_every)
        return every >= 0 and (self.syncs == 0 or (every > 0 and self.syncs % every == 0))

    def sync_weights(self, version: int) -> Dict[str, float]:
        """Pause stepping, check every instance is alive, broadcast, load, checksum on the instances (and the
        greedy probe when due), bump the version, resume; then compare. Raises on any failure."""
        import ray
        t0 = time.time()
        timeout = float(self.asp.sync_timeout_s)
        surface(lambda: ray.get(self.driver.pause.remote(timeout)))  # a hung engine fails the sync here, named
        surface(lambda: ray.get(self.driver.check_alive.remote(min(timeout, 60.0))))  # a dead one: RunError
        refs = {f"actor rank {i}": ref for i, ref in enumerate(self._call_actors(asp_push_weights, version))}
        for j, ranks in enumerate(self.workers):
            for r, w in enumerate(ranks):
                refs[f"instance {j} tp-rank {r}"] = w.receive_weights.remote()
        got = self._deadline(refs, timeout, version)
        bad = {k: v for k, v in got.items() if k.startswith("instance") and v != version}
        if bad:
            raise WeightSyncError(f"weight sync {version}: instances report other versions {bad}")
        sent = sum(float(v.get("bytes", 0.0)) for k, v in got.items() if k.startswith("actor"))
        if sent <= 0:
            raise WeightSyncError(f"weight sync {version}: the actor ranks sent nothing")
        # checksums on each instance's device (TP rank r against the actor rank holding infer-TP shard r)
        expected = {r: got[f"actor rank {r}"]["checksums"] for r in range(len(self.workers[0]))}
        sums = self._deadline({f"instance {j} tp-rank {r}": w.weight_checksums.remote(list(expected[r]))
                               for j, ranks in enumerate(self.workers) for r, w in enumerate(ranks)}, timeout, version)
        probe = self._probe_instances(version, timeout) if self.probe_due() else None
        surface(lambda: ray.get(self.driver.set_version.remote(version)))
        surface(lambda: ray.get(self.driver.resume.remote()))
        checked = 0
        for label, have in sums.items():
            want = expected[int(label.rsplit(" ", 1)[-1])]
            for name, value in want.items():
                if name not in have:
                    continue
                if abs(have[name] - value) > 1e-5 * max(1.0, abs(value)):
                    raise WeightSyncError(f"weight sync {version}: {label} holds other values for {name} after "
                                          f"loading (checksum {have[name]:.6g}, actor {value:.6g})")
                checked += 1
        if any(expected.values()) and not checked:
            raise WeightSyncError(f"weight sync {version}: no instance parameter could be checked")
        out = {"time/weight_sync": time.time() - t0, "asp/sync_bytes": sent, "asp/sync_readback": float(checked)}
        peaks = [float(v["peak_mem_gib"]) for k, v in got.items() if k.startswith("actor")
                 and v.get("peak_mem_gib") is not None]
        if peaks:  # accelerators only: the largest trainer rank's peak across the last update and this export
            out["asp/trainer_peak_mem_gib"] = max(peaks)
        if probe is not None:
            out.update(self._check_probe(version, probe, timeout))
        self.version = version
        self.syncs += 1
        return out

    def _deadline(self, refs: Dict[str, Any], timeout: float, version: int) -> Dict[str, Any]:
        """`sync_deadline`, where an instance actor that died during the round is the instance's RunError."""
        import ray
        from mindspeed_asp.integrations.mindspeed_rl.weight_transfer import sync_deadline
        try:
            return sync_deadline(refs, timeout)
        except WeightSyncError as exc:
            cause = exc.__cause__
            if isinstance(cause, ray.exceptions.RayActorError) and str(exc).startswith("instance"):
                label = str(exc).split(":", 1)[0]
                j = int(label.split()[1])
                raise RunError(f"rollout instance {j} died during weight sync {version} (TP ranks: "
                               f"{', '.join(rank_actor_name(j, r) for r in range(len(self.workers[j])))}; "
                               f"failed: {label}): {' '.join(str(cause).split())[:600]}") from exc
            raise

    def _probe_instances(self, version: int, timeout: float) -> Dict[str, Any]:
        """The instance side of the weight probe, while paused: every TP rank decodes the fixed prompt
        greedily (lockstep); TP ranks of one instance must agree."""
        prompt = probe_prompt(getattr(self.t, "tokenizer", None))
        tokens = int(self.asp.weight_probe_tokens)
        refs = {f"instance {j} tp-rank {r}": w.greedy_probe.remote(prompt, tokens)
                for j, ranks in enumerate(self.workers) for r, w in enumerate(ranks)}
        got = self._deadline(refs, timeout, version)
        out: Dict[str, Any] = {"prompt": prompt, "instances": []}
        for j, ranks in enumerate(self.workers):
            first = got[f"instance {j} tp-rank 0"]
            for r in range(1, len(ranks)):
                if got[f"instance {j} tp-rank {r}"]["tokens"] != first["tokens"]:
                    raise WeightSyncError(f"weight probe {version}: the TP ranks of instance {j} decoded different "
                                          f"tokens (rank 0 {first['tokens']}, rank {r} "
                                          f"{got[f'instance {j} tp-rank {r}']['tokens']}): not in lockstep")
            if int(first["version"]) != version:
                raise WeightSyncError(f"weight probe {version}: instance {j} probed version {first['version']}")
            out["instances"].append(first)
        return out

    def _check_probe(self, version: int, probe: Dict[str, Any], timeout: float) -> Dict[str, float]:
        """The trainer's forward on every instance's probe tokens (all Megatron ranks), compared per instance."""
        prompt = probe["prompt"]
        sequences = [prompt + list(p["tokens"]) for p in probe["instances"]]
        refs = {f"actor rank {i}": ref for i, ref in
                enumerate(self._call_actors(asp_probe_log_probs, sequences, len(prompt)))}
        got = self._deadline(refs, timeout, version)
        trainer = next((v for v in got.values() if v is not None), None)
        if trainer is None:
            raise WeightSyncError(f"weight probe {version}: no Megatron rank returned log-probs (no last stage?)")
        tol = float(self.asp.weight_probe_tolerance)
        diffs = [compare_probe(f"instance {j} at version {version}", p["tokens"], p["logprobs"], trainer[j], tol)
                 for j, p in enumerate(probe["instances"])]
        self.last_probe = {"version": float(version), "absdiff_max": max(diffs),
                           "tokens": float(len(sequences[0]) - len(prompt))}
        return {"asp/weight_probe_absdiff": max(diffs), "asp/weight_probe_instances": float(len(diffs))}

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

    def take_trainable(self, data_iters: Any = None) -> Dict[str, Any]:
        """The next minibatch for the current version. With `data_iters`, a window is fed whenever the driver
        reports the supply (queued + in flight + ready) below one update's M groups: under `stale_policy:
        drop` every dropped group shrinks it, and the update would otherwise wait for groups that no longer
        exist. RunError when the loader has nothing left to feed."""
        import ray
        m = int(self.topo.gbs) if data_iters is not None else 0
        while True:
            got = surface(lambda: ray.get(self.driver.next_minibatch.remote(self.version, 86400.0, m)))
            if not got.get("need_window"):
                return got
            if not self.feed_window(data_iters):
                dropped = got.get("counters", {}).get("queue/dropped_stale", 0)
                raise RunError(f"no minibatch for version {self.version} can be formed: the rollout pool holds "
                               f"{got['supply']} groups, an update needs {m}, and the loader has no batch left to "
                               f"feed ({dropped} groups dropped as stale under asp.stale_policy "
                               f"{self.asp.stale_policy!r})")

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


def rank_actor_name(instance: int, tp_rank: int) -> str:
    """The Ray actor name of TP rank `tp_rank` of rollout instance `instance` (named in errors)."""
    return f"asp_rollout_{instance}_{tp_rank}"


def placement_shortfall(bundles: Sequence[Dict[str, float]], available: Dict[str, float], what: str) -> str:
    """Why a STRICT_PACK placement group of `bundles` is not placed, from the cluster's free resources."""
    need: Dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            need[k] = need.get(k, 0.0) + float(v)
    short = [f"{v:g} {k}, the cluster has {float(available.get(k, 0.0)):g} free" for k, v in sorted(need.items())
             if float(available.get(k, 0.0)) < v]
    if short:
        return f"{what} needs " + "; ".join(short)
    wants = ", ".join(f"{v:g} {k}" for k, v in sorted(need.items()))
    return (f"{what} needs {wants} on one node (STRICT_PACK: one instance's TP ranks share a node); the cluster "
            f"has enough free in total ({', '.join(f'{float(available.get(k, 0.0)):g} {k}' for k in sorted(need))}) "
            f"but not on any one node")


def rendezvous(pg: Any) -> Tuple[str, int, str]:
    """The IP, a free port and the node id of the node that holds bundle 0 of `pg` (a probe actor there)."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    probe = ray.remote(num_cpus=0)(_NodeProbe).options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=0)).remote()
    try:
        addr, port, node_id = ray.get(probe.address.remote())
    finally:
        ray.kill(probe)
    return str(addr), int(port), str(node_id)


def instance_placement(tp: int, timeout_s: float = PLACEMENT_TIMEOUT_S, instance: Optional[int] = None,
                       bundle: Optional[Dict[str, float]] = None) -> InstancePlacement:
    """A STRICT_PACK placement group for one instance's `tp` ranks, and the rendezvous of its TP world: the IP and
    a free port of the node that holds it (not the train task's node: a 32B instance may sit on another).

    The wait is bounded: a cluster with fewer free NPUs than the run needs never places the group, and the
    RunError after `timeout_s` says what is missing (from `ray.available_resources()`); the group is removed."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    bundles = [dict(bundle or {"NPU": 1, "CPU": 1}) for _ in range(tp)]
    pg = placement_group(bundles, strategy="STRICT_PACK")
    what = f"placement group for instance {instance}" if instance is not None else "placement group"
    try:
        ready, _ = ray.wait([pg.ready()], timeout=float(timeout_s))
        if not ready:
            raise RunError(f"{placement_shortfall(bundles, ray.available_resources(), what)}; not placed within "
                           f"{float(timeout_s):g} s (asp.placement_timeout_s)")
        addr, port, node_id = rendezvous(pg)
    except BaseException:
        remove_placement_group(pg)
        raise
    return InstancePlacement(pg, addr, port, node_id)


def start_instances(m: int, tp: int, place: Callable[[int], InstancePlacement],
                    spawn: Callable[[int, InstancePlacement], List[Any]], timeout_s: float,
                    port_attempts: int = PORT_ATTEMPTS) -> Tuple[List[List[Any]], List[InstancePlacement]]:
    """Place and build `m` instances of `tp` rank actors and wait until every engine is built (`ready()`).

    The engines' build (dummy load, memory profile, op compilation; all instances at once) has its own
    deadline `timeout_s`, so it never counts against a weight sync's. A rank whose constructor fails ends the
    start with a RunError naming it and the cause, except EADDRINUSE on its TP world's rendezvous port (probed
    free, then taken by another process before vLLM bound it): that instance is built again at a port probed
    anew, up to `port_attempts` times. At the deadline, the RunError names the instances not built yet."""
    import ray
    placements = [place(j) for j in range(m)]
    workers = [spawn(j, placements[j]) for j in range(m)]
    attempts = [1] * m
    deadline = time.monotonic() + float(timeout_s)
    pending = {w.ready.remote(): (j, r) for j in range(m) for r, w in enumerate(workers[j])}
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            silent = sorted(set(pending.values()))
            by: Dict[int, List[int]] = {}
            for j, r in silent:
                by.setdefault(j, []).append(r)
            names = "; ".join(f"instance {j} ({', '.join(rank_actor_name(j, r) for r in rs)})"
                              for j, rs in sorted(by.items()))
            raise RunError(f"rollout engines not built within {float(timeout_s):g} s (asp.engine_start_timeout_s): "
                           f"{names}; {m - len(by)} of {m} instances are ready")
        done, _ = ray.wait(list(pending), num_returns=1, timeout=min(left, 5.0))
        for ref in done:
            if ref not in pending:  # an instance rebuilt above dropped its other ranks' refs
                continue
            j, r = pending.pop(ref)
            try:
                ray.get(ref)
                continue
            except Exception as exc:  # noqa: BLE001 - any failure of a rank's start is classified below (port race or not)
                failure = exc
            if address_in_use(failure) and attempts[j] < port_attempts:
                for w in workers[j]:  # the other ranks wait at the dead rendezvous: rebuild them all
                    ray.kill(w, no_restart=True)
                for other in [x for x, (jj, _) in pending.items() if jj == j]:
                    del pending[other]
                wait_names_free([rank_actor_name(j, k) for k in range(tp)])
                addr, port, node_id = rendezvous(placements[j].pg)
                placements[j] = InstancePlacement(placements[j].pg, addr, port, node_id)
                attempts[j] += 1
                workers[j] = spawn(j, placements[j])
                pending.update({w.ready.remote(): (j, k) for k, w in enumerate(workers[j])})
                continue
            raise RunError(f"rollout instance {j} failed to start ({rank_actor_name(j, r)}, attempt {attempts[j]}): "
                           f"{' '.join(str(failure).split())[:1500]}") from failure
    return workers, placements


def wait_names_free(names: Sequence[str], timeout_s: float = 60.0) -> None:
    """Wait until no live actor holds these names (a killed actor releases its name asynchronously)."""
    import ray
    deadline = time.monotonic() + timeout_s
    for name in names:
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name)
            except ValueError:
                break
            time.sleep(0.1)
        else:
            raise RunError(f"actor name {name} still taken {timeout_s:g} s after its actor was killed")


def form_weight_group(r: int, sender: Any, receivers: Sequence[Any], backend: str, timeout_s: float,
                      address: Callable[[Any], Tuple[str, int]] = asp_sender_address,
                      port_attempts: int = PORT_ATTEMPTS) -> Tuple[str, int]:
    """Form the weight group of infer-TP rank r: `sender` (the Megatron rank holding shard r) binds the
    group's store at a port probed free on its node, and only once it is bound are the `receivers` (TP
    rank r of every instance) told the address. A port taken between the probe and the bind (EADDRINUSE)
    is probed again, up to `port_attempts` times: no receiver ever waits at a port its sender never got.
    Returns the group's (host, port)."""
    import ray
    from mindspeed_asp.integrations.mindspeed_rl.weight_transfer import sync_deadline
    world = 1 + len(receivers)
    last = ""
    for _ in range(port_attempts):
        host, port = surface(lambda: ray.get(sender.__ray_call__.remote(address), timeout=timeout_s))
        try:
            ray.get(sender.__ray_call__.remote(asp_host_weight_store, host, port, timeout_s), timeout=timeout_s)
        except Exception as exc:
            if not address_in_use(exc):
                raise WeightSyncError(f"weight group {r}: the sender cannot host its store at {host}:{port}: "
                                      f"{' '.join(str(exc).split())[:1500]}") from exc
            last = f"{host}:{port}"
            continue
        refs = {f"instance {j} tp-rank {r}": w.init_weight_group.remote(backend, host, port, 1 + j, world, timeout_s)
                for j, w in enumerate(receivers)}
        refs[f"actor rank {r} (sender)"] = sender.__ray_call__.remote(asp_init_weight_sender, backend, host, port,
                                                                      world, timeout_s)
        sync_deadline(refs, timeout_s)
        return host, port
    raise WeightSyncError(f"weight group {r}: every port probed for its store was taken before the sender bound "
                          f"it ({port_attempts} attempts; last {last})")


def check_launch(trainer: Any, topo: Any) -> None:
    """The driver's check that MindSpeed-RL and ASP read the same config: no entry-line override of a key ASP
    reads, and the trainer's batch shape equal to the file's (launch_config.py)."""
    import sys
    from mindspeed_asp.config import read_yaml
    from mindspeed_asp.integrations.mindspeed_rl.launch_config import check_entry_overrides, check_launch_agrees
    from mindspeed_asp.integrations.mindspeed_rl.resume_state import check_resume_settings
    data = read_yaml(topo.path)
    check_entry_overrides(sys.argv[1:], data, topo.path)
    check_launch_agrees(trainer, data, topo.path)
    mc = trainer.actor_worker.megatron_config
    check_resume_settings(getattr(mc, "load", None), bool(getattr(mc, "finetune", False)),
                          bool(getattr(mc, "no_load_optim", False)), topo.asp.ignore_saved_state, topo.path)


def asp_fit(self, data_iters: Any) -> None:
    """RayGRPOTrainer.fit for modes `asp`/`async` (separate rollout pool); stock otherwise."""
    from mindspeed_asp.integrations.mindspeed_rl.config_section import topology_from_env
    topo = topology_from_env()
    if topo is not None and topo.asp.mode != "stock":
        check_launch(self, topo)
    if topo is None or not topo.separate_pool:
        if topo is not None and topo.colocated_plan:
            track_colocated_plan(self, topo, data_iters)
        return _ORIGINAL_FIT["fit"](self, data_iters)
    import ray
    from codetiming import Timer
    from mindspeed_rl.trainer.utils.compute_utils import compute_grpo_data_metrics
    from mindspeed_rl.utils.loggers import Loggers
    from mindspeed_rl.utils.metrics import Metric
    from mindspeed_rl.utils.utils import metrics_post_processing, metrics_sort
    from mindspeed_rl.workers.scheduler.launcher import RayActorGroup

    from mindspeed_asp.integrations.mindspeed_rl.resume_state import STATE_HOOK, read_state

    logger = Loggers("asp_async_trainer")
    run = AsyncFit(self, topo)
    iteration = self.actor_worker.get_iteration()
    state = None
    if iteration > 0:  # MindSpeed-RL resumed from a checkpoint: continue ASP's state of that iteration
        state = read_state(self.actor_worker.megatron_config.load, iteration, run.settings())
    run.start_pool(state)
    engines, engines_s = int(run.startup['engines']), run.startup['engines_s']
    logger.info(f"asp: start-up: {engines} rollout engines built in {engines_s:.1f} s "
                f"(asp.engine_start_timeout_s {float(topo.asp.engine_start_timeout_s):g} s)")
    logger.info(f"asp: start-up: {int(run.startup['groups'])} weight groups formed in {run.startup['groups_s']:.1f} s "
                f"(asp.sync_timeout_s {float(topo.asp.sync_timeout_s):g} s)")
    if run.last_probe:
        logger.info(f"asp: weight probe at version {int(run.last_probe['version'])}: every instance's greedy "
                    f"decode of {int(run.last_probe['tokens'])} tokens matches the trainer's forward, mean "
                    f"|log-prob difference| at most {run.last_probe['absdiff_max']:.3g}")
    if state is None:
        for _ in range(topo.asp.max_lag + 1):  # keep the instances fed up to the lag bound
            run.feed_window(data_iters)
    else:
        skipped = run.skip_fed_windows(data_iters, self.actor_worker.get_consumed_train_samples() // topo.gbs)
        logger.info(f"asp: resumed at iteration {iteration}, policy version {run.version}: "
                    f"{len(state['ready'])} finished groups kept, {len(state['unfinished'])} to generate again, "
                    f"{skipped} fed windows skipped")
    setattr(self, STATE_HOOK, run.checkpoint_state)
    self.skip_actor_log_prob = False  # the proximal log-prob is always recomputed
    self.actor_worker.skip_actor_log_prob = False
    n, gbs = topo.n, topo.gbs
    while iteration < self.train_iters:
        metrics = Metric()
        with Timer(name="iteration", logger=None) as all_timer:
            got = run.take_trainable(data_iters)
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
        for key, value in throughput_metrics(self.kwargs, grpo_data_metrics, gbs, n, all_timer.last,
                                             metrics_result["timing/update"], groups, topo, lmt).items():
            metrics.update(key, value)
        asp_m = iteration_metrics(groups, got["lags"], topo.asp.max_lag, topo.asp.instances, all_timer.last,
                                  got["wait_s"], sync["time/weight_sync"], topo.devices)
        asp_m.update({f"asp/{k}": float(v) for k, v in got.get("counters", {}).items()})
        asp_m["asp/policy_version"] = float(run.version)
        asp_m["asp/devices"] = float(topo.devices.total)  # e2e_tps' denominator, for `asp compare`
        asp_m["asp/sync_readback"] = sync["asp/sync_readback"]
        asp_m.update({k: v for k, v in sync.items() if k.startswith("asp/weight_probe")})
        metrics.update(value=asp_m)
        iteration += 1
        run.record(iteration, got, sync)
        logger.info(metrics.metric, iteration, self.train_iters)
        self.data_strategy.clear_main()
        if self.tensorboard is not None:
            for k, v in metrics.metric.items():
                self.tensorboard.add_scalar(f"train/{k}", v, iteration)
        if getattr(self, "wandb", None) is not None:  # as stock fit (grpo_trainer_hybrid.py)
            self.wandb.log_metrics(metrics.metric, iteration)
        if getattr(self, "swanlab", None) is not None:
            self.swanlab.log_metrics(metrics.metric, iteration)
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
