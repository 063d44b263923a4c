"""The Ascend configs: their asp: sections validate, their NPU split is what the docs say, and a config that
contradicts MindSpeed-RL's sections fails naming the key."""
import json
from pathlib import Path

import pytest
import yaml

from mindspeed_asp.config import AspSection, load_asp_section, validate_section
from mindspeed_asp.errors import ConfigError
from mindspeed_asp.integrations.mindspeed_rl.config_section import (
    LOSS_KEYS, load_topology, resolve_env, rollout_dispatch_size, scheduler_section, shell_vars, topology_from_dict)

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
    section = validate_section(scheduler_section(path)["asp"], AspSection, str(path), "asp")  # what asp plan reads
    assert section.mode == "asp"
    topo = load_topology(path)
    assert (topo.asp.objective, topo.asp.iw_cap, topo.asp.iw_mode) == ("decoupled", 2.0, "token")
    train, rollout, inst, tp, separate = EXPECTED[name]
    assert (topo.train_npus, topo.rollout_npus, topo.instances, topo.infer_tp, topo.separate_pool) == \
        (train, rollout, inst, tp, separate)
    # e2e_tps' devices: trainer + the separate pool, or the colocated NPUs once (docs/design.md section 5)
    assert topo.devices.total == topo.total_npus == train + rollout
    assert topo.devices.layout == ("split" if separate else "colocated")
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
    (lambda d: d["asp"].update(objective="ppo"), "asp.objective"),
    (lambda d: d["asp"].update(iw_cap=1.0), "asp.iw_cap"),
    (lambda d: d["asp"].update(iw_cap="big"), "asp.iw_cap"),
    (lambda d: d["asp"].update(iw_mode="group"), "asp.iw_mode"),
    (lambda d: d["generate_config"].update(enable_expert_parallel=True, infer_expert_parallel_size=8),
     "generate_config.enable_expert_parallel"),
    (lambda d: d["generate_config"].update(infer_expert_parallel_size=2), "generate_config.infer_expert_parallel_size"),
    (lambda d: d["actor_config"].update(expert_model_parallel_size=2), "actor_config.expert_model_parallel_size"),
    (lambda d: d.update(model={"qwen25_7b": {"num_experts": 64}}), "model.num_experts"),
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


def test_objective_keys_default_and_stay_out_of_the_scheduler_section(tmp_path):
    data = _base()
    for k in LOSS_KEYS:
        data["asp"].pop(k, None)
    topo = topology_from_dict(data)
    assert (topo.asp.objective, topo.asp.iw_cap, topo.asp.iw_mode) == ("decoupled", 2.0, "token")
    data["asp"].update(objective="standard", iw_cap=1.5, iw_mode="sequence")
    assert topology_from_dict(data).asp.iw_mode == "sequence"
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="unknown key"):
        load_asp_section(path)  # the standalone model does not know the loss keys...
    (tmp_path / "sched.yaml").write_text(yaml.safe_dump(scheduler_section(path)))
    assert load_asp_section(tmp_path / "sched.yaml").instances == 8  # ...so asp plan reads this


def _moe():
    return yaml.safe_load((CONFIGS / "qwen3_30b_a3b_dapo_A3_asp.yaml").read_text())


@pytest.mark.parametrize("asp", [{"max_lag": 1}, {"max_lag": 2}, {"mode": "async", "max_lag": 0}])
def test_moe_config_refuses_the_asynchronous_pool_before_ray(asp, monkeypatch):
    """Qwen3-30B-A3B (MoE, EP8 inference): the separate pool cannot transfer expert weights."""
    monkeypatch.delenv("ASP_PLAN", raising=False)
    data = _moe()
    data["asp"].update(asp)
    with pytest.raises(ConfigError, match="expert weights") as exc:
        topology_from_dict(data, "moe.yaml")
    assert "generate_config.enable_expert_parallel" in str(exc.value) and "moe.yaml" in str(exc.value)


def test_moe_without_ep_flags_is_refused_from_mindspeed_rls_model_file(tmp_path, monkeypatch):
    """Only Hydra's `defaults: model` says the model is MoE: read configs/model/<name>.yaml from the checkout."""
    (tmp_path / "mindspeed_rl").mkdir()
    (tmp_path / "configs" / "model").mkdir(parents=True)
    (tmp_path / "configs" / "model" / "qwen3_30b_a3b.yaml").write_text("qwen3_30b_a3b:\n  num_experts: 128\n")
    monkeypatch.setenv("MINDSPEED_RL_SRC", str(tmp_path))
    data = _moe()
    data["generate_config"].update(enable_expert_parallel=False, infer_expert_parallel_size=1)
    data["actor_config"]["expert_model_parallel_size"] = 1
    data["asp"]["max_lag"] = 1
    with pytest.raises(ConfigError, match="model.num_experts"):
        topology_from_dict(data, "moe.yaml")
    data["asp"]["max_lag"] = 0
    assert topology_from_dict(data).colocated_plan  # MindSpeed-RL's own engines: allowed


def test_moe_colocated_plan_evens_out_generate_calls(monkeypatch):
    monkeypatch.delenv("ASP_PLAN", raising=False)
    topo = load_topology(CONFIGS / "qwen3_30b_a3b_dapo_A3_asp.yaml")
    assert topo.vllm_dp_size == 8 and topo.equal_instance_calls and topo.colocated_plan
    assert not load_topology(CONFIGS / "qwen25_7b_A3_asp.yaml").equal_instance_calls
    data = _moe()
    data["rl_config"]["actor_rollout_dispatch_size"] = 12  # 2 groups x n=8 = 16 rows per engine
    with pytest.raises(ConfigError, match="rl_config.actor_rollout_dispatch_size"):
        topology_from_dict(data, "moe.yaml")
    data = _moe()
    data["megatron_training"]["global_batch_size"] = 24
    data["asp"]["minibatch_groups"] = 24
    with pytest.raises(ConfigError, match="megatron_training.global_batch_size"):
        topology_from_dict(data, "moe.yaml")


@pytest.mark.parametrize("name", ASCEND)
def test_asp_plan_takes_the_training_yaml_as_it_is(name, tmp_path, monkeypatch, capsys):
    """A user points `asp plan --config` at the per-model YAML the launch script runs: the loss keys it holds
    are validated and left to the trainer, and the plan takes the config's scheduler settings."""
    from mindspeed_asp.cli import main
    from mindspeed_asp.integrations.mindspeed_rl.config_section import load_scheduler_section
    from mindspeed_asp.scheduler.plan import load_plan
    from mindspeed_asp.workloads.prompts import load_prompt_set

    monkeypatch.delenv("ASP_PLAN", raising=False)
    path = CONFIGS / f"{name}.yaml"
    section = load_scheduler_section(path)
    topo = load_topology(path)
    assert (section.instances, section.slots, section.max_lag) == (topo.asp.instances, topo.asp.slots,
                                                                   topo.asp.max_lag)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt_id": f"q{i}", "prompt_len": 20 + i}) + "\n" for i in range(64)))
    out, summary = tmp_path / "plan.parquet", tmp_path / "summary.json"
    assert main(["plan", "--dataset", str(data), "--config", str(path), "--max-new-tokens", "512", "--n", "2",
                 "--no-progress", "--no-advice", "--json", str(summary), "-o", str(out)]) == 0
    capsys.readouterr()
    plan = load_plan(out, load_prompt_set(data, n=2))
    assert plan.header["instances"] == section.instances
    assert json.loads(summary.read_text())["groups"] == 64


def test_asp_plan_and_lengths_still_name_a_bad_key_of_a_training_yaml(tmp_path, monkeypatch, capsys):
    from mindspeed_asp.cli import main

    monkeypatch.delenv("ASP_PLAN", raising=False)
    data = yaml.safe_load((CONFIGS / "qwen25_7b_A3_asp.yaml").read_text())
    data["asp"]["iw_cap"] = 0.5  # a loss key out of range: refused, though the plan does not read it
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_id": "a", "prompt_len": 10}\n')
    args = ["plan", "--dataset", str(prompts), "--config", str(bad), "--max-new-tokens", "64", "-o",
            str(tmp_path / "x.parquet")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "asp.iw_cap" in err
    data["asp"]["iw_cap"] = 2.0
    data["asp"]["estimator"]["quantile"] = 0.7  # an unknown scheduler key
    bad.write_text(yaml.safe_dump(data))
    assert main(["lengths", "eval", "--trace", "synthetic:prompts=50", "--config", str(bad)]) == 2
    assert "asp.estimator.quantile" in capsys.readouterr().err
    data["asp"]["estimator"].pop("quantile")
    data["asp"]["estimator"]["group_max_quantile"] = 0.7
    bad.write_text(yaml.safe_dump(data))
    out = tmp_path / "m.json"
    assert main(["lengths", "eval", "--trace", "synthetic:prompts=50,n=4", "--config", str(bad), "--json",
                 str(out)]) == 0
    assert json.loads(out.read_text())["estimator_section"]["group_max_quantile"] == 0.7
