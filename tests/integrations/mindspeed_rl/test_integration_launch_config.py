"""Hydra overrides on the launch line reach ASP: the launcher composes them (Hydra's compose API, MindSpeed-RL's
search path) into the one file MindSpeed-RL and every ASP process read; an override typed after the entry
script by hand, of a key ASP reads, is refused in the driver by name."""
from __future__ import annotations

import types
from pathlib import Path

import pytest

pytest.importorskip("hydra", reason="needs hydra-core (MindSpeed-RL's config system)")

from mindspeed_asp.errors import ConfigError  # noqa: E402
from mindspeed_asp.integrations.mindspeed_rl import launch_config as lc  # noqa: E402
from mindspeed_asp.integrations.mindspeed_rl.config_section import load_topology  # noqa: E402
from vendor_paths import mindspeed_rl_src, missing_reason  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
MSRL = mindspeed_rl_src()
needs_msrl = pytest.mark.skipif(MSRL is None, reason=missing_reason())


@needs_msrl
def test_overrides_are_composed_into_the_file_asp_reads(tmp_path):
    out = lc.write_composed(ROOT / "configs" / "qwen25_7b_A3_asp.yaml", MSRL,
                            ["rl_config.n_samples_per_prompt=4", "asp.max_lag=3", "megatron_training.train_iters=7",
                             "asp.objective=standard"], tmp_path)
    topo = load_topology(str(out))
    assert (topo.n, topo.asp.max_lag, topo.train_iters, topo.asp.objective) == (4, 3, 7, "standard")
    data = lc.dig(__import__("yaml").safe_load(out.read_text()), "model.qwen25_7b.num_layers")
    assert data == 28  # the defaults list (MindSpeed-RL's model group) is merged, so the file stands alone
    assert "defaults" not in __import__("yaml").safe_load(out.read_text())
    assert "${oc.env:ASP_RUNTIME_ENV}" in out.read_text()  # resolved by each process, as Hydra does
    same = lc.write_composed(ROOT / "configs" / "qwen25_7b_A3_asp.yaml", MSRL, [], tmp_path / "plain")
    base = load_topology(str(ROOT / "configs" / "qwen25_7b_A3_asp.yaml"))
    assert load_topology(str(same)) == load_topology(str(same)) and load_topology(str(same)).n == base.n


@needs_msrl
def test_an_override_hydra_refuses_is_named_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match=r"rl_config\.no_such.*\+rl_config\.no_such=1"):
        lc.write_composed(ROOT / "configs" / "qwen25_7b_A3_asp.yaml", MSRL, ["rl_config.no_such=1"], tmp_path)
    with pytest.raises(ConfigError, match="max_lag"):  # Hydra composes it, ASP's strict section refuses it
        load_topology(str(lc.write_composed(ROOT / "configs" / "qwen25_7b_A3_asp.yaml", MSRL, ["asp.max_lag=-1"],
                                            tmp_path / "b")))


def test_hydras_own_overrides_stay_on_the_launch_line():
    hydra_args, config_args = lc.split_overrides(["hydra.run.dir=/x", "rl_config.n_samples_per_prompt=4",
                                                  "hydra/job_logging=disabled", "+asp.audit_path=/a", "~asp.seed"])
    assert hydra_args == ["hydra.run.dir=/x", "hydra/job_logging=disabled"]
    assert config_args == ["rl_config.n_samples_per_prompt=4", "+asp.audit_path=/a", "~asp.seed"]
    with pytest.raises(ConfigError, match="'cli/train_grpo.py' is not a Hydra override"):
        lc.split_overrides(["cli/train_grpo.py"])


def test_entry_line_overrides_of_keys_asp_reads_are_refused_by_name():
    data = {"rl_config": {"n_samples_per_prompt": 8}, "asp": {"max_lag": 1}, "actor_config": {"lr": 1e-6},
            "megatron_training": {"global_batch_size": 32}}
    argv = ["--config-path", "/c", "--config-name", "run", "hydra.run.dir=/h", "actor_config.lr=2e-6",
            "rl_config.n_samples_per_prompt=8"]
    lc.check_entry_overrides(argv, data, "run.yaml")  # a key ASP does not read, and one equal to the file
    with pytest.raises(ConfigError) as err:
        lc.check_entry_overrides(argv + ["rl_config.n_samples_per_prompt=16", "asp.max_lag=2"], data, "run.yaml")
    msg = str(err.value)
    assert "run.yaml" in msg and "rl_config.n_samples_per_prompt=16 (the file ASP reads has 8)" in msg
    assert "asp.max_lag=2 (the file ASP reads has 1)" in msg and "shell/ launcher" in msg
    with pytest.raises(ConfigError, match=r"asp\.max_lag=<deleted>"):
        lc.check_entry_overrides(["~asp.max_lag"], data, "run.yaml")


def test_a_trainer_built_with_another_batch_shape_is_refused():
    data = {"rl_config": {"n_samples_per_prompt": 8}, "megatron_training": {"global_batch_size": 32}}
    lc.check_launch_agrees(types.SimpleNamespace(global_batch_size=32, n_samples_per_prompt=8), data, "f.yaml")
    with pytest.raises(ConfigError, match=r"rl_config\.n_samples_per_prompt: MindSpeed-RL trains with 16, the file "
                                          r"ASP reads says 8"):
        lc.check_launch_agrees(types.SimpleNamespace(global_batch_size=32, n_samples_per_prompt=16), data, "f.yaml")


@needs_msrl
def test_the_module_prints_shell_variables(tmp_path, capsys):
    rc = lc.main([str(ROOT / "configs" / "qwen3_8b_A3_asp.yaml"), str(tmp_path), "--msrl-root", str(MSRL), "--",
                  "hydra.run.dir=/h", "asp.max_lag=2"])
    out = capsys.readouterr().out
    assert rc == 0 and f"ASP_COMPOSED_CONFIG={tmp_path / 'qwen3_8b_A3_asp.yaml'}" in out
    assert "ASP_HYDRA_ARGS=(hydra.run.dir=/h)" in out
    assert load_topology(str(tmp_path / "qwen3_8b_A3_asp.yaml")).asp.max_lag == 2
    # exactly the variables the scripts read: no ASP_MAX_LAG, ASP_INSTANCES, ASP_PLAN_PATH, ... any more
    from mindspeed_asp.integrations.mindspeed_rl.config_section import SHELL_VARS
    printed = {line.split("=", 1)[0] for line in out.splitlines() if "=" in line}
    assert printed == {"ASP_COMPOSED_CONFIG", "ASP_HYDRA_ARGS", *SHELL_VARS}
    assert "ASP_MODE=asp" in out and "ASP_TOTAL_NPUS=16" in out and "ASP_TRAIN_ITERS=" in out
    config = str(ROOT / "configs" / "qwen3_8b_A3_asp.yaml")
    rc = lc.main([config, str(tmp_path), "--msrl-root", str(MSRL), "--", "oops"])
    assert rc == 2 and "'oops' is not a Hydra override" in capsys.readouterr().err


@needs_msrl
def test_the_module_validates_the_composed_file_naming_the_key(tmp_path, capsys):
    """The process that composes the file also reads it once and validates it (no second Python
    for that): a stock run keeping the file's max_lag: 1 is refused before Ray starts, naming both keys."""
    config = str(ROOT / "configs" / "qwen25_7b_A3_asp.yaml")
    rc = lc.main([config, str(tmp_path), "--msrl-root", str(MSRL), "--", "asp.mode=stock"])
    err = capsys.readouterr().err
    assert rc == 2 and "asp.max_lag" in err and "asp.mode=stock trains at lag 0 only" in err
    rc = lc.main([config, str(tmp_path), "--msrl-root", str(MSRL), "--", "asp.mode=stock", "asp.max_lag=0"])
    out = capsys.readouterr().out
    assert rc == 0 and "ASP_MODE=stock" in out and "ASP_TOTAL_NPUS=8" in out  # stock: the trainer's NPUs only


def test_composed_files_are_read_with_the_strict_reader(tmp_path):
    """A key given twice is refused naming file, line and key (yaml.safe_load kept the last one silently)."""
    composed = tmp_path / "run.yaml"
    composed.write_text("actor_config:\n  save: ./ckpt_a\n  save: ./ckpt_b\n")
    with pytest.raises(ConfigError, match="duplicate key") as err:
        lc.resume_overrides(composed, tmp_path, [])
    assert err.value.key == "actor_config.save" and err.value.line == 3
    assert lc.resume_overrides({"actor_config": {"save": "./none"}}, tmp_path, []) == ([], None)  # a mapping too
    data = {"asp": {"max_lag": 1}}
    lc.check_entry_overrides(["asp.max_lag=1"], data, "run.yaml")  # the same value: fine
    with pytest.raises(ConfigError, match=r"asp\.max_lag=\{a: 1, a: 2\}"):
        lc.check_entry_overrides(["asp.max_lag={a: 1, a: 2}"], data, "run.yaml")  # not YAML: kept as text
