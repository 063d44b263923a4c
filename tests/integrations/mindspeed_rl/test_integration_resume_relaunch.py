"""A relaunch with the shipped configs resumes: the launcher composes the resume settings when the save
directory holds a checkpoint with ASP's state, and the driver refuses a start whose settings would discard
that state (finetune: true restarts at iteration 0 and plan window 0; no_load_optim resets Adam)."""
from __future__ import annotations

import json
import importlib.util
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from mindspeed_asp.errors import ConfigError
from mindspeed_asp.integrations.mindspeed_rl.resume_state import (check_resume_settings, latest_iteration,
                                                                  resumable_iteration, state_path)

needs_hydra = pytest.mark.skipif(importlib.util.find_spec("hydra") is None,
                                 reason="the launchers compose configs with Hydra: pip install mindspeed-asp[contract]")
ROOT = Path(__file__).resolve().parents[3]


def _checkpoint(directory: Path, iteration, with_state: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "latest_checkpointed_iteration.txt").write_text(f"{iteration}\n")
    if with_state and str(iteration).isdigit():
        path = state_path(directory, int(iteration))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"format": "mindspeed-asp/msrl-state", "iteration": int(iteration)}))
    return directory


def test_what_counts_as_resumable(tmp_path):
    assert latest_iteration(_checkpoint(tmp_path / "converted", "release")) is None  # a converted start
    assert resumable_iteration(tmp_path / "converted") is None
    assert resumable_iteration(_checkpoint(tmp_path / "stock", 40, with_state=False)) is None  # saved without ASP
    assert resumable_iteration(_checkpoint(tmp_path / "asp", 40)) == 40
    assert resumable_iteration(tmp_path / "absent") is None and resumable_iteration(None) is None


def test_a_start_that_would_discard_asps_state_is_refused_by_key(tmp_path):
    load = str(_checkpoint(tmp_path / "ckpt_asp", 100))
    with pytest.raises(ConfigError) as err:
        check_resume_settings(load, True, True, False, "run.yaml")
    assert err.value.key == "actor_config.finetune" and "iteration 100" in str(err.value)
    assert "plan window 0" in str(err.value) and "asp.ignore_saved_state" in str(err.value)
    with pytest.raises(ConfigError) as err:
        check_resume_settings(load, False, True, False, "run.yaml")
    assert err.value.key == "actor_config.no_load_optim" and "Adam" in str(err.value)
    assert check_resume_settings(load, False, False, False, "run.yaml") == 100  # a real resume
    assert check_resume_settings(load, True, True, True, "run.yaml") == 100  # afresh, on purpose
    converted = str(_checkpoint(tmp_path / "start", "release"))
    assert check_resume_settings(converted, True, True, False, "run.yaml") is None  # the first launch


def _prepare(tmp_path, *overrides, **env_extra):
    from factories import SHELL, fake_msrl
    msrl = fake_msrl(tmp_path)
    env = dict(os.environ, MINDSPEED_RL_ROOT=str(msrl), RUN_DIR=str(tmp_path / "run"),
               ASP_PYTHON=os.sys.executable, ASP_MINDSPEED_RL_COMMIT="05a90d7",
               ASCEND_TOOLKIT_HOME=str(tmp_path / "no-toolkit"), **env_extra)
    for k in {"ASP_PLAN", "TRAIN_ITERS", "ASP_RESUME"} - set(env_extra):
        env.pop(k, None)
    out = subprocess.run(["bash", "-c", f"source {SHELL / 'msrl_common.sh'}; asp_prepare qwen25_7b_A3_asp "
                          + " ".join(overrides)],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    composed = yaml.safe_load((tmp_path / "run" / "config" / "qwen25_7b_A3_asp.yaml").read_text())
    return msrl, composed["actor_config"], out


@needs_hydra
def test_the_first_launch_runs_the_shipped_settings(tmp_path):
    _, actor, out = _prepare(tmp_path)
    assert (actor["load"], actor["save"], actor["finetune"], actor["no_load_optim"]) == \
        ("./ckpt", "./ckpt_asp", True, True)
    assert "resuming" not in out.stderr


@needs_hydra
def test_a_relaunch_resumes_from_the_save_directory(tmp_path):
    from factories import fake_msrl
    _checkpoint(fake_msrl(tmp_path) / "ckpt_asp", 100)  # what the first launch saved (relative to the entry's cwd)
    _, actor, out = _prepare(tmp_path)
    assert (actor["load"], actor["finetune"], actor["no_load_optim"], actor["no_load_rng"]) == \
        ("./ckpt_asp", False, False, False)
    assert "resuming iteration 100" in out.stderr
    # the launch line's own choice wins (and the driver then refuses it, by key: see the test above)
    _, actor, _ = _prepare(tmp_path, "actor_config.no_load_optim=true")
    assert actor["no_load_optim"] is True and actor["finetune"] is False
    _, actor, out = _prepare(tmp_path, ASP_RESUME="off")
    assert (actor["load"], actor["finetune"]) == ("./ckpt", True) and "resuming" not in out.stderr
