"""The `asp:` configuration section and strict YAML loading.

The same `asp:` section sits in a standalone run config (`configs/tiny_cpu.yaml`) and inside a MindSpeed-RL
training YAML (MindSpeed-RL reads only its own sections). Validation is strict: an unknown key or a wrong
type is an error naming the key and the file. Every YAML the project reads goes through `load_yaml_text`, which
refuses a key given twice in one mapping (PyYAML keeps the last one silently, so a typo'd copy would hide the
value meant), naming the file, line and key.
"""
from __future__ import annotations

import typing
from pathlib import Path
from typing import Annotated, Any, Dict, List, Literal, Optional, Set, Tuple, Type, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from mindspeed_asp.errors import ConfigError
from mindspeed_asp.limits import MAX_COUNT, MAX_SEED
from mindspeed_asp.planner_names import PLANNER_NAMES
from mindspeed_asp.textfile import read_text

M = TypeVar("M", bound=BaseModel)


def _numeric_only(annotation: Any) -> bool:
    """Whether a field's type is int or float (or Optional of one), with no bool among its choices."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) is typing.Union else (annotation,)
    types = [a for a in args if a is not type(None)]
    return bool(types) and all(a in (int, float) for a in types)


class Strict(BaseModel):
    """Base for config sections: unknown keys are errors, assignments are validated."""

    # allow_inf_nan=False: YAML's .nan/.inf (or an override `key=.inf`) is refused like any impossible value;
    # a NaN ratio or budget would otherwise reach the planners and loop or stall.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        """`true`/`yes` in an integer or float key is refused (pydantic's lax mode reads it as 1). Why not
        `strict=True`: it would also refuse a quoted "3" and an int in a float key, which configs and overrides
        (parsed as YAML) legitimately hold."""
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _numeric_only(field.annotation):
            kind = "an integer" if int in typing.get_args(field.annotation) + (field.annotation,) else "a number"
            raise ValueError(f"expected {kind}, got a boolean")
        return value


def _seed_in_range(value: int) -> int:
    if not 0 <= value <= MAX_SEED:
        raise ValueError(f"a seed must be in 0 .. {MAX_SEED} (2**32 - 1: vLLM seeds numpy's global generator with "
                         "it, which takes no larger)")
    return value


#: A seed key: an integer in 0 .. MAX_SEED (mindspeed_asp/limits.py), refused with the key named when the config
#: is read (a larger one would pass and fail minutes later, inside an engine that does not say why).
Seed = Annotated[int, AfterValidator(_seed_in_range)]


class EstimatorSection(Strict):
    """How response lengths are predicted from the length history (docs/design.md section 4)."""

    kind: Literal["history", "cold_start", "oracle"] = "history"
    recency_decay: float = Field(0.5, gt=0.0, le=1.0, description="weight of epoch e-k is decay**k")
    max_epochs: int = Field(4, ge=1, le=MAX_COUNT, description="history epochs used per prompt")
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
    instances: int = Field(2, ge=1, le=MAX_COUNT, description="independent inference instances")
    slots: int = Field(64, ge=1, le=MAX_COUNT, description="max concurrent sequences per instance (vLLM max_num_seqs)")
    kv_budget_tokens: Optional[int] = Field(None, ge=1, le=MAX_COUNT)
    minibatch_groups: int = Field(4, ge=1, le=MAX_COUNT, description="trainer minibatch M, in prompt groups")
    max_lag: int = Field(1, ge=0, le=MAX_COUNT, description="max policy lag of any trained sample; 0 = synchronous")
    stale_policy: Literal["drop", "regenerate"] = "regenerate"
    work_stealing: bool = True
    planner: str = "asp"
    plan_path: Optional[str] = None
    history_path: Optional[str] = None
    replan_every: int = Field(1, ge=0, le=MAX_COUNT,
                              description="re-plan the next window every k iterations (0 = once)")
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
        elif first["type"] == "value_error":  # a validator's own words, without pydantic's prefix
            msg = msg.removeprefix("Value error, ")
        raise ConfigError(f"{msg} (got {first.get('input')!r})", path=path, key=key) from None


#: Top-level sections of a MindSpeed-RL training YAML (the per-model configs in configs/), which also carry an
#: `asp:` section: the commands tell such a file from a standalone run config by these.
MSRL_SECTIONS = ("megatron_training", "actor_config", "rl_config", "generate_config")


def is_training_yaml(data: Dict[str, Any]) -> bool:
    """Whether a parsed YAML is a MindSpeed-RL training config (it has one of MindSpeed-RL's own sections)."""
    return any(k in data for k in MSRL_SECTIONS)


class YamlProblem(Exception):
    """A YAML text that cannot be read: `message`, the 1-based `line` and the dotted `key` where known."""

    def __init__(self, message: str, line: Optional[int] = None, key: Optional[str] = None) -> None:
        super().__init__(message)
        self.message, self.line, self.key = message, line, key


def _repeated_key(node: yaml.Node, where: str = "", seen_nodes: Optional[Set[int]] = None
                  ) -> Optional[Tuple[str, int, int]]:
    """(dotted key, line, first line) of the first key given twice in one mapping of a composed document.

    Merge keys (`<<: *base`) are not counted: a key next to a merge overrides the merged one on purpose."""
    seen_nodes = set() if seen_nodes is None else seen_nodes
    if id(node) in seen_nodes:  # an alias of a node already checked (or a recursive one)
        return None
    seen_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: Dict[Tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            name = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            dotted = where if name is None else (f"{where}.{name}" if where else str(name))
            if name is not None:
                ident = (key_node.tag, str(name))
                if ident in first:
                    return dotted, key_node.start_mark.line + 1, first[ident]
                first[ident] = key_node.start_mark.line + 1
            found = _repeated_key(value_node, dotted, seen_nodes)
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found = _repeated_key(item, f"{where}[{i}]", seen_nodes)
            if found:
                return found
    return None


def parse_yaml(text: str) -> Any:
    """One YAML document (PyYAML's safe loader) with every key given once per mapping; raises YamlProblem."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        repeated = _repeated_key(node)
        if repeated:
            key, line, first = repeated
            raise YamlProblem(f"duplicate key (first given on line {first}; YAML would keep the last silently): "
                              "give each key once", line=line, key=key)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = getattr(mark, "line", None)
        raise YamlProblem(f"invalid YAML: {getattr(exc, 'problem', None) or exc}",
                          line=None if line is None else line + 1) from None
    finally:
        loader.dispose()


def load_yaml_text(text: str, path: str) -> Any:
    """`parse_yaml` with its refusals as ConfigErrors naming `path`, the line and the key."""
    try:
        return parse_yaml(text)
    except YamlProblem as exc:
        raise ConfigError(exc.message, path=path, line=exc.line, key=exc.key) from None


def read_yaml(path: str | Path) -> Dict[str, Any]:
    """Read a YAML file into a mapping, naming the file and line on a syntax error or a repeated key."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("config file not found", path=str(path))
    text = read_text(path, error=ConfigError)  # names the line of a byte that is not UTF-8
    data = load_yaml_text(text, str(path))
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


def override_key(item: str) -> str:
    """The dotted key of a `key.path=value` override."""
    return item.split("=", 1)[0].strip()


def check_unique_overrides(overrides: List[str], source: str = "command line") -> None:
    """Refuse an override that sets a key an earlier one set: applied in order, the last would win silently and
    a typo in either would go unnoticed. Both overrides are named."""
    first: Dict[str, str] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.path=value", path=source)
        key = override_key(item)
        if key in first:
            raise ConfigError(f"set twice, by {first[key]!r} and {item!r}: give each key once", path=source,
                              key=key)
        first[key] = item


def apply_overrides(data: Dict[str, Any], overrides: List[str], source: str = "command line") -> Dict[str, Any]:
    """Apply `a.b.c=value` overrides (value parsed as YAML) to a nested mapping, in place, in order: code that
    composes a base list with its own (tests, benchmarks, `asp demo`'s variants) gets the later value. Overrides
    typed on a command line are checked first by the commands (`check_unique_overrides`): there a key given
    twice is a typo, refused naming both."""
    for item in overrides:
        key, raw = item.split("=", 1)
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError("cannot override inside a non-mapping", path=source, key=key.strip())
        try:
            node[parts[-1]] = parse_yaml(raw)
        except YamlProblem as exc:  # the value's own YAML: name the override, not a line of the command line
            raise ConfigError(f"{exc.message} (in the override {item!r})", path=source,
                              key=key.strip() + (f".{exc.key}" if exc.key else "")) from None
    return data
