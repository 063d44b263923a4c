"""The Ascend launch and comparison scripts: valid bash, shellcheck-clean, no process killing, and their
preparation step (config -> shell variables, pin check, HCCL environment) works without NPUs."""
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from factories import fake_msrl

needs_hydra = pytest.mark.skipif(importlib.util.find_spec("hydra") is None,
                                 reason="the launchers compose configs with Hydra: pip install mindspeed-asp[contract]")
ROOT = Path(__file__).resolve().parents[3]
SHELL = ROOT / "shell"
SCRIPTS = ["msrl_common.sh", "compare_msrl.sh", "ascend_first_run.sh", "qwen25_7b_A3_asp.sh", "qwen25_32b_A3_asp.sh",
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


@needs_hydra
@pytest.mark.parametrize("config", [s[:-3] for s in SCRIPTS if s.startswith("qwen")])
def test_each_config_has_a_launch_script_and_prepares(config, tmp_path):
    msrl = fake_msrl(tmp_path)
    env = dict(os.environ, MINDSPEED_RL_ROOT=str(msrl), RUN_DIR=str(tmp_path / "run"),
               ASP_PYTHON=str(Path(os.sys.executable)), ASP_MINDSPEED_RL_COMMIT="05a90d7",
               ASCEND_TOOLKIT_HOME=str(tmp_path / "no-toolkit"))
    env.pop("ASP_PLAN", None)
    cmd = (f"source {SHELL / 'msrl_common.sh'}; asp_prepare {config}; "
           'echo "$ASP_MODE|$ASP_TOTAL_NPUS|$ASP_PLAN|$ASP_RUNTIME_ENV|$ASP_MSRL_CONFIG|'
           '$VLLM_ASCEND_ENABLE_NZ|$HCCL_CONNECT_TIMEOUT|${ASP_INSTANCES-unset}"')
    out = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    mode, total, plan, runtime_env, cfg, nz, hccl, inst = out.stdout.strip().splitlines()[-1].split("|")
    assert mode in ("asp", "colocated") and int(total) >= 16
    assert inst == "unset"  # read by no script: not printed (the plan reads the instances from the file)
    assert plan == str(tmp_path / "run" / "plan.parquet")
    assert runtime_env.endswith("mindspeed_rl/runtime_env.yaml") and Path(runtime_env).is_file()
    assert cfg == str(tmp_path / "run" / "config" / f"{config}.yaml")  # composed: what MindSpeed-RL reads too
    assert nz == "0" and hccl == "1800"


@needs_hydra
def test_prepare_refuses_an_unpinned_mindspeed_rl(tmp_path):
    msrl = fake_msrl(tmp_path)
    env = dict(os.environ, MINDSPEED_RL_ROOT=str(msrl), RUN_DIR=str(tmp_path / "run"),
               ASP_PYTHON=str(Path(os.sys.executable)), ASP_MINDSPEED_RL_COMMIT="1218aab")
    env.pop("ASP_ALLOW_UNPINNED_MINDSPEED_RL", None)
    out = subprocess.run(["bash", "-c", f"source {SHELL / 'msrl_common.sh'}; asp_prepare qwen25_7b_A3_asp"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "1218aab" in out.stderr and "05a90d7" in out.stderr


@needs_hydra
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
    msrl = fake_msrl(tmp_path)
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


def _dry_env(tmp_path, **extra):
    msrl = fake_msrl(tmp_path)
    env = dict(os.environ, MINDSPEED_RL_ROOT=str(msrl), RUN_DIR=str(tmp_path / "run"),
               ASP_PYTHON=str(Path(os.sys.executable)), ASP_MINDSPEED_RL_COMMIT="05a90d7",
               ASCEND_TOOLKIT_HOME=str(tmp_path / "no-toolkit"), ASP_DRY_RUN="1")
    for k in ("ASP_PLAN", "RAY_ADDRESS", "NODE_IP", "ASP_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
              "TP_SOCKET_IFNAME", "HCCL_IF_BASE_PORT", "LCAL_COMM_ID", "NNODES"):
        env.pop(k, None)
    env.update(extra)
    return env


def _dry_run(script, env):
    out = subprocess.run(["bash", str(SHELL / script)], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    lines = [x for x in out.stdout.splitlines() if x.startswith("[asp dry-run]")]
    env_line = next(x for x in lines if x.startswith("[asp dry-run] env NODE_IP="))
    found = dict(kv.split("=", 1) for kv in env_line.split(" env ", 1)[1].split())
    return lines, found


@needs_hydra
def test_worker_node_joins_with_its_own_address_nic_and_cluster(tmp_path):
    env = _dry_env(tmp_path, NODE_RANK="1", MASTER_ADDR="10.0.0.1", RAY_PORT="6801", NODE_IP="10.0.0.2",
                   ASP_SOCKET_IFNAME="eth9", HCCL_IF_BASE_PORT="61000")
    lines, found = _dry_run("qwen25_32b_A3_asp.sh", env)
    start = next(x for x in lines if "ray.scripts.scripts start" in x)
    assert "--address=10.0.0.1:6801" in start and "--node-ip-address 10.0.0.2" in start
    assert "-u RAY_ADDRESS" in start  # `ray start` itself never reads a stale RAY_ADDRESS
    assert found["NODE_IP"] == "10.0.0.2" and found["RAY_ADDRESS"] == "10.0.0.1:6801"
    assert found["HCCL_SOCKET_IFNAME"] == found["GLOO_SOCKET_IFNAME"] == found["TP_SOCKET_IFNAME"] == "eth9"
    assert found["HCCL_IF_BASE_PORT"] == "61000"  # the launching environment's value reaches the workers...


def test_runtime_env_does_not_override_per_job_ports():
    """...because Ray's runtime_env env_vars would override what workers inherit from `ray start`."""
    import yaml
    from mindspeed_asp.integrations.mindspeed_rl.setup_hook import RUNTIME_ENV_FILE
    env_vars = yaml.safe_load(RUNTIME_ENV_FILE.read_text())["env_vars"]
    for key in ("HCCL_IF_BASE_PORT", "LCAL_COMM_ID", "HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME",
                "RAY_ADDRESS"):
        assert key not in env_vars


@needs_hydra
def test_head_exports_ray_address_for_msrls_ray_init(tmp_path):
    (tmp_path / "prompts.jsonl").write_text("")
    env = _dry_env(tmp_path, NODE_RANK="0", MASTER_ADDR="10.0.0.1", ASP_SOCKET_IFNAME="eth9",
                   ASP_PROMPTS=str(tmp_path / "prompts.jsonl"))
    lines, found = _dry_run("qwen25_32b_A3_asp.sh", env)
    start = next(x for x in lines if "ray.scripts.scripts start" in x)
    assert "--head" in start and "--port 6766" in start and "--node-ip-address 10.0.0.1" in start
    train = next(x for x in lines if "cli/train_grpo.py" in x)
    assert "RAY_ADDRESS=10.0.0.1:6766" in train and found["RAY_ADDRESS"] == "10.0.0.1:6766"
    assert found["HCCL_IF_BASE_PORT"] == "64000"  # the scripts' default, not stock's 12345
    plan = next(x for x in lines if "mindspeed_asp.cli plan" in x)
    composed = tmp_path / "run" / "config" / "qwen25_32b_A3_asp.yaml"
    assert f"--config {composed}" in plan  # the file every process reads, read by `asp plan` itself
    from mindspeed_asp.commands.plan import read_config
    assert read_config(str(composed), [], {})[0].instances == 8


@needs_hydra
def test_multi_node_without_a_known_nic_fails_naming_the_variable(tmp_path):
    env = _dry_env(tmp_path, NODE_RANK="0", MASTER_ADDR="203.0.113.77")  # an address no interface here holds
    out = subprocess.run(["bash", str(SHELL / "qwen25_32b_A2_asp.sh")], env=env, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode != 0 and "ASP_SOCKET_IFNAME" in out.stderr


@needs_hydra
def test_worker_without_a_route_to_the_head_fails_naming_node_ip(tmp_path):
    bindir = tmp_path / "bin"  # this PATH has everything but `ip`
    bindir.mkdir()
    for d in ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        for f in Path(d).glob("*") if Path(d).is_dir() else []:
            if f.name != "ip" and not (bindir / f.name).exists():
                (bindir / f.name).symlink_to(f)
    env = _dry_env(tmp_path, NODE_RANK="1", MASTER_ADDR="10.0.0.1", PATH=str(bindir))
    out = subprocess.run(["bash", str(SHELL / "qwen25_32b_A3_asp.sh")], env=env, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode != 0 and "set NODE_IP" in out.stderr


@needs_hydra
def test_compare_dry_run_runs_stock_without_forced_port_and_same_shuffling(tmp_path):
    env = _dry_env(tmp_path, NODE_RANK="0", MASTER_ADDR="10.0.0.1", ASP_SOCKET_IFNAME="eth9",
                   ASP_PROMPTS=str(tmp_path / "prompts.jsonl"))
    msrl = Path(env["MINDSPEED_RL_ROOT"])
    (msrl / "configs" / "envs").mkdir(parents=True, exist_ok=True)
    (msrl / "configs" / "envs" / "runtime_env.yaml").write_text(
        "env_vars:\n  HCCL_IF_BASE_PORT: '12345'\n  LCAL_COMM_ID: '127.0.0.1:27001'\n  VLLM_DP_SIZE: '1'\n")
    (tmp_path / "prompts.jsonl").write_text("")
    out = subprocess.run(["bash", str(SHELL / "compare_msrl.sh"), "qwen25_7b_A3_asp", "3"], env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    runs = [x for x in out.stdout.splitlines() if "cli/train_grpo.py" in x]
    assert len(runs) == 2 and all("no_shuffle" not in x for x in runs)
    assert "RAY_ADDRESS=10.0.0.1:6766" in runs[0] and "RAY_ADDRESS=10.0.0.1:6767" in runs[1]
    import yaml
    stock_env = yaml.safe_load((tmp_path / "run" / "compare" / "stock_runtime_env.yaml").read_text())
    assert stock_env["env_vars"] == {"VLLM_DP_SIZE": "1"}


@needs_hydra
def test_launch_line_overrides_are_composed_for_both_and_only_hydras_stay_on_the_line(tmp_path):
    """`bash shell/<config>.sh rl_config.n_samples_per_prompt=4 asp.max_lag=2 hydra.job.name=x`: every ASP
    step (plan, topology) sees the overrides, MindSpeed-RL trains from the same composed file, and only the
    Hydra override is left on its command line (a config override there would reach MindSpeed-RL only)."""
    import yaml
    (tmp_path / "prompts.jsonl").write_text("")
    env = _dry_env(tmp_path, NODE_RANK="0", MASTER_ADDR="127.0.0.1", ASP_PROMPTS=str(tmp_path / "prompts.jsonl"),
                   TRAIN_ITERS="3")
    out = subprocess.run(["bash", str(SHELL / "qwen3_8b_A3_asp.sh"), "rl_config.n_samples_per_prompt=4",
                          "asp.max_lag=2", "hydra.job.name=x"], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    lines = [x for x in out.stdout.splitlines() if x.startswith("[asp dry-run]")]
    composed = tmp_path / "run" / "config" / "qwen3_8b_A3_asp.yaml"
    data = yaml.safe_load(composed.read_text())
    assert data["rl_config"]["n_samples_per_prompt"] == 4 and data["asp"]["max_lag"] == 2
    assert data["megatron_training"]["train_iters"] == 3 and "qwen3_8b_marker" in str(data["model"])
    plan = next(x for x in lines if "mindspeed_asp.cli plan" in x)
    assert f"--config {composed}" in plan  # n=4 reaches the plan through the composed file...
    for flag in ("--n", "--instances", "--slots", "--minibatch", "--max-new-tokens", "--seed", "--planner"):
        assert f" {flag} " not in plan  # ...not back through shell variables
    train = next(x for x in lines if "cli/train_grpo.py" in x)
    assert f"--config-path {composed.parent}" in train and "--config-name qwen3_8b_A3_asp" in train
    assert "hydra.job.name=x" in train
    assert "n_samples_per_prompt" not in train and "max_lag" not in train and "train_iters" not in train
    # node 0 starts the head before the plan: the other nodes join while it is built
    order = [i for i, x in enumerate(lines) if "ray.scripts.scripts start" in x or "mindspeed_asp.cli plan" in x]
    assert "ray.scripts.scripts start" in lines[order[0]] and "cli plan" in lines[order[1]]


@needs_hydra
def test_a_bad_override_fails_before_ray_starts_naming_the_key(tmp_path):
    env = _dry_env(tmp_path, NODE_RANK="0", MASTER_ADDR="127.0.0.1")
    out = subprocess.run(["bash", str(SHELL / "qwen3_8b_A3_asp.sh"), "rl_config.n_sample_per_prompt=4"], env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode != 0 and "rl_config.n_sample_per_prompt" in out.stderr
    assert "ray.scripts.scripts start" not in out.stdout
    out = subprocess.run(["bash", "-c", f"source {SHELL / 'msrl_common.sh'}; asp_prepare qwen3_8b_A3_asp; "
                          "RAY_ADDRESS=x asp_train cli/train_grpo.py asp.max_lag=3"], env=env, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode != 0 and "config override asp.max_lag=3 must go to asp_prepare" in out.stderr


@needs_hydra
def test_ray_cli_is_the_jobs_own_python_not_the_first_on_path(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ray").write_text("#!/bin/sh\necho WRONG-RAY\nexit 1\n")
    (bindir / "ray").chmod(0o755)
    env = _dry_env(tmp_path, NODE_RANK="1", MASTER_ADDR="10.0.0.1", NODE_IP="10.0.0.2", ASP_SOCKET_IFNAME="eth9",
                   PATH=f"{bindir}:{os.environ['PATH']}")
    lines, _ = _dry_run("qwen25_32b_A3_asp.sh", env)
    start = next(x for x in lines if "ray.scripts.scripts start" in x)
    assert start.split("env -u RAY_ADDRESS ", 1)[1].startswith(f"{os.sys.executable} -m ray.scripts.scripts start")


@needs_hydra
def test_first_run_script_composes_its_checks_into_a_short_fresh_run(tmp_path):
    """shell/ascend_first_run.sh: one node, FIRST_RUN_ITERS iterations, the probe after every sync, an audit
    file and a checkpoint in its own run directory, whatever the config says; then the report (its logic is
    tested in test_first_run_report.py and on a real CPU run in the msrl_e2e tier)."""
    import yaml
    (tmp_path / "prompts.jsonl").write_text("")
    env = _dry_env(tmp_path, MASTER_ADDR="127.0.0.1", ASP_PROMPTS=str(tmp_path / "prompts.jsonl"),
                   FIRST_RUN_ITERS="2")
    out = subprocess.run(["bash", str(SHELL / "ascend_first_run.sh"), "qwen25_7b_A3_asp", "asp.max_lag=2"], env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    data = yaml.safe_load((tmp_path / "run" / "config" / "qwen25_7b_A3_asp.yaml").read_text())
    assert data["asp"]["weight_probe_every"] == 1 and data["asp"]["max_lag"] == 2
    assert data["asp"]["audit_path"] == str(tmp_path / "run" / "first_run_audit.jsonl")
    assert data["actor_config"]["save"] == str(tmp_path / "run" / "ckpt")
    assert data["megatron_training"]["train_iters"] == 2 and data["megatron_training"]["save_interval"] == 2
    assert any("cli/train_grpo.py" in x for x in out.stdout.splitlines())
    out = subprocess.run(["bash", str(SHELL / "ascend_first_run.sh"), "qwen25_7b_A3_asp", "asp.mode=stock",
                          "asp.max_lag=0"], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode != 0 and "first-run checks need ASP's trainer" in out.stderr
    out = subprocess.run(["bash", str(SHELL / "ascend_first_run.sh"), "qwen25_7b_A3_asp", "asp.mode=stock"],
                         env=env, capture_output=True, text=True, timeout=180)  # the file's max_lag: 1 stays
    assert out.returncode != 0 and "asp.max_lag" in out.stderr and "asp.mode=stock trains at lag 0" in out.stderr
