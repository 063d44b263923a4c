"""ASP's settings inside a MindSpeed-RL training YAML, and the cluster shape they imply.

MindSpeed-RL's config classes reject unknown keys (`BaseConfig.update` raises "The key: X is missing"), but
`parse_training_config` reads only its own sections, so ASP's settings live in a top-level `asp:` section
(validated strictly by `MsrlAspSection`: the project's `AspSection` plus the loss settings of
`ObjectiveSection` and what only the MindSpeed-RL integration reads). This module reads both that section and
the MindSpeed-RL sections ASP depends on (batch size, n, NPUs, inference TP, expert parallelism) and checks
that they agree, naming the offending key, before any NPU is touched or Ray is started.

The deployment follows `asp.mode` alone (docs/ascend.md section 1): `asp` and `async` run a separate rollout
pool at any `max_lag` (0 included), `colocated` runs the plan on MindSpeed-RL's own colocated engines
(synchronous, lag 0), `stock` is MindSpeed-RL unchanged.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Dict, Literal, Optional, Tuple

from pydantic import Field

from mindspeed_asp.config import (MSRL_SECTIONS, AspSection, ObjectiveSection, Timeout, read_yaml,
                                  validate_section)
from mindspeed_asp.errors import ConfigError
from mindspeed_asp.core.metrics import DeviceCount, colocated_devices, split_devices

CONFIG_ENV = "ASP_MSRL_CONFIG"  # path of the training YAML; exported before `ray start` by shell/ scripts


class MsrlAspSection(AspSection, ObjectiveSection):
    """The `asp:` section of a MindSpeed-RL YAML: the scheduler's settings, the loss settings (`ObjectiveSection`,
    the keys the standalone runtime reads as `trainer.objective`/`iw_cap`/`iw_mode`) and the integration's own.

    Why a subclass: mode `colocated` and the keys below mean something only inside MindSpeed-RL, so the
    standalone runtime's `AspSection` refuses them.
    """

    LAG0_MODES: ClassVar[Dict[str, str]] = {
        "stock": "MindSpeed-RL's synchronous schedule",
        "colocated": "MindSpeed-RL's own synchronous fit on its colocated engines, in plan order",
    }

    mode: Literal["asp", "async", "colocated", "stock"] = Field(
        "asp", description="asp: a separate rollout pool fed from the dispatch plan, asynchronous trainer; async: "
        "the same pool, least-loaded dispatch; colocated: MindSpeed-RL's own colocated engines pull their planned "
        "rows, MindSpeed-RL's own fit (lag 0); stock: MindSpeed-RL unchanged")
    audit_path: Optional[str] = Field(
        None, description="JSON Lines record of every asynchronous update (trained groups, their versions and "
        "lags, the weight-sync checks); None = not written")
    rollout_memory_utilization: float = Field(
        0.9, gt=0.0, le=1.0, description="device memory fraction of a dedicated rollout instance (weights + KV); "
        "generate_config.gpu_memory_utilization stays the colocated engines' share")
    sync_timeout_s: Timeout = Field(600.0, description="deadline of one weight sync, and of the wait for "
                                    "the engines' step calls before it; past it the run stops with an error "
                                    "naming the instance (and rank) that did not answer")
    engine_start_timeout_s: Timeout = Field(
        1800.0, description="deadline for every rollout engine to be built (dummy load, memory profile, "
        "op compilation), waited before the weight groups form, so it never counts against sync_timeout_s; "
        "past it the error names the instances not built yet")
    placement_timeout_s: Timeout = Field(
        300.0, description="deadline for each instance's placement group (its infer-TP NPUs on one "
        "node); past it the error names the NPUs missing against the cluster's free resources")
    weight_probe_every: int = Field(
        0, ge=-1, description="functional weight check: a fixed prompt decoded greedily on every instance must "
        "get the same log-probs from the trainer's forward; 0 = after the run's first sync only, N > 0 = also "
        "every N-th sync, -1 = never")
    ignore_saved_state: bool = Field(
        False, description="start afresh although actor_config.load holds a checkpoint with ASP's state that "
        "finetune / no_load_optim would discard (refused otherwise: a relaunch would silently retrain from plan "
        "window 0 and reset Adam)")
    weight_probe_tokens: int = Field(16, ge=1, le=512, description="tokens each instance decodes for the probe")
    weight_probe_tolerance: float = Field(
        0.1, gt=0.0, description="largest mean |log-prob difference| (nats) between engine and trainer over the "
        "probe's tokens; bf16 kernels differ by a few 0.01, weights loaded wrong by nats")


#: keys of the MindSpeed-RL `asp:` section the standalone runtime's `AspSection` does not take
LOSS_KEYS = tuple(k for k in MsrlAspSection.model_fields if k not in AspSection.model_fields)


@dataclass(frozen=True)
class MsrlTopology:
    """How a MindSpeed-RL + ASP run splits its NPUs and batches.

    `train_npus` run the colocated Megatron workers (`rl_config.actor_resource.num_npus`); in modes `asp` and
    `async` the separate rollout pool has `instances` vLLM-Ascend instances of `infer_tp` NPUs each. In modes
    `colocated` and `stock` there is no separate pool: MindSpeed-RL's own colocated engines (`train_npus //
    infer_tp` of them) generate. `asp.mode` alone decides which (never `max_lag`).
    """

    asp: MsrlAspSection
    path: str
    gbs: int  # prompts per iteration (megatron_training.global_batch_size)
    n: int  # rl_config.n_samples_per_prompt
    max_tokens: int  # generate_config.sampling_config.max_tokens
    max_prompt_length: int
    train_npus: int
    infer_tp: int
    train_iters: int
    seed: int
    max_num_seqs: int
    guarantee_order: bool
    vllm_dp_size: int = 1  # VLLM_DP_SIZE MindSpeed-RL sets: infer EP size when enable_expert_parallel, else 1

    @property
    def colocated_plan(self) -> bool:
        """Mode `colocated`: synchronous, MindSpeed-RL's own colocated engines follow the plan."""
        return self.asp.mode == "colocated"

    @property
    def separate_pool(self) -> bool:
        """Modes `asp`/`async`, at any max_lag: a separate rollout pool and the asynchronous trainer."""
        return self.asp.mode in ("asp", "async")

    @property
    def plan_ordered(self) -> bool:
        """Modes `asp`/`colocated`: the trainer's loader yields the dispatch plan's batches."""
        return self.asp.mode in ("asp", "colocated")

    @property
    def equal_instance_calls(self) -> bool:
        """Every colocated engine must make the same number of `generate()` calls: vLLM data parallelism
        (VLLM_DP_SIZE > 1, MoE expert parallel) steps its DP ranks in lockstep, so a rank with fewer
        planned chunks would leave the others waiting in a collective."""
        return self.colocated_plan and self.vllm_dp_size > 1

    @property
    def instances(self) -> int:
        return self.asp.instances if self.separate_pool else self.colocated_instances

    @property
    def colocated_instances(self) -> int:
        return self.train_npus // self.infer_tp

    @property
    def rollout_npus(self) -> int:
        return self.asp.instances * self.infer_tp if self.separate_pool else 0

    @property
    def devices(self) -> DeviceCount:
        """The devices the run uses, as e2e_tps counts them (docs/design.md#e2e_tps): a separate rollout pool
        (instances x infer_tp) beside the trainer's NPUs, or the trainer's NPUs once when rollout is colocated."""
        if self.separate_pool:
            return split_devices(self.asp.instances, self.infer_tp, self.train_npus)
        return colocated_devices(self.train_npus)

    @property
    def total_npus(self) -> int:
        """Devices in MindSpeed-RL's e2e_tps denominator: trainer plus the separate rollout pool."""
        return self.devices.total


_ENV_REF = re.compile(r"^\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(?:,(.*))?\}$")


def resolve_env(obj: Any, path: str = "<config>", key: str = "") -> Any:
    """Resolve OmegaConf `${oc.env:NAME[,default]}` strings, as Hydra does when MindSpeed-RL loads the YAML
    (ASP reads the same file with plain PyYAML in every Ray worker)."""
    if isinstance(obj, dict):
        return {k: resolve_env(v, path, f"{key}.{k}" if key else str(k)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [resolve_env(v, path, key) for v in obj]
    if isinstance(obj, str):
        m = _ENV_REF.match(obj.strip())
        if m:
            name, default = m.group(1), m.group(2)
            if name in os.environ:
                return os.environ[name]
            if default is None:
                raise ConfigError(f"environment variable {name} is not set (the shell/ launch scripts export it)",
                                  path=path, key=key)
            default = default.strip().strip("'\"")
            return None if default == "null" else default
    return obj


def _get(data: Dict[str, Any], dotted: str, path: str, default: Any = ...) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            if default is ...:
                raise ConfigError("missing key (MindSpeed-RL needs it and ASP reads it)", path=path, key=dotted)
            return default
        node = node[part]
    return node


def _int(data: Dict[str, Any], dotted: str, path: str, default: Any = ..., minimum: int = 1) -> int:
    value = _get(data, dotted, path, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"expected an integer >= {minimum}, got {value!r}", path=path, key=dotted)
    return value


def topology_from_dict(data: Dict[str, Any], path: str = "<config>") -> MsrlTopology:
    """Validate the `asp:` section and its agreement with the MindSpeed-RL sections of one YAML mapping."""
    for section in MSRL_SECTIONS:
        if not isinstance(data.get(section), dict):
            raise ConfigError("missing MindSpeed-RL section", path=path, key=section)
    if "asp" not in data:
        raise ConfigError("no top-level 'asp:' section", path=path)
    data = dict(data, asp=resolve_env(data["asp"], path, "asp"))
    asp = validate_section(data["asp"], MsrlAspSection, path, prefix="asp")
    topo = MsrlTopology(
        asp=asp, path=path,
        gbs=_int(data, "megatron_training.global_batch_size", path),
        n=_int(data, "rl_config.n_samples_per_prompt", path),
        max_tokens=_int(data, "generate_config.sampling_config.max_tokens", path),
        max_prompt_length=_int(data, "rl_config.max_prompt_length", path, 512),
        train_npus=_int(data, "rl_config.actor_resource.num_npus", path),
        infer_tp=_int(data, "generate_config.infer_tensor_parallel_size", path, 1),
        train_iters=_int(data, "megatron_training.train_iters", path),
        seed=_int(data, "megatron_training.seed", path, 1234, minimum=0),
        max_num_seqs=_int(data, "generate_config.max_num_seqs", path, 256),
        guarantee_order=bool(_get(data, "rl_config.guarantee_order", path, False)),
        vllm_dp_size=_vllm_dp_size(data, path),
    )
    _check(topo, data)
    return topo


def _vllm_dp_size(data: Dict[str, Any], path: str) -> int:
    """What cli/train_grpo.py and train_dapo.py put in VLLM_DP_SIZE (runtime_env.yaml says 1)."""
    if bool(_get(data, "generate_config.enable_expert_parallel", path, False)):
        return _int(data, "generate_config.infer_expert_parallel_size", path, 1)
    return 1


def _num_experts(data: Dict[str, Any], model: Optional[str]) -> int:
    """`num_experts` of the model: from a `model:` section in the YAML, else MindSpeed-RL's
    configs/model/<megatron_training.model>.yaml when its checkout is found (Hydra's `defaults`)."""
    section = data.get("model")
    if isinstance(section, dict):
        inner = section.get(model) if model and isinstance(section.get(model), dict) else section
        if isinstance(inner, dict) and inner.get("num_experts"):
            return int(inner["num_experts"])
    if not model:
        return 0
    from mindspeed_asp.integrations.mindspeed_rl.pins import mindspeed_rl_root
    root = mindspeed_rl_root()
    model_file = root / "configs" / "model" / f"{model}.yaml" if root else None
    if model_file is None or not model_file.is_file():
        return 0
    inner = (read_yaml(model_file).get(model) or {})
    return int(inner.get("num_experts") or 0) if isinstance(inner, dict) else 0


def _refuse_moe_in_separate_pool(t: MsrlTopology, data: Dict[str, Any]) -> None:
    """The separate pool's weight export and transfer carry dense weights only: expert weights (sharded over
    EP ranks by Megatron, resharded by MindSpeed-RL's own colocated path) are never sent, so an MoE model
    would generate with stale or missing experts. Refused before Ray starts; mode `colocated` (MindSpeed-RL's
    colocated engines) stays allowed."""
    if not t.separate_pool:
        return
    why = (f"the separate rollout pool (asp.mode {t.asp.mode!r}) cannot transfer expert weights; use asp.mode: "
           "colocated (plan-ordered, MindSpeed-RL's colocated engines) or asp.mode: stock")
    path = t.path
    if bool(_get(data, "generate_config.enable_expert_parallel", path, False)):
        raise ConfigError("expert-parallel inference: " + why, path=path, key="generate_config.enable_expert_parallel")
    if _int(data, "generate_config.infer_expert_parallel_size", path, 1) > 1:
        raise ConfigError("expert-parallel inference: " + why, path=path,
                          key="generate_config.infer_expert_parallel_size")
    if _int(data, "actor_config.expert_model_parallel_size", path, 1) > 1:
        raise ConfigError("an expert-parallel (MoE) model: " + why, path=path,
                          key="actor_config.expert_model_parallel_size")
    model = _get(data, "megatron_training.model", path, None)
    if _num_experts(data, model if isinstance(model, str) else None) > 1:
        raise ConfigError(f"MoE model {model!r}: " + why, path=path, key="model.num_experts")


def _separate_pool_why(t: MsrlTopology) -> str:
    return f"the separate rollout pool (asp.mode {t.asp.mode!r})"


_KEEP_MSRL = "use asp.mode: colocated or asp.mode: stock (both keep MindSpeed-RL's own engines)"

# generate_config.sampling_config keys that change the distribution tokens are drawn from, with the value that
# leaves it unchanged and how a value is neutral. An absent key is neutral: GenerateConfig replaces its
# sampling_config defaults by the YAML's mapping as a whole, and the pool's SamplingParams default to these.
# The penalties are not in GenerateConfig's sampling_config at 05a90d7 (it refuses them); they are listed so a
# later MindSpeed-RL that admits them is checked the same way.
NEUTRAL_SAMPLING: Dict[str, Tuple[float, str, Callable[[float], bool]]] = {
    "temperature": (1.0, "== 1", lambda v: v == 1.0),
    "top_p": (1.0, "== 1", lambda v: v >= 1.0),
    "top_k": (-1, "-1 or 0", lambda v: v in (-1, 0)),
    "min_p": (0.0, "0", lambda v: v <= 0.0),
    "repetition_penalty": (1.0, "1", lambda v: v == 1.0),
    "presence_penalty": (0.0, "0", lambda v: v == 0.0),
    "frequency_penalty": (0.0, "0", lambda v: v == 0.0),
}


def _refuse_biased_behaviour_logprobs(t: MsrlTopology, data: Dict[str, Any]) -> None:
    """Non-neutral sampling in the separate pool: vllm-ascend 1b16c01's AscendSampler reports raw log-probs
    (before temperature, top-k/top-p, min-p, penalties; it ignores logprobs_mode and MindSpeed-RL's engine
    passes none), while Megatron's recompute of the proximal log-probs divides the logits by the temperature.
    The behaviour log-probs (rollout_log_prob, the importance-weight denominator) would then describe
    another distribution than the one the tokens were drawn from and the one they are compared with, and
    every lag >= 1 weight would be biased. Neutral settings make raw == processed."""
    if not t.separate_pool:
        return
    base = "generate_config.sampling_config"
    sampling = resolve_env(_get(data, base, t.path, {}) or {}, t.path, base)
    if not isinstance(sampling, dict):
        raise ConfigError("expected a mapping", path=t.path, key=base)
    for name, (neutral, wanted, is_neutral) in NEUTRAL_SAMPLING.items():
        if name not in sampling:
            continue
        key, raw = f"{base}.{name}", sampling[name]
        try:
            if isinstance(raw, bool):
                raise ValueError
            value = float(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"expected a number, got {raw!r}", path=t.path, key=key) from None
        if not is_neutral(value):
            raise ConfigError(
                f"{name} {raw!r} is not neutral ({wanted}): {_separate_pool_why(t)} keeps vllm-ascend's "
                "log-probs as the behaviour policy, and vllm-ascend 1b16c01 reports raw log-probs (before "
                "temperature, top-k/top-p, min-p and penalties) while Megatron's recompute is "
                "temperature-scaled, so every importance weight would be biased. Set it to "
                f"{neutral!r}, or {_KEEP_MSRL}", path=t.path, key=key)


def _refuse_prefix_caching_in_separate_pool(t: MsrlTopology, data: Dict[str, Any]) -> None:
    """vLLM V1's `reset_prefix_cache()` after a weight sync does nothing while any request is in flight,
    which in the asynchronous pool is always: new requests would reuse prompt KV computed under older
    weights, so their policy_version (admission version) would understate the true lag."""
    if not t.separate_pool:
        return
    key = "generate_config.enable_prefix_caching"
    if bool(_get(data, key, t.path, False)):
        raise ConfigError(
            f"prefix caching with {_separate_pool_why(t)}: vLLM V1's reset_prefix_cache() after a weight sync is "
            "a no-op while requests are in flight (always, in this pool), so new requests would reuse prompt KV "
            "computed by older weights and the measured lag would understate the true one. Set it to false, "
            f"or {_KEEP_MSRL}", path=t.path, key=key)


# MindSpeed-RL's data_strategy aliases for the TransferQueue (trainer/utils/data_strategy.py at 05a90d7)
TRANSFER_QUEUE_NAMES = ("tq", "transfer_queue", "queue")


def _refuse_transfer_queue_in_separate_pool(t: MsrlTopology, data: Dict[str, Any]) -> None:
    """TransferQueue registers a fixed column list per consumer (DataStrategy.build_grpo/build_dapo); ASP's
    added columns (rollout_log_prob, policy_version, asp_prompt_id) reach only TransferDock's consumers, so
    the asynchronous update would not get the behaviour log-probs and versions it needs."""
    if not t.separate_pool:
        return
    key = "rl_config.data_strategy"
    value = _get(data, key, t.path, None)
    if value is not None and str(value).strip().lower() in TRANSFER_QUEUE_NAMES:
        raise ConfigError(
            f"data_strategy {value!r} (TransferQueue) with {_separate_pool_why(t)}: TransferQueue's per-consumer "
            "column registry does not carry ASP's rollout_log_prob/policy_version columns to the actor update. "
            f"Use data_strategy: td (TransferDock, the default), or {_KEEP_MSRL}", path=t.path, key=key)


def _check_equal_calls(t: MsrlTopology, data: Dict[str, Any]) -> None:
    """With vLLM data parallelism the plan's per-engine group counts are evened out (data_patches.
    balance_queues), which needs a batch that splits evenly and chunks that split each share."""
    if not t.equal_instance_calls:
        return
    if t.gbs % t.instances:
        raise ConfigError(f"with vLLM data parallelism (VLLM_DP_SIZE={t.vllm_dp_size}) every engine gets the same "
                          f"number of groups: global_batch_size {t.gbs} must be a multiple of the {t.instances} "
                          "engines", path=t.path, key="megatron_training.global_batch_size")
    share = t.gbs // t.instances * t.n
    size = _get(data, "rl_config.actor_rollout_dispatch_size", t.path, None)
    if size is not None and (not isinstance(size, int) or size <= 0 or share % size or size % t.n):
        raise ConfigError(f"with vLLM data parallelism each engine gets {share} rows per batch; set it to a multiple "
                          f"of n={t.n} that divides {share} (e.g. {t.n})", path=t.path,
                          key="rl_config.actor_rollout_dispatch_size")


def _check(t: MsrlTopology, data: Dict[str, Any]) -> None:
    path = t.path
    if _int(data, "generate_config.infer_pipeline_parallel_size", path, 1) != 1:
        raise ConfigError("vLLM pipeline parallelism must be 1 (MindSpeed-RL and ASP)", path=path,
                          key="generate_config.infer_pipeline_parallel_size")
    if t.train_npus % t.infer_tp:
        raise ConfigError(f"actor NPUs ({t.train_npus}) must be a multiple of infer TP ({t.infer_tp})",
                          path=path, key="rl_config.actor_resource.num_npus")
    if _int(data, "rl_config.partial_rollout_max_split", path, 1) != 1:
        raise ConfigError("ASP replaces partial rollout (and guarantee_order forbids it): set it to 1",
                          path=path, key="rl_config.partial_rollout_max_split")
    if t.asp.mode == "stock":
        return
    _refuse_moe_in_separate_pool(t, data)
    _refuse_biased_behaviour_logprobs(t, data)
    _refuse_prefix_caching_in_separate_pool(t, data)
    _refuse_transfer_queue_in_separate_pool(t, data)
    if t.asp.minibatch_groups != t.gbs:
        raise ConfigError(f"the trainer consumes one MindSpeed-RL batch of global_batch_size={t.gbs} groups per "
                          f"update; set asp.minibatch_groups to {t.gbs}", path=path, key="asp.minibatch_groups")
    if t.asp.slots > t.max_num_seqs:
        raise ConfigError(f"more slots than vLLM's max_num_seqs ({t.max_num_seqs})", path=path, key="asp.slots")
    if not bool(_get(data, "rl_config.use_integrated_worker", path, True)):
        raise ConfigError("ASP drives the integrated worker only", path=path, key="rl_config.use_integrated_worker")
    if not bool(_get(data, "rl_config.blocking", path, True)):
        raise ConfigError("the ASP trainer calls the actor's stages blocking", path=path, key="rl_config.blocking")
    if t.plan_ordered and not t.asp.plan_path:
        raise ConfigError(f"mode {t.asp.mode!r} needs a dispatch plan (build it with `asp plan`)", path=path,
                          key="asp.plan_path")
    if t.colocated_plan and t.asp.instances != t.colocated_instances:
        raise ConfigError(f"in mode colocated the plan drives MindSpeed-RL's {t.colocated_instances} colocated vLLM "
                          f"instances (actor NPUs / infer TP); set asp.instances to {t.colocated_instances}",
                          path=path, key="asp.instances")
    if t.plan_ordered and not t.guarantee_order:
        raise ConfigError("plan-ordered rows need guarantee_order: true", path=path, key="rl_config.guarantee_order")
    _check_equal_calls(t, data)


def load_topology(path: str | Path) -> MsrlTopology:
    """Read a MindSpeed-RL training YAML with an `asp:` section (the files in configs/), with the project's
    strict reader (a key given twice is refused naming file, line and key)."""
    return topology_from_dict(read_yaml(path), str(path))


def msrl_asp_section(data: Dict[str, Any], path: str) -> MsrlAspSection:
    """The `asp:` section of a parsed MindSpeed-RL training YAML, `${oc.env:...}` resolved, validated alone (what
    `asp lengths eval --config` reads: the estimator, without the cluster-shape checks of `topology_from_dict`)."""
    if "asp" not in data:
        raise ConfigError("no top-level 'asp:' section", path=path)
    return validate_section(resolve_env(data["asp"], path, "asp"), MsrlAspSection, path, prefix="asp")


def topology_from_env() -> Optional[MsrlTopology]:
    """The run's topology from env ASP_MSRL_CONFIG (set by the launch scripts on every node), or None."""
    path = os.environ.get(CONFIG_ENV)
    return load_topology(path) if path else None


def rollout_dispatch_size(counts: list, n: int, gbs: int, instances: int) -> int:
    """The largest `actor_rollout_dispatch_size` (rows) under which every instance's planned groups split
    into whole chunks: n * gcd(per-instance group counts, gbs // instances).

    MindSpeed-RL's `sync_generate_process` indexes rows `range(0, dispatch_size, n)`, so every chunk must
    hold exactly that many rows; `validate_rl_args` also requires it to divide the per-instance share.
    """
    g = 0
    for c in counts:
        g = math.gcd(g, int(c))
    g = math.gcd(g, gbs // instances) if gbs % instances == 0 else math.gcd(g, gbs)
    return n * max(1, g)


#: The variables the launch scripts read from `shell_vars`, each with its reader in shell/ (and nothing else:
#: every other setting reaches a process through the composed YAML, read there once).
SHELL_VARS = {
    "ASP_MODE": "msrl_common.sh asp_build_plan (a plan for modes asp/colocated); ascend_first_run.sh (not stock)",
    "ASP_TOTAL_NPUS": "msrl_common.sh asp_launch; ascend_first_run.sh; compare_msrl.sh (stock's NPUs)",
    "ASP_TRAIN_NPUS": "ascend_first_run.sh (first_run_report --trainer-ranks)",
    "ASP_TRAIN_ITERS": "msrl_common.sh (TRAIN_ITERS for export_prompts --train-iters)",
    "ASP_SEED": "compare_msrl.sh (stock's megatron_training.seed)",
    "ASP_PROBE_TOLERANCE": "ascend_first_run.sh (first_run_report --probe-tolerance)",
}


def shell_vars(t: MsrlTopology) -> str:
    """`KEY=value` lines of SHELL_VARS for the launch scripts (sourced with eval)."""
    import shlex
    v = {"ASP_MODE": t.asp.mode, "ASP_TOTAL_NPUS": t.total_npus, "ASP_TRAIN_NPUS": t.train_npus,
         "ASP_TRAIN_ITERS": t.train_iters, "ASP_SEED": t.seed, "ASP_PROBE_TOLERANCE": t.asp.weight_probe_tolerance}
    return "\n".join(f"{k}={shlex.quote(str(x))}" for k, x in v.items())
