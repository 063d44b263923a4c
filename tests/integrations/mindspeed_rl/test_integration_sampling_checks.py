"""Settings the separate rollout pool cannot honour are refused before Ray starts, naming the key.

- Non-neutral sampling: vllm-ascend 1b16c01 reports raw log-probs, Megatron's recompute is temperature-scaled,
  so every importance weight of a lag >= 1 row would be biased.
- Prefix caching: vLLM V1's reset_prefix_cache() is a no-op while requests are in flight (always, in the
  asynchronous pool), so reused prompt KV would come from older weights.
- TransferQueue (`rl_config.data_strategy: tq`): its per-consumer column registry never carries ASP's columns.

Modes stock and colocated (MindSpeed-RL's own colocated engines) keep all three.
"""
from pathlib import Path
from typing import Any, Callable, Dict

import pytest
import yaml

from mindspeed_asp.errors import ConfigError
from mindspeed_asp.integrations.mindspeed_rl.config_section import load_topology, topology_from_dict

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
SHIPPED = ["qwen25_7b_A3_asp", "qwen25_32b_A3_asp", "qwen25_32b_A2_asp", "qwen3_8b_A3_asp",
           "qwen3_30b_a3b_dapo_A3_asp"]
SAMPLING = "generate_config.sampling_config"


def _base(**asp: Any) -> Dict[str, Any]:
    data = yaml.safe_load((CONFIGS / "qwen25_7b_A3_asp.yaml").read_text())  # asp, max_lag 1: separate pool
    data["asp"].update(asp)
    return data


def _sampling(**values: Any) -> Callable[[Dict[str, Any]], None]:
    return lambda d: d["generate_config"]["sampling_config"].update(values)


def _refused(data: Dict[str, Any], key: str) -> str:
    with pytest.raises(ConfigError) as exc:
        topology_from_dict(data, "run.yaml")
    msg = str(exc.value)
    assert key in msg and "run.yaml" in msg
    return msg


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configs_still_load(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ASP_PLAN", raising=False)
    load_topology(CONFIGS / f"{name}.yaml")


@pytest.mark.parametrize("values,key", [
    ({"temperature": 0.7}, "temperature"),
    ({"temperature": 1.2}, "temperature"),
    ({"top_p": 0.95}, "top_p"),
    ({"top_k": 50}, "top_k"),
    ({"top_k": 1}, "top_k"),
    ({"min_p": 0.05}, "min_p"),
    ({"repetition_penalty": 1.1}, "repetition_penalty"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"frequency_penalty": -0.2}, "frequency_penalty"),
])
@pytest.mark.parametrize("mode", ["asp", "async"])
def test_non_neutral_sampling_is_refused_in_the_separate_pool(values: Dict[str, Any], key: str, mode: str) -> None:
    data = _base(mode=mode)
    _sampling(**values)(data)
    msg = _refused(data, f"{SAMPLING}.{key}")
    assert "raw log-probs" in msg and "temperature-scaled" in msg  # why
    assert "asp.mode: colocated" in msg and "asp.mode: stock" in msg  # what to do


@pytest.mark.parametrize("values", [
    {"temperature": 1, "top_p": 1, "top_k": -1, "min_p": 0},
    {"top_k": 0},  # vLLM: 0 disables top-k too
    {"repetition_penalty": 1.0, "presence_penalty": 0, "frequency_penalty": 0.0},
    {},  # keys absent: the pool's SamplingParams defaults are neutral
])
def test_neutral_sampling_is_accepted(values: Dict[str, Any]) -> None:
    data = _base()
    sc = data["generate_config"]["sampling_config"]
    for k in ("temperature", "top_p", "top_k", "min_p"):
        sc.pop(k)
    sc.update(values)
    assert topology_from_dict(data).separate_pool


def test_a_sampling_value_that_is_no_number_names_the_key() -> None:
    data = _base()
    _sampling(temperature="hot")(data)
    assert "expected a number" in _refused(data, f"{SAMPLING}.temperature")


def test_prefix_caching_is_refused_in_the_separate_pool() -> None:
    data = _base()
    data["generate_config"]["enable_prefix_caching"] = True
    msg = _refused(data, "generate_config.enable_prefix_caching")
    assert "reset_prefix_cache()" in msg and "in flight" in msg and "lag" in msg
    data["generate_config"]["enable_prefix_caching"] = False
    assert topology_from_dict(data).separate_pool


@pytest.mark.parametrize("value", ["tq", "TQ", "transfer_queue", "queue"])
def test_transfer_queue_is_refused_in_the_separate_pool(value: str) -> None:
    data = _base(mode="async")
    data["rl_config"]["data_strategy"] = value
    msg = _refused(data, "rl_config.data_strategy")
    assert "rollout_log_prob" in msg and "policy_version" in msg and "data_strategy: td" in msg


@pytest.mark.parametrize("value", ["td", "transfer_dock", None])
def test_transfer_dock_is_accepted(value: Any) -> None:
    data = _base()
    data["rl_config"]["data_strategy"] = value
    assert topology_from_dict(data).separate_pool


@pytest.mark.parametrize("asp", [{"mode": "stock", "max_lag": 0}, {"mode": "colocated", "max_lag": 0, "instances": 8}])
def test_stock_and_lag_zero_keep_them(asp: Dict[str, Any]) -> None:
    """MindSpeed-RL's own engines generate: the behaviour policy is its recompute's, the prefix cache is
    reset with nothing in flight, and TransferQueue carries the stock columns."""
    data = _base(**asp)
    _sampling(temperature=0.7, top_p=0.9, top_k=50, min_p=0.1)(data)
    data["generate_config"]["enable_prefix_caching"] = True
    data["rl_config"]["data_strategy"] = "tq"
    assert not topology_from_dict(data).separate_pool
