"""The Ascend configs: their asp: sections validate, their NPU split is what the docs say, and a config that
contradicts MindSpeed-RL's sections fails naming the key."""
import json
from pathlib import Path

import pytest
import yaml

from mindspeed_asp.config import load_asp_section
from mindspeed_asp.errors import ConfigError
from mindspeed_asp.integrations.mindspeed_rl.config_section import (
    LOSS_KEYS, SHELL_VARS, load_topology, resolve_env, rollout_dispatch_size, shell_vars, topology_from_dict)

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
ASCEND = ["qwen25_7b_A3_asp", "qwen25_32b_A3_asp", "qwen25_32b_A2_asp", "qwen3_8b_A3_asp", "qwen3_30b_a3b_dapo_A3_asp"]

# name -> (mode, train NPUs, rollout NPUs, instances, infer TP, separate pool)
EXPECTED = {
    "qwen25_7b_A3_asp": ("asp", 8, 8, 8, 1, True),
    "qwen25_32b_A3_asp": ("asp", 16, 16, 8, 2, True),
    "qwen25_32b_A2_asp": ("asp", 16, 16, 8, 2, True),
    "qwen3_8b_A3_asp": ("asp", 8, 8, 8, 1, True),
    "qwen3_30b_a3b_dapo_A3_asp": ("colocated", 16, 0, 16, 1, False),
}


@pytest.mark.parametrize("name", ASCEND)
def test_config_asp_section_and_topology(name, monkeypatch):
    monkeypatch.delenv("ASP_PLAN", raising=False)
    path = CONFIGS / f"{name}.yaml"
    topo = load_topology(path)
    assert (topo.asp.objective, topo.asp.iw_cap, topo.asp.iw_mode) == ("decoupled", 2.0, "token")
    mode, train, rollout, inst, tp, separate = EXPECTED[name]
    assert topo.asp.mode == mode and topo.plan_ordered
    assert (topo.train_npus, topo.rollout_npus, topo.instances, topo.infer_tp, topo.separate_pool) == \
        (train, rollout, inst, tp, separate)
    # e2e_tps' devices: trainer + the separate pool, or the colocated NPUs once (docs/design.md#e2e_tps)
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
    (lambda d: d["asp"].update(mode="colocated", max_lag=0, instances=3), "asp.instances"),
    (lambda d: d["asp"].update(mode="colocated"), "asp.max_lag"),  # the file's max_lag: 1, in a lag-0 mode
    (lambda d: d["asp"].update(mode="stock"), "asp.max_lag"),
    (lambda d: d["asp"].update(sync_timeout_s=8 * 24 * 3600), "asp.sync_timeout_s"),
    (lambda d: d["asp"].update(engine_start_timeout_s=1e12), "asp.engine_start_timeout_s"),
    (lambda d: d["asp"].update(placement_timeout_s=0), "asp.placement_timeout_s"),
    (lambda d: d["rl_config"]["actor_resource"].update(num_npus="8"), "rl_config.actor_resource.num_npus"),
    (lambda d: d.pop("generate_config"), "generate_config"),
    (lambda d: d["asp"].update(objective="ppo"), "asp.objective"),
    (lambda d: d["asp"].update(iw_cap=0.99), "asp.iw_cap"),
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
    del data["asp"]["max_lag"]  # unset: 0 in mode stock
    topo = topology_from_dict(data)
    assert not topo.separate_pool and topo.rollout_npus == 0 and topo.total_npus == topo.train_npus
    assert topo.asp.max_lag == 0 and not topo.plan_ordered


def test_the_deployment_follows_the_mode_not_max_lag():
    """The deployment follows the mode, not max_lag: max_lag 0 in mode asp keeps the separate pool (16 NPUs for
    this config, not the colocated engines' 8), synchronous; the colocated deployment is its own mode
    (docs/decisions/0008-mode-decides-deployment.md)."""
    data = _base()
    data["asp"]["max_lag"] = 0
    topo = topology_from_dict(data)
    assert topo.separate_pool and not topo.colocated_plan and topo.plan_ordered
    assert (topo.instances, topo.rollout_npus, topo.total_npus) == (8, 8, 16)
    data["asp"].update(mode="colocated")
    topo = topology_from_dict(data)
    assert topo.colocated_plan and not topo.separate_pool and topo.plan_ordered
    assert (topo.instances, topo.rollout_npus, topo.total_npus) == (8, 0, 8)
    del data["asp"]["max_lag"]
    assert topology_from_dict(data).asp.max_lag == 0  # unset: the mode's lag 0
    data["asp"]["max_lag"] = 2
    with pytest.raises(ConfigError, match=r"asp\.mode=colocated trains at lag 0 only") as exc:
        topology_from_dict(data, "x.yaml")
    assert exc.value.key == "asp.max_lag"
    data["asp"].update(mode="async", max_lag=0)
    assert topology_from_dict(data).separate_pool  # as before


def test_the_standalone_runtime_refuses_the_colocated_mode(tmp_path):
    """`colocated` means MindSpeed-RL's own engines: only the MindSpeed-RL section takes it."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text("asp:\n  mode: colocated\n")
    with pytest.raises(ConfigError) as exc:
        load_asp_section(cfg)
    assert exc.value.key == "asp.mode"


def test_the_objective_keys_are_declared_once_for_both_trainers():
    """trainer.objective/iw_cap/iw_mode (standalone) and asp.objective/iw_cap/iw_mode (MindSpeed-RL): one
    declaration, the same checks and descriptions, so a value is accepted or refused alike in either file."""
    from mindspeed_asp.config import ObjectiveSection
    from mindspeed_asp.integrations.mindspeed_rl.config_section import MsrlAspSection
    from mindspeed_asp.runtime.run_config import TrainerSection, load_run_config

    for key in ("objective", "iw_cap", "iw_mode"):
        own = ObjectiveSection.model_fields[key]
        for model in (TrainerSection, MsrlAspSection):
            got = model.model_fields[key]
            assert (got.default, got.description, got.metadata) == (own.default, own.description, own.metadata)
    tiny = CONFIGS / "tiny_cpu.yaml"
    assert load_run_config(tiny, ["trainer.iw_cap=1.0"]).trainer.iw_cap == 1.0  # accepted (ge 1) here...
    data = _base()
    data["asp"]["iw_cap"] = 1.0
    assert topology_from_dict(data).asp.iw_cap == 1.0
    data["asp"]["iw_cap"] = 0.99  # ...and below 1 refused in both, in the same words
    with pytest.raises(ConfigError) as msrl:
        topology_from_dict(data, "x.yaml")
    with pytest.raises(ConfigError) as standalone:
        load_run_config(tiny, ["trainer.iw_cap=0.99"])
    assert str(msrl.value).split("'asp.iw_cap': ")[1] == str(standalone.value).split("'trainer.iw_cap': ")[1].split(
        " (from the command-line")[0]


def test_the_launchers_shell_variables_are_the_ones_their_scripts_read():
    """Every variable `shell_vars` prints is read by a script in shell/, and nothing else is printed."""
    import re
    topo = load_topology(CONFIGS / "qwen25_7b_A3_asp.yaml")
    printed = dict(line.split("=", 1) for line in shell_vars(topo).splitlines())
    assert set(printed) == set(SHELL_VARS)
    scripts = "\n".join(p.read_text() for p in (CONFIGS.parent / "shell").glob("*.sh"))
    for var in printed:
        assert re.search(r"\$\{?" + var + r"\b", scripts), f"{var} is printed but no shell/ script reads it"
    assert printed["ASP_MODE"] == "asp" and printed["ASP_TOTAL_NPUS"] == "16"


def test_rollout_dispatch_size_splits_every_instance():
    assert rollout_dispatch_size([4, 4, 4, 4], 8, 16, 4) == 32
    assert rollout_dispatch_size([3, 5, 4, 4], 8, 16, 4) == 8
    assert rollout_dispatch_size([6, 2], 16, 8, 2) == 32


def test_objective_keys_default_and_are_read_through_the_adapter_only(tmp_path):
    from mindspeed_asp.commands.plan import read_config

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
    section, topo = read_config(str(path), [], {})  # ...so asp plan tells the file's kind and reads it whole
    assert section.instances == 8 and topo is not None and topo.asp.iw_mode == "sequence"


def _moe():
    return yaml.safe_load((CONFIGS / "qwen3_30b_a3b_dapo_A3_asp.yaml").read_text())


@pytest.mark.parametrize("asp", [{"mode": "asp", "max_lag": 1}, {"mode": "asp", "max_lag": 2},
                                 {"mode": "asp", "max_lag": 0}, {"mode": "async", "max_lag": 0}])
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
    data["asp"].update(mode="asp", max_lag=1)
    with pytest.raises(ConfigError, match="model.num_experts"):
        topology_from_dict(data, "moe.yaml")
    data["asp"].update(mode="colocated", max_lag=0)
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
    from mindspeed_asp.commands.plan import read_config
    from mindspeed_asp.scheduler.plan_file import load_plan
    from mindspeed_asp.workloads.prompts import load_prompt_set

    monkeypatch.delenv("ASP_PLAN", raising=False)
    path = CONFIGS / f"{name}.yaml"
    section, _ = read_config(str(path), [], {})
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


@pytest.mark.parametrize("name", ["qwen3_8b_A3_asp", "qwen3_30b_a3b_dapo_A3_asp"])
def test_asp_plan_takes_the_runs_shape_from_a_training_yaml(name, tmp_path, monkeypatch, capsys):
    """The launcher passes no shape flags: `asp plan --config` on a MindSpeed-RL YAML plans for the instances that
    follow the plan (the pool's, or the colocated engines'), one global batch per window, and the run's n, max tokens,
    seed and KV budget."""
    from mindspeed_asp.cli import main
    from mindspeed_asp.scheduler.plan_file import load_plan

    monkeypatch.delenv("ASP_PLAN", raising=False)
    path = CONFIGS / f"{name}.yaml"
    topo = load_topology(path)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt_id": f"q{i}", "prompt_len": 20 + i}) + "\n"
                            for i in range(2 * topo.gbs)))
    out = tmp_path / "plan.parquet"
    assert main(["plan", "--dataset", str(data), "--config", str(path), "--no-progress", "--no-advice",
                 "-o", str(out)]) == 0
    capsys.readouterr()
    h = load_plan(out).header
    assert (h["instances"], h["minibatch_groups"], h["groups_per_iteration"]) == (topo.instances, topo.gbs, topo.gbs)
    assert (h["max_new_tokens"], h["seed"], h["max_lag"], h["slots"]) == (topo.max_tokens, topo.seed,
                                                                          topo.asp.max_lag, topo.asp.slots)
    assert load_plan(out).num_iterations == 2 and h["n"] == topo.n


def test_asp_plan_builds_the_plan_a_training_yaml_names_none_of_yet(tmp_path, monkeypatch, capsys):
    """The run refuses mode asp without asp.plan_path; `asp plan`, which writes it, reads the YAML all the same."""
    from mindspeed_asp.cli import main

    monkeypatch.delenv("ASP_PLAN", raising=False)
    data = _base()
    data["asp"].pop("plan_path")
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="asp.plan_path"):
        load_topology(path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_id": f"q{i}", "prompt_len": 20 + i}) + "\n" for i in range(32)))
    assert main(["plan", "--dataset", str(prompts), "--config", str(path), "--no-progress", "--no-advice",
                 "-o", str(tmp_path / "plan.parquet")]) == 0
    capsys.readouterr()
