"""The `asp:` configuration section and strict YAML loading.

The same `asp:` section sits in a standalone run config (`configs/tiny_cpu.yaml`) and inside a MindSpeed-RL
training YAML (MindSpeed-RL reads only its own sections). Validation is strict: an unknown key or a wrong
type is an error naming the key and the file. Every YAML the project reads goes through `load_yaml_text`, which
refuses a key given twice in one mapping (PyYAML keeps the last one silently, so a typo'd copy would hide the
value meant), naming the file, line and key.

Declared once here and used by both config kinds: the loss settings (`ObjectiveSection`: `trainer.*` in a run
config, `asp.*` in a MindSpeed-RL YAML), timeouts (`Timeout`), seeds (`Seed`) and the mode-dependent
`asp.max_lag`. A command-line flag that sets a key becomes an override of it (`flag_override`), validated with
the file (`validate_overridden`), so a flag and `key=value` are checked and named alike.
"""
from __future__ import annotations

import copy
import json
import typing
from pathlib import Path
from typing import (Annotated, Any, Callable, ClassVar, Dict, List, Literal, Mapping, Optional, Set, Tuple, Type,
                    TypeVar)

import yaml
from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from mindspeed_asp.errors import ConfigError
from mindspeed_asp.core.limits import MAX_COUNT, MAX_SEED, MAX_TIMEOUT_S
from mindspeed_asp.core.planner_names import PLANNER_NAMES
from mindspeed_asp.utils.textfile import read_text

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


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


#: A seed key: an integer in 0 .. MAX_SEED (mindspeed_asp/core/limits.py), refused with the key named when the config
#: is read (a larger one would pass and fail minutes later, inside an engine that does not say why).
Seed = Annotated[int, AfterValidator(_seed_in_range)]


def _timeout_in_range(value: float) -> float:
    if value > MAX_TIMEOUT_S:
        raise ValueError(f"a timeout is at most {MAX_TIMEOUT_S} s (7 days, MAX_TIMEOUT_S in "
                         "mindspeed_asp/core/limits.py): no start, step or sync of a run waits longer, so this is a "
                         "slip that would leave a hung run waiting for weeks")
    return value


#: A timeout key, in seconds: > 0 and at most MAX_TIMEOUT_S, refused naming the key when the config is read.
Timeout = Annotated[float, Field(gt=0.0), AfterValidator(_timeout_in_range)]


class ObjectiveSection(Strict):
    """The policy loss of an update, declared once for both trainers that read it: the standalone runtime's
    reference trainer (as `trainer.objective`, `trainer.iw_cap`, `trainer.iw_mode`) and MindSpeed-RL's loss
    patch (the same keys in the `asp:` section). Why one declaration: both run the same loss function
    (runtime/grpo.py), so the same value must be accepted or refused, with the same words, in either file."""

    objective: Literal["standard", "decoupled"] = Field(
        "decoupled", description="decoupled (default, chosen from the convergence benchmark): PPO's clip against "
        "the proximal policy (the trainer's log-probs before the update; MindSpeed-RL: its recomputed old "
        "log-probs) times an importance weight proximal / behaviour policy, truncated at iw_cap; standard: PPO's "
        "ratio against the behaviour log-probs. The two are identical at lag 0 (docs/trainer.md)")
    iw_cap: float = Field(2.0, ge=1.0, description="decoupled: upper clip of the importance weight pi_prox/pi_behav; "
                          "at least 1, since a cap below 1 would down-weight on-policy tokens")
    iw_mode: Literal["token", "sequence"] = Field(
        "token", description="decoupled: one importance weight per token, or one per sequence (the product of its "
        "token ratios)")


class EstimatorSection(Strict):
    """How response lengths are predicted from the length history (docs/design.md#length-estimation)."""

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


#: The `asp.max_lag` a mode trains at when the config does not say: synchronous modes at 0, the others at 1.
DEFAULT_MAX_LAG = 1


class AspSection(Strict):
    """ASP's own settings, valid inside a MindSpeed-RL YAML as the top-level `asp:` section."""

    #: modes that train at lag 0 only, with why: their `max_lag` defaults to 0 and any other value is refused
    #: (a stock run at `max_lag: 1` would otherwise run at 0 while its config and records said 1)
    LAG0_MODES: ClassVar[Dict[str, str]] = {"stock": "MindSpeed-RL's synchronous schedule"}

    mode: Literal["asp", "async", "stock"] = "asp"
    instances: int = Field(2, ge=1, le=MAX_COUNT, description="independent inference instances")
    slots: int = Field(64, ge=1, le=MAX_COUNT, description="max concurrent sequences per instance (vLLM max_num_seqs)")
    kv_budget_tokens: Optional[int] = Field(None, ge=1, le=MAX_COUNT)
    minibatch_groups: int = Field(4, ge=1, le=MAX_COUNT, description="trainer minibatch M, in prompt groups")
    max_lag: int = Field(None, ge=0, le=MAX_COUNT, validate_default=True,
                         description="max policy lag of any trained sample; 0 = synchronous. Unset: 1, and 0 in a "
                         "mode that trains at lag 0 only (LAG0_MODES: stock; in MindSpeed-RL also colocated), "
                         "where any other value is refused")
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
                                 "(docs/design.md#rho-and-rho_stock)")
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

    @field_validator("max_lag", mode="before")
    @classmethod
    def _default_lag_of_the_mode(cls, value: Any, info: ValidationInfo) -> Any:
        """Unset (None) is the mode's own default: 0 for a lag-0 mode, else DEFAULT_MAX_LAG."""
        if value is None:
            return 0 if info.data.get("mode") in cls.LAG0_MODES else DEFAULT_MAX_LAG
        return value

    @field_validator("max_lag")
    @classmethod
    def _lag_fits_the_mode(cls, value: int, info: ValidationInfo) -> int:
        mode = info.data.get("mode")
        if mode in cls.LAG0_MODES and value != 0:
            raise ValueError(lag0_message(cls, str(mode)))
        return value

    @model_validator(mode="after")
    def _mode_set_later(self) -> "AspSection":
        """A mode assigned after construction (validate_assignment) takes its lag-0 default too, unless a max_lag
        was given, which is then refused as at construction."""
        if self.mode in self.LAG0_MODES and self.max_lag != 0:
            if "max_lag" in self.model_fields_set:
                raise ValueError(f"asp.max_lag={self.max_lag}: {lag0_message(type(self), self.mode)}")
            self.__dict__["max_lag"] = 0
        return self


def lag0_message(model: Type["AspSection"], mode: str) -> str:
    """Why `asp.max_lag` must be 0 (or unset) in `mode`, naming both keys and what to do."""
    return (f"asp.mode={mode} trains at lag 0 only ({model.LAG0_MODES[mode]}), so asp.max_lag must be 0: set it "
            "to 0 or leave it out")


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


def load_asp_section(path: str | Path, overrides: Optional[List[str]] = None,
                     flags: Optional[Mapping[str, str]] = None) -> AspSection:
    """The `asp:` section of a standalone run config or of a YAML holding only that section, with `overrides`
    applied (`flags`: see `validate_overridden`)."""
    return asp_section_from_dict(read_yaml(path), str(path), overrides, flags)


def asp_section_from_dict(data: Dict[str, Any], path: str, overrides: Optional[List[str]] = None,
                          flags: Optional[Mapping[str, str]] = None) -> AspSection:
    """`load_asp_section` of a mapping already read (each process reads its YAML once)."""
    def validate(d: Dict[str, Any]) -> AspSection:
        if "asp" not in d:
            raise ConfigError("no top-level 'asp:' section", path=path)
        return validate_section(d["asp"], AspSection, path, prefix="asp")
    return validate_overridden(data, overrides or [], path, validate, flags)


def flag_override(key: str, value: Any) -> str:
    """The `key=value` override a command-line flag stands for, so a flag is validated (and named in errors)
    exactly as an override of its key is. A string YAML would read as something else is quoted: `host:port`,
    `123` or `a: b` stay strings."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (int, float)):
        text = repr(value)
    elif value is None:
        text = "null"
    else:
        text = str(value)
        try:
            same = parse_yaml(text) == text
        except YamlProblem:
            same = False
        if not same:
            text = json.dumps(text)
    return f"{key}={text}"


def validate_overridden(data: Mapping[str, Any], overrides: List[str], path: str,
                        validate: Callable[[Dict[str, Any]], T], flags: Optional[Mapping[str, str]] = None) -> T:
    """`validate` (a callable that raises ConfigError) on a copy of `data` with `overrides` applied in order.

    An error caused by an override says so, naming it, so nobody searches the file for the value: a key set by
    an override, or a cross-field error quoting an override's key as `key=value` (each override that took part
    is named). `flags` maps an override that a command-line flag stands for to the flag as typed
    (`--instances 0`), named beside it."""
    data = copy.deepcopy(dict(data))
    if overrides:
        apply_overrides(data, list(overrides))
    try:
        return validate(data)
    except ConfigError as exc:
        text = str(exc)
        culprits = [o for o in overrides or [] if exc.key and (override_key(o) == exc.key
                                                               or f"{override_key(o)}=" in text)]
        if not culprits:
            raise
        which = "override" if len(culprits) == 1 else "overrides"
        named = ", ".join(repr(o) + (f" ({flags[o]})" if flags and o in flags else "") for o in culprits)
        err = ConfigError(f"{exc} (from the command-line {which} {named})")
        err.path, err.line, err.key = exc.path, exc.line, exc.key
        raise err from None


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
