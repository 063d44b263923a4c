"""Run config: strict validation that names the key and the file, before anything heavy starts."""
from __future__ import annotations

from pathlib import Path

import pytest

from mindspeed_asp.errors import ConfigError
from mindspeed_asp.runtime.run_config import (RunConfig, load_run_config, packaged_config_path)

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny_cpu.yaml"


def test_tiny_config_loads_and_matches_packaged_copy():
    cfg = load_run_config(TINY)
    assert isinstance(cfg, RunConfig)
    assert cfg.asp.instances == 2 and cfg.data.task == "demo"
    assert packaged_config_path().read_text() == TINY.read_text()


def test_overrides_apply_with_yaml_types():
    cfg = load_run_config(TINY, ["asp.max_lag=2", "asp.mode=async", "run.steps=3", "trainer.lr=0.01"])
    assert cfg.asp.max_lag == 2 and cfg.asp.mode == "async" and cfg.run.steps == 3
    assert cfg.trainer.lr == pytest.approx(0.01)


def test_max_lag_defaults_by_mode_and_stock_refuses_another():
    """Stock trains at lag 0: unset, asp.max_lag is 0 there (1 in the other modes); a stock run given another
    lag is refused, naming both keys, so it never runs at 0 while config and records
    say 1 (docs/decisions/0008-mode-decides-deployment.md)."""
    assert load_run_config(TINY).asp.max_lag == 1
    assert load_run_config(TINY, ["asp.mode=async"]).asp.max_lag == 1
    stock = load_run_config(TINY, ["asp.mode=stock"])
    assert (stock.asp.mode, stock.asp.max_lag) == ("stock", 0)
    assert load_run_config(TINY, ["asp.mode=stock", "asp.max_lag=0"]).asp.max_lag == 0
    with pytest.raises(ConfigError) as exc:
        load_run_config(TINY, ["asp.mode=stock", "asp.max_lag=1"])
    msg = str(exc.value)
    assert exc.value.key == "asp.max_lag" and "asp.mode=stock" in msg and "lag 0" in msg
    assert "'asp.mode=stock'" in msg and "'asp.max_lag=1'" in msg  # both overrides that took part, named
    from mindspeed_asp.runtime.run_config import dump_config
    assert dump_config(stock)["asp"]["max_lag"] == 0  # the run's records say what it trains at


def test_stock_with_a_lag_in_the_file_is_refused_naming_the_flag(tmp_path):
    from mindspeed_asp.commands.train import build_config

    cfg = tmp_path / "lag2.yaml"
    cfg.write_text("asp:\n  max_lag: 2\n")
    with pytest.raises(ConfigError) as exc:
        build_config(str(cfg), [], mode="stock")
    msg = str(exc.value)
    assert exc.value.key == "asp.max_lag" and "lag2.yaml" in msg and "(--mode stock)" in msg
    assert build_config(str(cfg), ["asp.max_lag=0"], mode="stock").asp.max_lag == 0


@pytest.mark.parametrize("key", ["run.start_timeout_s", "run.step_timeout_s", "run.stall_timeout_s",
                                 "run.sync_timeout_s"])
def test_timeouts_are_bounded_above(key):
    """A timeout above MAX_TIMEOUT_S (7 days) is a slip (ms written as s): refused naming the key; the bound
    itself is allowed (with the stall timeout below the step timeout, as always)."""
    from mindspeed_asp.core.limits import MAX_TIMEOUT_S

    top = {"run.step_timeout_s": MAX_TIMEOUT_S, "run.stall_timeout_s": MAX_TIMEOUT_S - 1}
    top.setdefault(key, MAX_TIMEOUT_S)
    cfg = load_run_config(TINY, [f"{k}={v}" for k, v in top.items()])
    assert getattr(cfg.run, key.split(".")[1]) == top[key]
    with pytest.raises(ConfigError, match="a timeout is at most 604800 s") as exc:
        load_run_config(TINY, [f"{key}={MAX_TIMEOUT_S + 1}"])
    assert exc.value.key == key


@pytest.mark.parametrize("override,key", [
    ("asp.bogus=1", "asp.bogus"),
    ("model.nope=1", "model.nope"),
    ("extra_section.x=1", "extra_section"),
    ("asp.max_lag=-1", "asp.max_lag"),
    ("asp.max_lag=abc", "asp.max_lag"),
    ("run.steps=0", "run.steps"),
    ("asp.mode=fast", "asp.mode"),
    ("trainer.objective=ppo", "trainer.objective"),
    ("trainer.iw_cap=0.5", "trainer.iw_cap"),
    ("trainer.iw_mode=row", "trainer.iw_mode"),
    ("trainer.iw_clip=2", "trainer.iw_clip"),
])
def test_bad_keys_and_values_name_key_and_file(override, key):
    with pytest.raises(ConfigError) as exc:
        load_run_config(TINY, [override])
    msg = str(exc.value)
    assert key in msg and "tiny_cpu.yaml" in msg


def test_more_instances_than_cpu_slots_is_refused(monkeypatch):
    monkeypatch.setenv("ASP_CPU_SLOTS", "3")
    with pytest.raises(ConfigError, match="asp.instances"):
        load_run_config(TINY, ["asp.instances=4"])
    assert load_run_config(TINY, ["asp.instances=3"]).asp.instances == 3


def test_more_instances_than_devices_is_refused():
    with pytest.raises(ConfigError, match="visible devices"):
        load_run_config(TINY, ["asp.instances=2"], devices=1)


def test_missing_plan_file_and_missing_config(tmp_path):
    with pytest.raises(ConfigError, match="asp.plan_path"):
        load_run_config(TINY, [f"asp.plan_path={tmp_path / 'nope.parquet'}"])
    with pytest.raises(ConfigError, match="not found"):
        load_run_config(tmp_path / "absent.yaml")


def test_yaml_syntax_error_names_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("asp:\n  mode: asp\n  instances: [1,\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_run_config(bad)


def _write_plan(path, prompts, instances=2, **header):
    """A hand-made plan whose header records only what `header` gives (the planner: the run's, asp)."""
    import numpy as np

    from mindspeed_asp.scheduler.plan_file import DispatchPlan
    from mindspeed_asp.core.problem import Assignment

    G = len(prompts)
    orders = [np.arange(j, G, instances) for j in range(instances)]
    a = Assignment(orders=orders, minibatch=np.full(G, -1), planner="asp")
    plan = DispatchPlan.from_assignments(prompts, [0, G], [a], np.ones(G), np.ones(G), {"planner": "asp", **header})
    plan.save(path)
    return path


def test_plan_for_another_dataset_stops_before_ray(tmp_path):
    from mindspeed_asp.commands.train import build_config
    from mindspeed_asp.runtime.tasks import task_and_prompts

    cfg = load_run_config(TINY, ["data.num_prompts=8"])
    _, prompts = task_and_prompts(cfg)
    good = _write_plan(tmp_path / "good.jsonl", prompts)
    assert build_config(str(TINY), ["data.num_prompts=8", f"asp.plan_path={good}"]).asp.plan_path == str(good)
    other = load_run_config(TINY, ["data.num_prompts=8", "data.seed=5"])
    _, other_prompts = task_and_prompts(other)
    bad = _write_plan(tmp_path / "bad.jsonl", other_prompts)
    with pytest.raises(ConfigError) as exc:
        build_config(str(TINY), ["data.num_prompts=8", f"asp.plan_path={bad}"])
    assert "asp.plan_path" in str(exc.value) and "tiny_cpu.yaml" in str(exc.value) and "fingerprint" in str(exc.value)
    three = _write_plan(tmp_path / "three.jsonl", prompts, instances=3)
    with pytest.raises(ConfigError, match="3 instances"):
        build_config(str(TINY), ["data.num_prompts=8", f"asp.plan_path={three}"])


def _tiny_plan(tmp_path, name, cfg, **changes):
    """A plan `asp plan` would write for the run `cfg`, with `changes` to its build settings."""
    from mindspeed_asp.runtime.tasks import task_and_prompts
    from mindspeed_asp.scheduler.build import build_plan, estimate_lengths

    _, prompts = task_and_prompts(cfg)
    est = estimate_lengths(prompts, None, cfg.data.max_new_tokens)
    kw = dict(instances=cfg.asp.instances, slots=cfg.asp.slots, minibatch=cfg.asp.minibatch_groups,
              max_new_tokens=cfg.data.max_new_tokens, planner="stock", max_lag=cfg.asp.max_lag,
              groups_per_iteration=cfg.asp.replan_every * cfg.asp.minibatch_groups, progress=False)
    kw.update(changes)
    return build_plan(prompts, est, **kw).plan.save(tmp_path / name)


@pytest.mark.parametrize("change,named", [
    (dict(minibatch=2), ["minibatch_groups=2", "asp.minibatch_groups=4", "asp plan --minibatch 4"]),
    (dict(slots=8), ["slots=8", "asp.slots=16", "asp plan --slots 16"]),
    (dict(max_new_tokens=64), ["max_new_tokens=64", "data.max_new_tokens=48"]),
    (dict(max_lag=3), ["max_lag=3", "asp.max_lag=1", "asp plan --max-lag 1"]),
    (dict(groups_per_iteration=4), ["groups_per_iteration=4", "asp plan --groups-per-iteration 8"]),
    (dict(work_stealing=False), ["work_stealing=False", "asp.work_stealing=True", "without --no-work-stealing"]),
    (dict(kv_budget=100000), ["kv_budget=100000", "asp.kv_budget_tokens=None", "without --kv-budget"]),
    (dict(planner="lpt"), ["planner='lpt'", "asp.planner='stock'", "asp plan --planner stock"]),
])
def test_plan_built_for_other_settings_stops_before_ray(tmp_path, change, named):
    """Not only the dataset and the instances: every setting the plan depends on must be the run's."""
    from mindspeed_asp.commands.train import build_config

    base = ["data.num_prompts=16", "data.n=4", "data.max_new_tokens=48", "asp.minibatch_groups=4", "asp.slots=16",
            "asp.replan_every=2", "asp.planner=stock"]
    cfg = load_run_config(TINY, base)
    good = _tiny_plan(tmp_path, "good.jsonl", cfg)
    assert build_config(str(TINY), base + [f"asp.plan_path={good}"]).asp.plan_path == str(good)
    bad = _tiny_plan(tmp_path, "bad.jsonl", cfg, **change)
    with pytest.raises(ConfigError) as exc:
        build_config(str(TINY), base + [f"asp.plan_path={bad}"])
    assert exc.value.key == "asp.plan_path"
    for want in named:
        assert want in str(exc.value), str(exc.value)


def test_plan_without_recorded_settings_is_checked_on_the_rest_with_a_warning(tmp_path, capsys):
    from mindspeed_asp.commands.train import build_config
    from mindspeed_asp.runtime.tasks import task_and_prompts

    cfg = load_run_config(TINY, ["data.num_prompts=8"])
    _, prompts = task_and_prompts(cfg)
    partial = _write_plan(tmp_path / "partial.jsonl", prompts, slots=cfg.asp.slots)
    build_config(str(TINY), ["data.num_prompts=8", f"asp.plan_path={partial}"])
    err = capsys.readouterr().err
    assert "warning" in err and "minibatch_groups" in err and "max_lag" in err and "slots" not in err
    other = _write_plan(tmp_path / "other.jsonl", prompts, slots=cfg.asp.slots * 2)
    with pytest.raises(ConfigError, match=r"slots=64.*asp\.slots=32"):
        build_config(str(TINY), ["data.num_prompts=8", f"asp.plan_path={other}"])


@pytest.mark.parametrize("override,ok", [
    ("run.seed=4294967295", True), ("run.seed=4294967296", False), ("run.seed=-1", False),
    ("data.seed=4294967295", True), ("data.seed=100000000000000000000000", False),
    ("model.init_seed=4294967296", False),
])
def test_seeds_are_range_checked_where_the_config_is_read(override, ok):
    """0 <= seed < 2**32: the engine seed reaches np.random.seed in vLLM, which takes no larger."""
    if ok:
        load_run_config(TINY, [override])
        return
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=r"a seed must be in 0 \.\. 4294967295") as exc:
        load_run_config(TINY, [override])
    assert exc.value.key == key and repr(override) in str(exc.value)


@pytest.mark.parametrize("override,key", [
    ("asp.instances=true", "asp.instances"), ("run.steps=yes", "run.steps"), ("trainer.lr=true", "trainer.lr"),
    ("asp.kv_budget_tokens=true", "asp.kv_budget_tokens"), ("asp.estimator.max_epochs=no", "asp.estimator.max_epochs"),
])
def test_a_boolean_in_a_number_key_is_refused(override, key):
    with pytest.raises(ConfigError, match="boolean") as exc:
        load_run_config(TINY, [override])
    assert exc.value.key == key


def test_numbers_still_coerce_as_before(tmp_path):
    """Only booleans are refused: a quoted integer and an integer in a float key load as they always did."""
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text('run:\n  steps: "3"\ntrainer:\n  lr: 1\nasp:\n  work_stealing: yes\n')
    cfg = load_run_config(cfg_file)
    assert cfg.run.steps == 3 and cfg.trainer.lr == 1.0 and cfg.asp.work_stealing is True


def test_a_key_overridden_twice_is_refused_naming_both():
    with pytest.raises(ConfigError) as exc:
        load_run_config(TINY, ["run.steps=3", "asp.max_lag=2", "run.steps=x"])
    msg = str(exc.value)
    assert exc.value.key == "run.steps" and "'run.steps=3'" in msg and "'run.steps=x'" in msg


def test_a_cross_field_error_names_every_override_that_took_part():
    with pytest.raises(ConfigError) as exc:
        load_run_config(TINY, ["data.n=64", "asp.slots=8", "run.steps=3"])
    msg = str(exc.value)
    assert "'data.n=64'" in msg and "'asp.slots=8'" in msg and "run.steps" not in msg


def test_flag_and_override_of_one_key_are_refused():
    from mindspeed_asp.commands.train import build_config

    with pytest.raises(ConfigError, match=r"--mode stock.*'asp\.mode=asp'") as exc:
        build_config(str(TINY), ["asp.mode=asp"], mode="stock")
    assert exc.value.key == "asp.mode"
    assert build_config(str(TINY), [], mode="stock", out="x").run.out == "x"


@pytest.mark.parametrize("text,line,key", [
    ("asp:\n  slots: 8\n  max_lag: 1\n  slots: 16\n", 4, "asp.slots"),
    ("run:\n  steps: 2\nrun:\n  seed: 1\n", 3, "run"),
    ("asp:\n  estimator:\n    kind: history\n    kind: oracle\n", 4, "asp.estimator.kind"),
])
def test_a_yaml_key_given_twice_is_refused_with_file_line_and_key(tmp_path, text, line, key):
    cfg_file = tmp_path / "dup.yaml"
    cfg_file.write_text(text)
    with pytest.raises(ConfigError, match="duplicate key") as exc:
        load_run_config(cfg_file)
    assert exc.value.line == line and exc.value.key == key and f"{cfg_file}:{line}" in str(exc.value)


def test_yaml_merge_keys_and_anchors_are_not_duplicates():
    from mindspeed_asp.config import parse_yaml

    data = parse_yaml("base: &b {x: 1, y: 2}\nuse:\n  <<: *b\n  y: 3\nagain: *b\n")
    assert data["use"] == {"x": 1, "y": 3} and data["again"] == {"x": 1, "y": 2}


def test_cli_reports_config_errors_as_one_line(capsys):
    from mindspeed_asp.cli import main

    assert main(["train", "--config", str(TINY), "asp.max_lag=-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "asp.max_lag" in err[0] and "tiny_cpu.yaml" in err[0]


def test_a_mindspeed_rl_training_yaml_is_refused_with_how_to_launch_it(capsys):
    from mindspeed_asp.cli import main

    msrl = REPO / "configs" / "qwen25_7b_A3_asp.yaml"
    assert main(["train", "--config", str(msrl), "--mode", "asp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(msrl) in err[0] and "MindSpeed-RL training YAML" in err[0]
    assert "shell/" in err[0] and "unknown key" not in err[0]


def test_error_from_a_command_line_override_says_so():
    from mindspeed_asp.errors import ConfigError
    from mindspeed_asp.runtime.run_config import load_run_config, packaged_config_path

    with pytest.raises(ConfigError, match=r"asp\.max_lag.*command-line override 'asp\.max_lag=-1'") as info:
        load_run_config(packaged_config_path(), ["asp.max_lag=-1"])
    assert info.value.key == "asp.max_lag"


def test_trainer_objective_keys_default_to_decoupled_and_override():
    cfg = load_run_config(TINY)
    assert (cfg.trainer.objective, cfg.trainer.iw_cap, cfg.trainer.iw_mode) == ("decoupled", 2.0, "token")
    assert RunConfig().trainer.objective == "decoupled"  # the file states the code defaults
    cfg = load_run_config(TINY, ["trainer.objective=standard", "trainer.iw_cap=3", "trainer.iw_mode=sequence"])
    assert (cfg.trainer.objective, cfg.trainer.iw_cap, cfg.trainer.iw_mode) == ("standard", 3.0, "sequence")


def test_the_shipped_tiny_model_lives_in_the_cache_not_the_working_directory(tmp_path, monkeypatch):
    """A run started from any directory builds (or reuses) the tiny model in the stated cache, one per weight seed,
    and writes nothing derived into the directory it was started from."""
    pytest.importorskip("transformers", reason="needs the runtime extra: pip install mindspeed-asp[runtime]")
    from mindspeed_asp.runtime.tiny_model import default_cache_dir, ensure_tiny_model

    cfg = load_run_config(packaged_config_path())
    assert cfg.model.tiny and cfg.model.path is None
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("ASP_CACHE_DIR", str(tmp_path / "cache"))
    built = ensure_tiny_model(cfg.model.path, seed=cfg.model.init_seed)
    assert Path(built) == default_cache_dir(0) == tmp_path / "cache" / "tiny-qwen2"
    assert default_cache_dir(3) == tmp_path / "cache" / "tiny-qwen2-seed3"
    assert list(cwd.iterdir()) == []


def test_a_model_that_is_not_tiny_needs_its_path():
    with pytest.raises(ConfigError, match="model.path must name the HF model directory") as err:
        load_run_config(packaged_config_path(), ["model.tiny=false"])
    assert err.value.key == "model.path"
