"""The Ascend launch and comparison scripts: valid bash, shellcheck-clean, no process killing, and their
preparation step (config -> shell variables, pin check, HCCL environment) works without NPUs."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHELL = ROOT / "shell"
SCRIPTS = ["msrl_common.sh", "compare_msrl.sh", "qwen25_7b_A3_asp.sh", "qwen25_32b_A3_asp.sh",
           "qwen25_32b_A2_asp.sh", "qwen3_8b_A3_asp.sh", "qwen3_30b_a3b_dapo_A3_asp.sh"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_bash_syntax(name):
    subprocess.run(["bash", "-n", str(SHELL / name)], check=True)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_shellcheck_clean():
    out = subprocess.run(["shellcheck", "-x", *SCRIPTS], cwd=SHELL, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


@pytest.mark.parametrize("name", SCRIPTS)
def test_never_kills_other_processes(name):
    text = (SHELL / name).read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    for bad in ("pkill", "killall", "ray stop", "kill -9"):
        assert bad not in code, f"{name} runs `{bad}`"


@pytest.mark.parametrize("config", [s[:-3] for s in SCRIPTS if s.startswith("qwen")])
def test_each_config_has_a_launch_script_and_prepares(config, tmp_path):
    msrl = tmp_path / "MindSpeed-RL"
    (msrl / "mindspeed_rl").mkdir(parents=True)
    env = dict(os.environ, MINDSPEED_RL_ROOT=str(msrl), RUN_DIR=str(tmp_path / "run"),
               ASP_PYTHON=str(Path(os.sys.executable)), ASP_MINDSPEED_RL_COMMIT="05a90d7",
               ASCEND_TOOLKIT_HOME=str(tmp_path / "no-toolkit"))
    env.pop("ASP_PLAN", None)
    cmd = (f"source {SHELL / 'msrl_common.sh'}; asp_prepare {config}; "
           'echo "$ASP_INSTANCES|$ASP_TOTAL_NPUS|$ASP_PLAN|$ASP_RUNTIME_ENV|$ASP_MSRL_CONFIG|$VLLM_ASCEND_ENABLE_NZ|$HCCL_CONNECT_TIMEOUT"')
    out = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    inst, total, plan, runtime_env, cfg, nz, hccl = out.stdout.strip().splitlines()[-1].split("|")
    assert int(inst) >= 8 and int(total) >= 16
    assert plan == str(tmp_path / "run" / "plan.parquet")
    assert runtime_env.endswith("mindspeed_rl/runtime_env.yaml") and Path(runtime_env).is_file()
    assert cfg == str(ROOT / "configs" / f"{config}.yaml")
    assert nz == "0" and hccl == "1800"


def test_prepare_refuses_an_unpinned_mindspeed_rl(tmp_path):
    msrl = tmp_path / "MindSpeed-RL"
    (msrl / "mindspeed_rl").mkdir(parents=True)
    env = dict(os.environ, MINDSPEED_RL_ROOT=str(msrl), RUN_DIR=str(tmp_path / "run"),
               ASP_PYTHON=str(Path(os.sys.executable)), ASP_MINDSPEED_RL_COMMIT="1218aab")
    env.pop("ASP_ALLOW_UNPINNED_MINDSPEED_RL", None)
    out = subprocess.run(["bash", "-c", f"source {SHELL / 'msrl_common.sh'}; asp_prepare qwen25_7b_A3_asp"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "1218aab" in out.stderr and "05a90d7" in out.stderr


def test_head_builds_the_plan_the_runtime_accepts(tmp_path):
    """asp_build_plan (node 0) runs `asp plan` on the exported prompts; the plan-ordered loader then accepts
    it for a dataset with the same ids and lengths (fingerprint check) and the config's instance count."""
    import json
    import numpy as np
    from mindspeed_asp.integrations.mindspeed_rl.data_patches import open_plan, prompt_set_from_dataset
    rng = np.random.default_rng(0)
    dataset = [{"input_ids": np.arange(int(rng.integers(5, 300)))} for _ in range(64)]
    with open(tmp_path / "prompts.jsonl", "w") as fh:  # what export_prompts.py writes
        for i, item in enumerate(dataset):
            fh.write(json.dumps({"prompt_id": str(i), "prompt_len": len(item["input_ids"])}) + "\n")
    msrl = tmp_path / "MindSpeed-RL"
    (msrl / "mindspeed_rl").mkdir(parents=True)
    env = dict(os.environ, MINDSPEED_RL_ROOT=str(msrl), RUN_DIR=str(tmp_path / "run"),
               ASP_PYTHON=str(Path(os.sys.executable)), ASP_MINDSPEED_RL_COMMIT="05a90d7",
               ASP_PROMPTS=str(tmp_path / "prompts.jsonl"))
    env.pop("ASP_PLAN", None)
    out = subprocess.run(["bash", "-c", f"source {SHELL / 'msrl_common.sh'}; asp_prepare qwen3_8b_A3_asp; "
                          "asp_build_plan"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    plan = open_plan(str(tmp_path / "run" / "plan.parquet"), 8, prompt_set_from_dataset(dataset, 8))
    assert plan.num_iterations == 2 and plan.instances == 8
    assert sorted(int(p) for it in range(2) for j in range(8) for p in plan.instance_queue(it, j)) == list(range(64))
