"""The rollout pool builds MindSpeed-RL's `VLLMInferEngine` with every keyword stock's `_build_rollout` passes.

A keyword the factory drops silently takes the engine's default: the 32B-A3 config's
`ascend_scheduler_config_enabled: false` was dropped, and vllm-ascend refused the engine at start-up. Read
from the pinned source with `ast` (nothing imported), like test_patch_targets.py.
"""
import ast
import sys
import types
from pathlib import Path
from typing import Any, Dict, Set

import yaml

from mindspeed_asp.integrations.mindspeed_rl import rollout_worker
from mindspeed_asp.integrations.mindspeed_rl.rollout_worker import FORWARDED_KEYS, POOL_SET_KEYS, engine_kwargs

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


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


def engine_parameters(src: Path) -> Set[str]:
    fn = _function(src / "mindspeed_rl/models/rollout/vllm_engine.py", "VLLMInferEngine", "__init__")
    return {a.arg for a in fn.args.args + fn.args.kwonlyargs} - {"self"}


def test_every_stock_keyword_is_forwarded_or_set_on_purpose(msrl_src: Path) -> None:
    stock = stock_engine_keywords(msrl_src)
    handled = set(FORWARDED_KEYS) | set(POOL_SET_KEYS)
    assert stock - handled == set(), f"stock passes keywords the pool drops: {sorted(stock - handled)}"
    assert set(POOL_SET_KEYS) - stock == set(), "POOL_SET_KEYS lists keywords stock does not pass"
    assert set(FORWARDED_KEYS) <= stock


def test_every_factory_keyword_is_an_engine_parameter(msrl_src: Path) -> None:
    passed = set(engine_kwargs({}, "/tok", 0.9))
    unknown = passed - engine_parameters(msrl_src)
    assert not unknown, f"VLLMInferEngine has no parameter {sorted(unknown)} (it would vanish into **kwargs)"


def test_32b_a3_engine_keeps_the_ascend_scheduler_off(monkeypatch: Any) -> None:
    """The factory itself, on the 32B-A3 config's generate_config, with the engine class recording its call."""
    seen: Dict[str, Any] = {}

    class RecordingEngine:
        def __init__(self, **kwargs: Any) -> None:
            seen.update(kwargs)

    module = types.ModuleType("mindspeed_rl.models.rollout.vllm_engine")
    module.VLLMInferEngine = RecordingEngine  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mindspeed_rl.models.rollout.vllm_engine", module)
    monkeypatch.setattr(rollout_worker, "bind_npu", lambda: 0)
    gen = yaml.safe_load((CONFIGS / "qwen25_32b_A3_asp.yaml").read_text())["generate_config"]
    rollout_worker.ascend_engine_factory(gen, "/tok", 0.9)
    assert seen["ascend_scheduler_config_enabled"] is False
    assert seen["max_num_batched_tokens"] == 2048 and seen["max_model_len"] == 3072
    assert seen["infer_tensor_parallel_size"] == 2 and seen["gpu_memory_utilization"] == 0.9
    assert seen["train_tensor_parallel_size"] is None and seen["load_format"] == "megatron"
