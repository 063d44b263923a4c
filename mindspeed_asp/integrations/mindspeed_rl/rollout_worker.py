"""One inference-only rollout worker per vLLM-Ascend instance (per TP rank), separate from Megatron's workers.

MindSpeed-RL only runs colocated engines that move in lockstep with training. ASP's instances are
independent: each is `infer_tp` of these workers (an SPMD vLLM engine with `external_launcher`, its own
torch.distributed world of size infer_tp), generating continuously while the trainer updates.

Lockstep inside an instance: every TP rank must run the same engine calls in the same order, so the
driver never lets a worker free-run; it calls `run(new_groups, steps)` with identical arguments on all TP
ranks of an instance: add the new requests, run that many `engine.step()`s, return what finished. Only TP
rank 0's answer is used. Prompts go in as `prompt_token_ids` (MindSpeed-RL master decodes them to text and
re-tokenises), and vLLM's per-token log-probs are kept (MindSpeed-RL drops them).
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from mindspeed_asp.errors import WeightSyncError
from mindspeed_asp.runtime.requests import GroupRequest, GroupResult, SampleResult


def make_sampling_params(sampling: Dict[str, Any], seed: Optional[int] = None) -> Any:
    """vLLM SamplingParams for one sample from MindSpeed-RL's `generate_config.sampling_config`.

    One request per sample (n=1) rather than vLLM's n: engine-level fan-out of n differs between vLLM
    releases, and per-sample requests keep each sample's log-probs and finish time. `logprobs=0` returns
    the log-prob of the sampled token only.
    """
    from vllm import SamplingParams
    return SamplingParams(n=1, logprobs=0, max_tokens=int(sampling.get("max_tokens", 128)),
                          top_p=float(sampling.get("top_p", 1.0)), top_k=int(sampling.get("top_k", -1)),
                          min_p=float(sampling.get("min_p", 0.0)),
                          temperature=float(sampling.get("temperature", 1.0)),
                          detokenize=False, ignore_eos=bool(sampling.get("ignore_eos", False)),
                          seed=seed)


def bind_npu() -> int:
    """Select this actor's NPU the way MindSpeed-RL's BaseRayWorker does: from Ray's accelerator ids
    (runtime_env sets RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES, so every device stays visible)."""
    import ray
    import torch
    import torch_npu  # noqa: F401  (registers torch.npu)
    local = int(ray.get_runtime_context().get_accelerator_ids()["NPU"][0])
    os.environ["LOCAL_RANK"] = str(local)
    torch.npu.set_device(local)  # type: ignore[attr-defined]
    return local


# GenerateConfig keys stock `_build_rollout` passes to VLLMInferEngine and the pool forwards as they are, with
# GenerateConfig's defaults at 05a90d7 (used only when a key is absent from the dict).
FORWARDED_KEYS: Dict[str, Any] = {
    "infer_tensor_parallel_size": 8, "infer_expert_parallel_size": 1, "enable_prefix_caching": False,
    "num_scheduler_steps": 1, "max_num_seqs": 1, "max_model_len": 2048, "max_num_batched_tokens": 2048,
    "dtype": "bfloat16", "trust_remote_code": False, "enforce_eager": True, "torchair_graph": False,
    "ascend_scheduler_config_enabled": True, "enable_expert_parallel": False, "expert_map_path": None,
    "eplb_token_collects": False, "eplb_token_save_path": "./", "limit_mm_image_per_prompt": 1,
    "limit_mm_video_per_prompt": 0,
}
# Keywords the pool sets on purpose, and why: those of stock's call it does not forward as they are, plus
# `load_format`, which stock leaves at the engine's default (a contract test holds this list and
# FORWARDED_KEYS together to `_build_rollout`'s keyword set and to VLLMInferEngine's parameters).
POOL_SET_KEYS: Dict[str, str] = {
    "tokenizer_name_or_path": "the actor's megatron_training.tokenizer_name_or_path, as stock",
    "train_tensor_parallel_size": "None: a rollout instance holds no Megatron parallel state",
    "train_pipeline_parallel_size": "None: a rollout instance holds no Megatron parallel state",
    "train_expert_parallel_size": "None: a rollout instance holds no Megatron parallel state",
    "train_context_parallel_size": "None: a rollout instance holds no Megatron parallel state",
    "infer_pipeline_parallel_size": "1: vLLM pipeline parallelism is refused by the config check",
    "megatron_config": "not passed: VLLMInferEngine takes it into **kwargs and never reads it",
    "sampling_config": "generate_config.sampling_config without num_completions: the pool sends one request "
                       "per sample (SamplingParams n=1, built per request)",
    "gpu_memory_utilization": "asp.rollout_memory_utilization: a dedicated rollout device holds only the engine",
    "load_format": "'megatron', the engine's default stock relies on: dummy weights and MindSpeed-RL's megatron "
                   "weight loaders; the real weights arrive with the first sync",
}


def engine_kwargs(generate_config: Dict[str, Any], tokenizer_name_or_path: str,
                  memory_utilization: float) -> Dict[str, Any]:
    """VLLMInferEngine's keywords for one rollout instance: every key stock forwards, as stock forwards it,
    except POOL_SET_KEYS. Why every key: a dropped one silently takes the engine's default, e.g.
    `ascend_scheduler_config_enabled: false` of the 32B-A3 config, without which vllm-ascend refuses
    max_num_batched_tokens < max_model_len at start-up."""
    g = generate_config
    kwargs = {k: g.get(k, default) for k, default in FORWARDED_KEYS.items()}
    kwargs.update(
        tokenizer_name_or_path=tokenizer_name_or_path,
        train_tensor_parallel_size=None, train_pipeline_parallel_size=None, train_expert_parallel_size=None,
        train_context_parallel_size=None, infer_pipeline_parallel_size=1,
        sampling_config=dict(g.get("sampling_config") or {}), gpu_memory_utilization=float(memory_utilization),
        load_format="megatron")
    return kwargs


def ascend_engine_factory(generate_config: Dict[str, Any], tokenizer_name_or_path: str,
                          memory_utilization: float = 0.9) -> Any:
    """MindSpeed-RL's VLLMInferEngine without Megatron parallel state (train sizes None), megatron load format.

    It loads dummy weights, installs MindSpeed-RL's megatron weight loaders and vllm-ascend's patches; the
    real weights arrive with the first sync (version 0). `memory_utilization` replaces the colocated
    `gpu_memory_utilization` (0.4 leaves room for Megatron on shared devices): a rollout device holds only
    the engine, so its KV cache takes what the engine's weights leave (asp.rollout_memory_utilization).
    """
    bind_npu()
    from mindspeed_rl.models.rollout.vllm_engine import VLLMInferEngine  # NPU nodes only
    return VLLMInferEngine(**engine_kwargs(generate_config, tokenizer_name_or_path, memory_utilization))


def vllm_engine_factory(model_path: str, **engine_kwargs: Any) -> Any:
    """A plain `vllm.LLM` (CPU and GPU tiers, tests): token-id prompts, no tokenizer."""
    from vllm import LLM
    kwargs = dict(skip_tokenizer_init=True, enforce_eager=True)
    kwargs.update(engine_kwargs)
    return LLM(model=model_path, **kwargs)


class RolloutWorker:
    """Owns one vLLM engine (one TP rank of instance `instance`); driven step-wise by the rollout driver.

    `engine_factory()` returns either MindSpeed-RL's VLLMInferEngine (attribute `llm`, Ascend) or a plain
    `vllm.LLM` (CPU/GPU tests); both expose vLLM's `LLMEngine` for add_request/step.
    """

    def __init__(self, instance: int, tp_rank: int, n: int, sampling: Dict[str, Any],
                 engine_factory: Callable[[], Any]) -> None:
        self.instance, self.tp_rank, self.n = instance, tp_rank, n
        self.sampling = dict(sampling)
        self.base_seed = sampling.get("seed")
        self.engine_obj = engine_factory()
        self.llm = getattr(self.engine_obj, "llm", self.engine_obj)
        self.engine = self.llm.llm_engine
        self.version = -1 if hasattr(self.engine_obj, "sync_model_weights") else 0
        self.jobs: Dict[str, Tuple[GroupRequest, int]] = {}  # group id -> (request, version at admission)
        self.started: Dict[str, float] = {}
        self.enqueued: Dict[str, float] = {}
        self.samples: Dict[str, Dict[int, Any]] = {}  # group id -> sample index -> finished completion
        self.busy_time = 0.0
        self.decode_steps = 0
        self.generated_tokens = 0
        self._receiver: Any = None
        self._weights: Dict[str, Any] = {}
        self._kv_ready = not hasattr(self.engine_obj, "init_cache_engine")
        # groups that finished while a probe stepped the engine: handed to the driver by the next `run`
        self._finished_early: List[GroupResult] = []
        self._probes: Dict[str, Any] = {}  # probe request id -> its completion once finished
        self._probe_count = 0

    def ready(self) -> Dict[str, Any]:
        """Answers once the constructor (the engine build) has returned. Ray queues it behind the constructor,
        so the trainer waits on it with the engines' own deadline (asp.engine_start_timeout_s) before it forms
        the weight groups: build time never counts against asp.sync_timeout_s. Also the cheap liveness probe
        the driver sends before a sync."""
        return {"instance": self.instance, "tp_rank": self.tp_rank, "version": self.version, "pid": os.getpid()}

    # ------------------------------------------------------------------ generation
    def _ensure_kv(self) -> None:
        if not self._kv_ready:
            self.engine_obj.init_cache_engine()  # once; the KV cache stays resident between calls
            self._kv_ready = True

    def run(self, new_jobs: List[Tuple[GroupRequest, int]], steps: int) -> List[GroupResult]:
        """Add `new_jobs` ((request, version at admission) pairs), run up to `steps` engine steps, return the
        groups that finished. Every TP rank of an instance is called with the same arguments (lockstep)."""
        if self.version < 0:
            raise RuntimeError(f"instance {self.instance} has no weights yet: run a weight sync first")
        self._ensure_kv()
        now = time.time()
        for req, version in new_jobs:
            gid = req.group_id
            self.jobs[gid] = (req, int(version))
            self.started[gid] = now
            self.samples[gid] = {}
            prompt = {"prompt_token_ids": list(req.prompt_token_ids)}
            for i in range(req.n):
                seed = None if req.seed is None else int(req.seed) + i
                self.engine.add_request(f"{gid}#s{i}", prompt, make_sampling_params(
                    dict(self.sampling, max_tokens=req.max_new_tokens), seed))
        done, self._finished_early = self._finished_early, []
        t0 = time.monotonic()
        stepped = False
        for _ in range(max(1, steps)):
            if not self.engine.has_unfinished_requests():
                break
            done += self._absorb(self.engine.step())
            stepped = True
        if stepped:
            self.busy_time += time.monotonic() - t0
        return done

    def _absorb(self, outputs: Iterable[Any]) -> List[GroupResult]:
        """One engine step's outputs: finished samples join their group (a group is returned when all its
        samples are in), finished probe requests are kept for `greedy_probe`."""
        self.decode_steps += 1
        done: List[GroupResult] = []
        for out in outputs:
            if not out.finished:
                continue
            if out.request_id in self._probes:
                self._probes[out.request_id] = out.outputs[0]
                continue
            gid, _, idx = out.request_id.rpartition("#s")
            if gid in self.samples:
                self.samples[gid][int(idx)] = out.outputs[0]
                if len(self.samples[gid]) == self.jobs[gid][0].n:
                    done.append(self._collect(gid))
        return done

    def greedy_probe(self, prompt_ids: Sequence[int], max_tokens: int) -> Dict[str, Any]:
        """Decode `prompt_ids` greedily for exactly `max_tokens` tokens through this engine, as loaded by the
        last sync; returns the tokens and their log-probs (the trainer compares them with its own forward on
        the same weights: a functional check that the engine computes with the trainer's weights).

        Called on every TP rank of the instance with the same arguments while the driver is paused
        (lockstep). Requests already in the engine are stepped along with the probe; groups that finish
        meanwhile are returned by the next `run`. Greedy sampling applies no temperature, so vLLM's raw and
        processed log-probs agree here."""
        from vllm import SamplingParams
        if self.version < 0:
            raise WeightSyncError(f"instance {self.instance} tp-rank {self.tp_rank}: probe before any weight sync")
        self._ensure_kv()
        rid = f"asp-probe-{self._probe_count}"
        self._probe_count += 1
        self._probes[rid] = None
        self.engine.add_request(rid, {"prompt_token_ids": [int(t) for t in prompt_ids]}, SamplingParams(
            n=1, temperature=0.0, max_tokens=int(max_tokens), logprobs=0, ignore_eos=True, detokenize=False))
        t0 = time.monotonic()
        try:
            while self._probes[rid] is None:
                if not self.engine.has_unfinished_requests():
                    raise WeightSyncError(f"instance {self.instance} tp-rank {self.tp_rank}: the engine dropped "
                                          f"the weight probe request")
                self._finished_early += self._absorb(self.engine.step())
        finally:
            self.busy_time += time.monotonic() - t0
            c = self._probes.pop(rid)
        ids = [int(t) for t in c.token_ids]
        lps = [float(d[t].logprob) if t in d else float("nan") for t, d in zip(ids, c.logprobs or [])]
        return {"tokens": ids, "logprobs": lps, "version": self.version}

    def _collect(self, gid: str) -> GroupResult:
        req, version = self.jobs.pop(gid)
        start = self.started.pop(gid)
        completions = self.samples.pop(gid)
        samples = []
        for i in range(req.n):
            c = completions[i]
            ids = list(c.token_ids)
            lp = [float(d[tok].logprob) if tok in d else float("nan") for tok, d in zip(ids, c.logprobs or [])]
            self.generated_tokens += len(ids)
            samples.append(SampleResult(ids, lp, version, self.version, str(c.finish_reason or "stop")))
        return GroupResult(gid, req.prompt_id, self.instance, samples, list(req.prompt_token_ids),
                           start, start, time.time(), minibatch=req.minibatch)

    def unfinished(self) -> int:
        return len(self.jobs)

    def stats(self) -> Dict[str, Any]:
        """Per-instance timings for the trainer's metrics (`timing/rollout_inst{k}`)."""
        return {"instance": self.instance, "busy_s": self.busy_time, "decode_steps": self.decode_steps,
                "generated_tokens": self.generated_tokens, "version": self.version, "in_flight": len(self.jobs)}

    # ------------------------------------------------------------------ weights
    def init_weight_group(self, backend: str, host: str, port: int, rank: int, world_size: int,
                          timeout_s: float = 600.0) -> bool:
        """Join the trainer's weight group (one per infer-TP rank) as `rank`, once for the whole run: HCCL
        communicators rebuilt per sync exhaust HCCL's resources."""
        from mindspeed_asp.integrations.mindspeed_rl.weight_transfer import WeightReceiver
        from mindspeed_asp.runtime.platform import current_platform
        platform = current_platform()
        device = platform.device(int(os.environ.get("LOCAL_RANK", "0"))) if platform.is_accelerator else None
        self._receiver = WeightReceiver(backend, host, port, rank, world_size, device=device, timeout_s=timeout_s,
                                        label=f"instance {self.instance} tp-rank {self.tp_rank}")
        return True

    def receive_weights(self) -> int:
        """Receive one round from the trainer's sender (rank 0 of the group), load it, return its version."""
        if self._receiver is None:
            raise WeightSyncError(f"instance {self.instance} tp-rank {self.tp_rank}: weight group not initialised")
        version, params = self._receiver.receive()
        self._weights = params  # MindSpeed-RL's loader aliases param.data to these: keep them alive
        self.engine_obj.sync_model_weights(params, load_format="megatron")
        self.llm.reset_prefix_cache()
        self.version = int(version)
        return self.version

    def weight_checksums(self, names: Iterable[str]) -> Dict[str, float]:
        """`tensor_checksum` of the engine's parameters that keep their HF name and shape after loading
        (embeddings, norms, lm_head), computed here on the engine's device: only floats travel back to the
        trainer, which compares them with its export's (no full tensor copies through Ray)."""
        from mindspeed_asp.runtime.weight_sync.checksums import tensor_checksum
        model = getattr(self.engine_obj, "model", None)
        if model is None:
            raise WeightSyncError(f"instance {self.instance} tp-rank {self.tp_rank}: the engine exposes no model "
                                  f"to check")
        params = dict(model.named_parameters())
        return {n: float(tensor_checksum(params[n].detach())) for n in names if n in params}


def instance_env(instance: int, tp_rank: int, tp: int, master_addr: str, master_port: int) -> Dict[str, str]:
    """torch.distributed env of one instance's SPMD world (vLLM's external_launcher reads it)."""
    return {"WORLD_SIZE": str(tp), "RANK": str(tp_rank), "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port), "ASP_ROLLOUT_INSTANCE": str(instance),
            "VLLM_ASCEND_ENABLE_NZ": os.environ.get("VLLM_ASCEND_ENABLE_NZ", "0")}
