"""Run config: strict validation that names the key and the file, before anything heavy starts."""
from __future__ import annotations

from pathlib import Path

import pytest

from mindspeed_asp.errors import ConfigError
from mindspeed_asp.runtime.run_config import (RunConfig, load_run_config, packaged_config_path)

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "configs" / "tiny_cpu.yaml"


def test_tiny_config_loads_and_matches_packaged_copy():
    cfg = load_run_config(TINY)
    assert isinstance(cfg, RunConfig)
    assert cfg.asp.instances == 2 and cfg.data.task == "demo"
    assert packaged_config_path().read_text() == TINY.read_text()


def test_overrides_apply_with_yaml_types():
    cfg = load_run_config(TINY, ["asp.max_lag=2", "asp.mode=stock", "run.steps=3", "trainer.lr=0.01"])
    assert cfg.asp.max_lag == 2 and cfg.asp.mode == "stock" and cfg.run.steps == 3
    assert cfg.trainer.lr == pytest.approx(0.01)


@pytest.mark.parametrize("override,key", [
    ("asp.bogus=1", "asp.bogus"),
    ("model.nope=1", "model.nope"),
    ("extra_section.x=1", "extra_section"),
    ("asp.max_lag=-1", "asp.max_lag"),
    ("asp.max_lag=abc", "asp.max_lag"),
    ("run.steps=0", "run.steps"),
    ("asp.mode=fast", "asp.mode"),
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
