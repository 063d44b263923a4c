"""Standalone run configuration: model, data, trainer and run sections plus the shared `asp:` section.

A MindSpeed-RL run carries only the `asp:` section inside its own YAML; a standalone run (`asp train`,
`asp demo`, the CPU tier) needs to say which model, which prompts, how to train and where to write, so this
module adds those sections with the same strictness as `mindspeed_asp.config`: an unknown key or a wrong type
stops the run before Ray starts, naming the key and the file.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional

from pydantic import Field, ValidationInfo, field_validator

from mindspeed_asp.config import (MSRL_SECTIONS, AspSection, ObjectiveSection, Seed, Strict, Timeout, read_yaml,
                                  validate_overridden, validate_section)
from mindspeed_asp.errors import ConfigError
from mindspeed_asp.core.limits import MAX_COUNT, MAX_LENGTH
from mindspeed_asp.runtime.run_recorder import DEFAULT_TRAINER_DEVICES

#: On CPU the "devices" are logical slots: each instance is one vLLM process with `instance_threads` OpenMP
#: threads. More instances than this share the same cores so thinly that vLLM start-up times out, so a
#: config asking for more is refused (override with the environment variable ASP_CPU_SLOTS).
DEFAULT_CPU_SLOTS = 8


class ModelSection(Strict):
    """Which causal LM the instances serve and the trainer updates."""

    path: Optional[str] = Field(None, description="HF model directory; with tiny=true and no path, the tiny model "
                                "in the cache (ASP_CACHE_DIR, else ~/.cache/mindspeed_asp), never the working dir")
    tiny: bool = Field(True, description="build the random-initialised tiny Qwen2 model at `path` if missing")
    init_seed: Seed = Field(0, description="seed of the tiny model's random weights (fixed across run seeds)")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_model_len: int = Field(512, ge=16, le=MAX_LENGTH)
    memory_fraction: float = Field(0.05, gt=0.0, le=1.0, description="vLLM gpu_memory_utilization")


class DatasetSection(Strict):
    """The `dataset` task's file (runtime/tasks/dataset.py): JSONL of {"prompt", "answer"[, "id", "source"]}."""

    path: str = Field(..., min_length=1, description="JSONL file of prompts and answers (relative to the "
                      "working directory)")
    limit: Optional[int] = Field(None, ge=1, le=MAX_COUNT, description="use only the first `limit` records; "
                                 "None = all")

    @field_validator("path")
    @classmethod
    def _dataset_file(cls, value: str) -> str:
        """A missing dataset file is refused with the config, before Ray starts."""
        if not Path(value).is_file():
            raise ValueError("dataset file not found")
        return value


class ReplaySection(Strict):
    """The `replay` task's length source (runtime/tasks/replay.py): exactly one of `kind` and `trace`."""

    kind: Optional[Literal["long_cot", "chat", "summarisation", "tiny_decode", "reasoning", "small"]] = Field(
        None, description="a synthetic regime of workloads/synthetic.py whose lengths every group replays")
    trace: Optional[str] = Field(None, min_length=1, description="a length file instead: a history or rollout log "
                                 "(.parquet/.jsonl/.ndjson), the alpaca trace (.json) or the Splitwise trace (.csv)")
    scale: Optional[float] = Field(None, gt=0.0, description="raw lengths x scale, capped at data.max_new_tokens "
                                   "(a raw length at the source's cap goes to the cap); None = data.max_new_tokens / "
                                   "the source's cap")
    seed: Seed = Field(0, description="seed of the lengths (the synthetic draws; a trace's prompt order and "
                       "resampling)")

    @field_validator("trace")
    @classmethod
    def _trace_file(cls, value: Optional[str]) -> Optional[str]:
        """A missing or unreadable-kind trace is refused with the config, not when the first group is due."""
        if value is None:
            return value
        from mindspeed_asp.runtime.tasks.replay import TRACE_SUFFIXES

        if Path(value).suffix.lower() not in TRACE_SUFFIXES:
            raise ValueError(f"a length trace must end in {', '.join(TRACE_SUFFIXES)}")
        if not Path(value).is_file():
            raise ValueError("length trace file not found")
        return value


class DataSection(Strict):
    """The prompts: the demo task, the replay task (imposed long-tailed lengths) or a dataset file."""

    task: Literal["demo", "replay", "dataset"] = "demo"
    num_prompts: int = Field(64, ge=1, le=MAX_COUNT, description="prompt groups in the dataset (one epoch)")
    n: int = Field(4, ge=2, le=MAX_COUNT, description="samples per prompt (GRPO group size); at least 2: a group of "
                   "one has a zero group-relative advantage, so the policy would never change")
    max_new_tokens: int = Field(128, ge=1, le=MAX_LENGTH)
    temperature: float = Field(1.0, gt=0.0)
    seed: Seed = Field(0, description="seed of the demo prompts")
    dataset: Optional[DatasetSection] = Field(None, validate_default=True, description="task dataset: the file of "
                                              "prompts and answers (ignored by the other tasks)")
    replay: Optional[ReplaySection] = Field(None, validate_default=True, description="task replay: where the "
                                            "lengths come from (ignored by the other tasks)")

    @field_validator("dataset")
    @classmethod
    def _dataset_given(cls, value: Optional[DatasetSection], info: ValidationInfo) -> Optional[DatasetSection]:
        """Task dataset needs its file (data.dataset.path)."""
        if info.data.get("task") == "dataset" and value is None:
            raise ValueError("data.task is dataset: data.dataset.path must name the JSONL file of prompts and answers")
        return value

    @field_validator("replay")
    @classmethod
    def _replay_source(cls, value: Optional[ReplaySection], info: ValidationInfo) -> Optional[ReplaySection]:
        """Task replay needs exactly one length source, and a scale that keeps the source's cap share (checked
        here for a synthetic kind; a trace's cap is read with the trace, runtime/tasks/replay.py)."""
        if info.data.get("task") != "replay":
            return value
        if value is None or (value.kind is None) == (value.trace is None):
            raise ValueError("data.task is replay: give exactly one of data.replay.kind (a synthetic regime) and "
                             "data.replay.trace (a length file)")
        cap = info.data.get("max_new_tokens")
        if value.kind is not None and value.scale is not None and cap is not None:
            from mindspeed_asp.workloads.synthetic import mode_defaults

            source_cap = int(mode_defaults(value.kind)["max_new_tokens"])
            if round(source_cap * value.scale) > cap:
                raise ValueError(f"data.replay.scale={value.scale:g} maps the {value.kind} cap of {source_cap} "
                                 f"tokens to {round(source_cap * value.scale)}, above data.max_new_tokens={cap}: "
                                 "more samples would end at the cap than the source has; use data.replay.scale <= "
                                 f"{cap / source_cap:.6g} or raise data.max_new_tokens")
        return value


class TrainerSection(ObjectiveSection):
    """The reference GRPO trainer (PyTorch, HF model) used on the CPU and GPU tiers; its loss settings
    (objective, iw_cap, iw_mode) are `ObjectiveSection`'s, the same keys MindSpeed-RL's `asp:` section takes."""

    lr: float = Field(1e-3, gt=0.0)
    clip_eps: float = Field(0.2, gt=0.0)
    kl_coef: float = Field(0.0, ge=0.0)
    micro_batch_size: int = Field(16, ge=1, le=MAX_COUNT, description="sequences per forward/backward")
    max_grad_norm: float = Field(1.0, gt=0.0)
    threads: int = Field(1, ge=1, le=MAX_COUNT, description="torch threads of the trainer")
    devices: int = Field(DEFAULT_TRAINER_DEVICES, ge=1, le=MAX_COUNT, description="devices the trainer counts as in "
                         "throughput/e2e_tps (every device the run uses, docs/design.md#e2e_tps); the reference "
                         "trainer is one process: 1")


class RunSection(Strict):
    """How long to run, where to write, and the Ray/engine settings."""

    steps: int = Field(4, ge=1, le=MAX_COUNT, description="optimizer updates (each consumes asp.minibatch_groups "
                       "groups)")
    seed: Seed = Field(0, description="seed of the trainer (torch), the engines (vLLM) and the planner; each request "
                       "samples with its own seed derived from it")
    out: str = "runs/train"
    ray_address: Optional[str] = Field(
        None, min_length=1, description="an existing Ray cluster to run on ('auto', 'host:port'); None = start a "
        "local Ray and stop it after the run. The run only disconnects from a cluster it did not start")
    ray_num_cpus: int = Field(8, ge=1, le=MAX_COUNT,
                              description="logical CPUs of the local Ray (oversubscribed on purpose)")
    ray_object_store_mb: int = Field(512, ge=64, le=MAX_COUNT)
    instance_threads: int = Field(1, ge=1, le=MAX_COUNT, description="OpenMP threads per vLLM instance on CPU")
    start_timeout_s: Timeout = Field(180.0, description="per instance start-up, retried once")
    step_timeout_s: Timeout = Field(600.0, description="longest wait for a finished group")
    stall_timeout_s: Timeout = Field(
        300.0, description="an instance whose engine loop has not come round for this long (a hung step: "
        "a device kernel or collective that never returns) is killed and its groups go to the others; below "
        "run.step_timeout_s, far above one engine step and one weight-sync round")
    sync_timeout_s: Timeout = Field(
        120.0, description="bound on one weight-sync round (group join, each broadcast, each instance's "
        "load); an instance still waiting for its engine after half of it is dropped from the round")
    verify_weights: bool = Field(True, description="compare trainer and instance checksums after each sync")
    plots: bool = True
    checkpoint_every: int = Field(
        0, ge=0, le=MAX_COUNT, description="write a checkpoint (OUT/checkpoint) every this many updates; 0 = only "
        "when the run stops (at the end, or on SIGINT/SIGTERM). `asp train --resume OUT` continues from the latest")
    target_reward: Optional[float] = Field(
        None, allow_inf_nan=False, description="reward whose reach (updates and seconds, trailing mean of 3 "
        "updates) the summary and `asp compare` report; None = not reported")
    platform: Optional[Literal["cpu", "cuda", "npu"]] = Field(None, description="None = auto-detect")


class RunConfig(Strict):
    """A whole standalone run config file."""

    model: ModelSection = ModelSection()
    data: DataSection = DataSection()
    trainer: TrainerSection = TrainerSection()
    run: RunSection = RunSection()
    asp: AspSection = AspSection()


def cpu_slots() -> int:
    """How many CPU instances a run may start (logical slots; see DEFAULT_CPU_SLOTS)."""
    raw = os.environ.get("ASP_CPU_SLOTS")
    if raw is None:
        return DEFAULT_CPU_SLOTS
    try:
        return max(1, int(raw))
    except ValueError:
        raise ConfigError(f"ASP_CPU_SLOTS must be an integer, got {raw!r}", key="ASP_CPU_SLOTS") from None


def validate_semantics(cfg: RunConfig, path: str, devices: Optional[int] = None) -> RunConfig:
    """Cross-field checks pydantic cannot express; `devices` is the number of accelerators (None = CPU)."""
    # This host's limits bind a local Ray only; on an existing cluster the rollout pool's placement group
    # reserves the instances across its nodes and names the shortfall (key asp.instances) if it cannot.
    local = cfg.run.ray_address is None
    limit = cpu_slots() if devices is None else devices
    what = "logical CPU slots (ASP_CPU_SLOTS)" if devices is None else "visible devices"
    if local and cfg.asp.instances > limit:
        raise ConfigError(f"{cfg.asp.instances} instances but only {limit} {what}", path=path,
                          key="asp.instances")
    if local and cfg.asp.instances > cfg.run.ray_num_cpus:
        raise ConfigError(f"{cfg.asp.instances} instances need at least as many Ray CPUs "
                          f"(run.ray_num_cpus={cfg.run.ray_num_cpus})", path=path, key="run.ray_num_cpus")
    if cfg.asp.minibatch_groups > cfg.data.num_prompts:
        raise ConfigError(f"minibatch of {cfg.asp.minibatch_groups} groups exceeds the "
                          f"{cfg.data.num_prompts} prompts of the dataset", path=path, key="asp.minibatch_groups")
    if cfg.data.n > cfg.asp.slots:
        raise ConfigError(f"a group of n={cfg.data.n} samples does not fit asp.slots={cfg.asp.slots} slots",
                          path=path, key="data.n")
    if cfg.data.max_new_tokens >= cfg.model.max_model_len:
        raise ConfigError(f"max_new_tokens={cfg.data.max_new_tokens} leaves no room for the prompt in "
                          f"max_model_len={cfg.model.max_model_len}", path=path, key="data.max_new_tokens")
    if not cfg.model.tiny and not cfg.model.path:
        raise ConfigError("model.tiny is false, so model.path must name the HF model directory to train",
                          path=path, key="model.path")
    if cfg.run.stall_timeout_s >= cfg.run.step_timeout_s:
        raise ConfigError(f"run.stall_timeout_s={cfg.run.stall_timeout_s:g} must be below run.step_timeout_s="
                          f"{cfg.run.step_timeout_s:g}: else the run gives up before a hung instance is dropped",
                          path=path, key="run.stall_timeout_s")
    if cfg.asp.plan_path is not None and not Path(cfg.asp.plan_path).is_file():
        raise ConfigError(f"plan file {cfg.asp.plan_path!r} not found", path=path, key="asp.plan_path")
    # Input files named in the config must exist: a missing history would silently mean a cold start.
    for key, value in (("asp.history_path", cfg.asp.history_path), ("asp.cost.file", cfg.asp.cost.file)):
        if value is not None and not Path(value).is_file():
            raise ConfigError(f"file {value!r} not found", path=path, key=key)
    return cfg


#: The run's key of each setting a dispatch plan depends on (scheduler/plan_file.py SETTINGS), for messages.
PLAN_SETTING_KEYS = {"n": "data.n", "instances": "asp.instances", "slots": "asp.slots",
                     "kv_budget": "asp.kv_budget_tokens", "minibatch_groups": "asp.minibatch_groups",
                     "groups_per_iteration": "asp.replan_every x asp.minibatch_groups",
                     "max_new_tokens": "data.max_new_tokens", "max_lag": "asp.max_lag",
                     "work_stealing": "asp.work_stealing", "planner": "asp.planner"}


def plan_settings(cfg: RunConfig, num_prompts: int) -> Dict[str, Any]:
    """What a plan for this run must have been built with (`DispatchPlan.check_settings`): the run's values of
    the plan's settings. A window is asp.replan_every x asp.minibatch_groups groups (the whole epoch of
    `num_prompts` for replan_every 0), as the driver cuts them."""
    asp = cfg.asp
    window = asp.replan_every * asp.minibatch_groups if asp.replan_every > 0 else int(num_prompts)
    return {"n": cfg.data.n, "instances": asp.instances, "slots": asp.slots, "kv_budget": asp.kv_budget_tokens,
            "minibatch_groups": asp.minibatch_groups, "groups_per_iteration": window,
            "max_new_tokens": cfg.data.max_new_tokens, "max_lag": asp.max_lag, "work_stealing": asp.work_stealing,
            "planner": asp.planner}


def config_from_dict(data: Dict[str, Any], path: str = "<dict>", overrides: Optional[List[str]] = None,
                     devices: Optional[int] = None, flags: Optional[Dict[str, str]] = None) -> RunConfig:
    """Validate a parsed mapping (plus overrides, applied in order) into a RunConfig; an error an override caused
    names it (`validate_overridden`; `flags`: the command-line flag each override stands for)."""
    def validate(d: Dict[str, Any]) -> RunConfig:
        return validate_semantics(validate_section(d, RunConfig, path), path, devices)
    return validate_overridden(data, list(overrides or []), path, validate, flags)


def load_run_config(path: str | Path, overrides: Optional[List[str]] = None,
                    devices: Optional[int] = None, flags: Optional[Dict[str, str]] = None) -> RunConfig:
    """Read, override and validate a run config file; errors name the key and the file."""
    data = read_yaml(path)
    _refuse_training_yaml(data, str(path))
    return config_from_dict(data, str(path), overrides, devices, flags)


def _refuse_training_yaml(data: Dict[str, Any], path: str) -> None:
    """Why: the per-model MindSpeed-RL YAMLs in configs/ also have an `asp:` section, so `asp train` would stop
    at whichever of their keys it meets first ('asp.objective: unknown key'); say what the file is and how
    it is launched instead."""
    found = [k for k in MSRL_SECTIONS if k in data]
    if found:
        raise ConfigError(f"a MindSpeed-RL training YAML (it has {', '.join(found)}), not a run config of the "
                          "standalone runtime: launch it with its shell/<config>.sh script (docs/ascend.md); "
                          "`asp train` takes a run config such as the packaged tiny_cpu.yaml", path=path)


def packaged_config_path(name: str = "tiny_cpu.yaml") -> Path:
    """A config shipped inside the package (package_data), falling back to the repository's configs/."""
    here = Path(__file__).resolve().parents[1] / "configs" / name
    if here.is_file():
        return here
    repo = Path(__file__).resolve().parents[2] / "configs" / name
    if repo.is_file():
        return repo
    raise ConfigError("packaged config not found (reinstall mindspeed-asp)", path=name)


def dump_config(cfg: RunConfig) -> Dict[str, Any]:
    """The resolved config as plain data, written next to every run's metrics."""
    return cfg.model_dump(mode="json")
