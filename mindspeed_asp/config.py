"""The `asp:` configuration section and strict YAML loading.

The same `asp:` section sits in a standalone run config (`configs/tiny_cpu.yaml`) and inside a MindSpeed-RL
training YAML (MindSpeed-RL reads only its own sections). Validation is strict: an unknown key or a wrong
type is an error naming the key and the file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Type, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mindspeed_asp.errors import ConfigError
from mindspeed_asp.planner_names import PLANNER_NAMES
from mindspeed_asp.textfile import read_text

M = TypeVar("M", bound=BaseModel)


class Strict(BaseModel):
    """Base for config sections: unknown keys are errors, assignments are validated."""

    # allow_inf_nan=False: YAML's .nan/.inf (or an override `key=.inf`) is refused like any impossible value;
    # a NaN ratio or budget would otherwise reach the planners and loop or stall.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class EstimatorSection(Strict):
    """How response lengths are predicted from the length history (docs/design.md section 4)."""

    kind: Literal["history", "cold_start", "oracle"] = "history"
    recency_decay: float = Field(0.5, gt=0.0, le=1.0, description="weight of epoch e-k is decay**k")
    max_epochs: int = Field(4, ge=1, description="history epochs used per prompt")
    group_max_quantile: float = Field(0.8, gt=0.0, lt=1.0)
    sigma_shrinkage: float = Field(4.0, ge=0.0, description="pseudo-samples pulling sigma to the dataset's")
    drift: bool = True


class CostSection(Strict):
    """Decode step cost a + b*active + c*KV (+ p*prefill), seconds; fit with `asp fit-cost`."""

    a: float = Field(5.7e-3, ge=0.0)
    b: float = Field(2.0e-5, ge=0.0)
    c: float = Field(1.8e-7, ge=0.0)
    p: float = Field(0.0, ge=0.0)
    file: Optional[str] = Field(None, description="JSON written by `asp fit-cost`; overrides a/b/c/p")


class AspSection(Strict):
    """ASP's own settings, valid inside a MindSpeed-RL YAML as the top-level `asp:` section."""

    mode: Literal["asp", "async", "stock"] = "asp"
    instances: int = Field(2, ge=1, description="independent inference instances")
    slots: int = Field(64, ge=1, description="max concurrent sequences per instance (vLLM max_num_seqs)")
    kv_budget_tokens: Optional[int] = Field(None, ge=1)
    minibatch_groups: int = Field(4, ge=1, description="trainer minibatch M, in prompt groups")
    max_lag: int = Field(1, ge=0, description="max policy lag of any trained sample; 0 = synchronous")
    stale_policy: Literal["drop", "regenerate"] = "regenerate"
    work_stealing: bool = True
    planner: str = "asp"
    plan_path: Optional[str] = None
    history_path: Optional[str] = None
    replan_every: int = Field(1, ge=0, description="re-plan the next window every k iterations (0 = once)")
    rho: Optional[float] = Field(None, gt=0.0, description="trainer/rollout work ratio the planner assumes: "
                                 "train time / the window's rollout lower bound R_LB; None = 1.0. From a stock "
                                 "run's rho_stock (train / its rollout time): rho_stock x stock rollout / R_LB "
                                 "(docs/design.md section 5)")
    estimator: EstimatorSection = EstimatorSection()
    cost: CostSection = CostSection()
    online_fit: bool = Field(True, description="runtime: plan each window after the first with the cost model "
                             "fitted from the run's own engine steps and the measured rho (runtime/online_cost.py)")
    plan_ahead: bool = Field(True, description="runtime: plan the next window while the driver waits for "
                             "results, so loading it costs no planning time on the critical path")
    plan_share: float = Field(0.05, gt=0.0, le=1.0, description="runtime: the share of the run's wall time the "
                              "asp planner's search may take; a window planned when the budget is spent reuses "
                              "the last search's choice (runtime/replan.py)")

    @field_validator("planner")
    @classmethod
    def _known_planner(cls, name: str) -> str:
        """An unknown planner name is refused with the config, not when the first window is planned."""
        if name not in PLANNER_NAMES:
            raise ValueError(f"unknown planner; choose one of: {', '.join(PLANNER_NAMES)}")
        return name


def _format_loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc)


def validate_section(data: Any, model: Type[M], path: str, prefix: str = "") -> M:
    """Validate a parsed YAML mapping into `model`, turning pydantic errors into a ConfigError."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping, got {type(data).__name__}", path=path, key=prefix or None)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = _format_loc(((prefix,) if prefix else ()) + tuple(first["loc"]))
        msg = first["msg"]
        if first["type"] == "extra_forbidden":
            msg = "unknown key"
        raise ConfigError(f"{msg} (got {first.get('input')!r})", path=path, key=key) from None


#: Top-level sections of a MindSpeed-RL training YAML (the per-model configs in configs/), which also carry an
#: `asp:` section: the commands tell such a file from a standalone run config by these.
MSRL_SECTIONS = ("megatron_training", "actor_config", "rl_config", "generate_config")


def is_training_yaml(data: Dict[str, Any]) -> bool:
    """Whether a parsed YAML is a MindSpeed-RL training config (it has one of MindSpeed-RL's own sections)."""
    return any(k in data for k in MSRL_SECTIONS)


def read_yaml(path: str | Path) -> Dict[str, Any]:
    """Read a YAML file into a mapping, naming the file and line on a syntax error."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("config file not found", path=str(path))
    text = read_text(path, error=ConfigError)  # names the line of a byte that is not UTF-8
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        raise ConfigError(f"invalid YAML: {getattr(exc, 'problem', exc)}", path=str(path),
                          line=None if line is None else line + 1) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("top level must be a mapping", path=str(path))
    return data


def load_asp_section(path: str | Path) -> AspSection:
    """The `asp:` section of any YAML (a MindSpeed-RL training config or a standalone run config)."""
    data = read_yaml(path)
    if "asp" not in data:
        raise ConfigError("no top-level 'asp:' section", path=str(path))
    return validate_section(data["asp"], AspSection, str(path), prefix="asp")


def apply_overrides(data: Dict[str, Any], overrides: List[str], source: str = "command line") -> Dict[str, Any]:
    """Apply `a.b.c=value` overrides (value parsed as YAML) to a nested mapping, in place."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.path=value", path=source)
        key, raw = item.split("=", 1)
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError("cannot override inside a non-mapping", path=source, key=key)
        node[parts[-1]] = yaml.safe_load(raw)
    return data
