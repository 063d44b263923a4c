"""The Ascend configs: their asp: sections validate, their NPU split is what the docs say, and a config that
contradicts MindSpeed-RL's sections fails naming the key."""
from pathlib import Path

import pytest
import yaml

from mindspeed_asp.config import load_asp_section
from mindspeed_asp.errors import ConfigError
from mindspeed_asp.integrations.mindspeed_rl.config_section import (
    load_topology, resolve_env, rollout_dispatch_size, shell_vars, topology_from_dict)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ASCEND = ["qwen25_7b_A3_asp", "qwen25_32b_A3_asp", "qwen25_32b_A2_asp", "qwen3_8b_A3_asp", "qwen3_30b_a3b_dapo_A3_asp"]

# name -> (train NPUs, rollout NPUs, instances, infer TP, separate pool)
EXPECTED = {
    "qwen25_7b_A3_asp": (8, 8, 8, 1, True),
    "qwen25_32b_A3_asp": (16, 16, 8, 2, True),
    "qwen25_32b_A2_asp": (16, 16, 8, 2, True),
    "qwen3_8b_A3_asp": (8, 8, 8, 1, True),
    "qwen3_30b_a3b_dapo_A3_asp": (16, 0, 16, 1, False),
}


@pytest.mark.parametrize("name", ASCEND)
def test_config_asp_section_and_topology(name, monkeypatch):
    monkeypatch.delenv("ASP_PLAN", raising=False)
    path = CONFIGS / f"{name}.yaml"
    section = load_asp_section(path)  # the project's strict model
    assert section.mode == "asp"
    topo = load_topology(path)
    train, rollout, inst, tp, separate = EXPECTED[name]
    assert (topo.train_npus, topo.rollout_npus, topo.instances, topo.infer_tp, topo.separate_pool) == \
        (train, rollout, inst, tp, separate)
    assert topo.asp.minibatch_groups == topo.gbs
    assert topo.guarantee_order
    raw = yaml.safe_load(path.read_text())
    assert raw["rl_config"]["runtime_env_path"] == "${oc.env:ASP_RUNTIME_ENV}"
    assert topo.asp.plan_path.endswith("plan.parquet")  # env default resolved
    if not separate:  # plan chunks of one group fit any per-instance count
        assert raw["rl_config"]["actor_rollout_dispatch_size"] == topo.n


def test_env_reference_resolution(monkeypatch):
    monkeypatch.setenv("ASP_PLAN", "/data/p.parquet")
    topo = load_topology(CONFIGS / "qwen25_7b_A3_asp.yaml")
    assert topo.asp.plan_path == "/data/p.parquet"
    assert "ASP_PLAN_PATH=/data/p.parquet" in shell_vars(topo)
    monkeypatch.delenv("NOT_SET_VAR_ASP", raising=False)
    with pytest.raises(ConfigError, match="NOT_SET_VAR_ASP"):
        resolve_env({"a": "${oc.env:NOT_SET_VAR_ASP}"}, "f.yaml")
    assert resolve_env("${oc.env:NOT_SET_VAR_ASP,null}") is None


def _base():
    return yaml.safe_load((CONFIGS / "qwen25_7b_A3_asp.yaml").read_text())


@pytest.mark.parametrize("edit,key", [
    (lambda d: d["asp"].update(minibatch_groups=16), "asp.minibatch_groups"),
    (lambda d: d["asp"].update(plan_path=None), "asp.plan_path"),
    (lambda d: d["rl_config"].update(guarantee_order=False), "rl_config.guarantee_order"),
    (lambda d: d["asp"].update(slots=4096), "asp.slots"),
    (lambda d: d["asp"].update(bogus=1), "asp.bogus"),
    (lambda d: d["rl_config"].update(partial_rollout_max_split=2), "rl_config.partial_rollout_max_split"),
    (lambda d: d["asp"].update(max_lag=0, instances=3), "asp.instances"),
    (lambda d: d["rl_config"]["actor_resource"].update(num_npus="8"), "rl_config.actor_resource.num_npus"),
    (lambda d: d.pop("generate_config"), "generate_config"),
])
def test_contradictions_name_the_key(edit, key):
    data = _base()
    edit(data)
    with pytest.raises(ConfigError) as exc:
        topology_from_dict(data, "x.yaml")
    assert key in str(exc.value) and "x.yaml" in str(exc.value)


def test_stock_mode_has_no_separate_pool():
    data = _base()
    data["asp"]["mode"] = "stock"
    topo = topology_from_dict(data)
    assert not topo.separate_pool and topo.rollout_npus == 0 and topo.total_npus == topo.train_npus


def test_rollout_dispatch_size_splits_every_instance():
    assert rollout_dispatch_size([4, 4, 4, 4], 8, 16, 4) == 32
    assert rollout_dispatch_size([3, 5, 4, 4], 8, 16, 4) == 8
    assert rollout_dispatch_size([6, 2], 16, 8, 2) == 32
