"""MindSpeed-RL's trainer launched as a cluster launches it (tier `msrl_e2e`).

The shipped `configs/qwen25_7b_A3_asp.yaml`, unmodified, goes through the launcher's own `asp_launch` on two
real Ray nodes on 127.0.0.1, each started by its own `bash` in its own process group, with no PYTHONPATH but
the one the launcher exports:
- the launch line carries the CPU's size overrides (one list with reasons: cpu_sizes.py) and a test override of
  an `asp.*` key; the launcher composes them with Hydra for MindSpeed-RL and ASP alike;
- node 0 starts the Ray head, builds the plan, then waits for the second node, which is started only once the
  head says it is waiting (a node that joins late);
- the second node's engines take 20 s longer to build (a slow engine start): the run must wait for them;
- the trainer is MindSpeed-RL's `cli/train_grpo.py` behind the CPU stand-ins, which reach the Ray workers as
  `py_modules` of the runtime environment, the way a cluster ships code to workers (cpu_train_grpo.py).
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict

import pytest

from launcher_nodes import free_port as _free_port
from launcher_nodes import stop_launcher as _stop
from mindspeed_asp.integrations.mindspeed_rl.first_run_report import FAIL, Bounds, check_engines
from mindspeed_asp.integrations.mindspeed_rl.log_reader import read_iterations

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
COMMON = ROOT / "shell" / "msrl_common.sh"
ENTRY = HERE / "cpu_train_grpo.py"
CONFIG = "qwen25_7b_A3_asp"
ITERS = 3
SLOW_ENGINE_S = 20
pytestmark = [pytest.mark.msrl_e2e, pytest.mark.slow]

PREP = r"""
import json, sys
from pathlib import Path
import cpu_standins; cpu_standins.install()
import cpu_sizes, fixtures
from mindspeed_asp.integrations.mindspeed_rl.launch_config import write_composed
from mindspeed_asp.integrations.mindspeed_rl.export_prompts import main as export
work, source, msrl, iters = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
model = fixtures.make_model(work)
data = fixtures.make_dataset(work, model, count=(iters + 4) * 2)
ovr = cpu_sizes.overrides(tokenizer=model, data=data, work=str(work),
                          extra=(f"++asp.audit_path={work / 'asp_audit.jsonl'}",))
composed = write_composed(source, msrl, ovr, work / "prep")
rc = export(["--config", str(composed), "-o", str(work / "prompts.jsonl"), "--train-iters", str(iters)])
print("PREP " + json.dumps({"overrides": ovr, "rc": rc}), flush=True)
"""


def _env(work: Path, ray_tmp: str, msrl: Path, rank: int, port: int, **extra: str) -> Dict[str, str]:
    """A node's launch environment: what a cluster user exports, nothing from this test process's paths."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "ASP_", "PYTEST_", "VLLM_")) and k not in ("PYTHONPATH", "MINDSPEED_RL_SRC")}
    env.update(MINDSPEED_RL_ROOT=str(msrl), RUN_DIR=str(work / f"node{rank}"), NODE_RANK=str(rank),
               MASTER_ADDR="127.0.0.1", NODE_IP="127.0.0.1", RAY_PORT=str(port), TRAIN_ITERS=str(ITERS),
               ASP_PYTHON=sys.executable, ASP_MINDSPEED_RL_COMMIT="05a90d7", ASP_PROMPTS=str(work / "prompts.jsonl"),
               ASP_JOIN_TIMEOUT="600", ASCEND_TOOLKIT_HOME=str(work / "no-toolkit"), RAY_USAGE_STATS_ENABLED="0",
               RAY_OVERRIDE_RESOURCES=json.dumps({"CPU": 16}), RAY_TMPDIR=ray_tmp, PYTHONDONTWRITEBYTECODE="1",
               ASP_STANDIN_NPUS_PER_NODE="2", OMP_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND="nobind",
               VLLM_CPU_KVCACHE_SPACE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_LOGGING_LEVEL="WARNING",
               TOKENIZERS_PARALLELISM="false", **extra)
    return env


def _launch(line: str, env: Dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(["bash", "-c", f"source {shlex.quote(str(COMMON))}; {line}"], env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for(path: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if path.is_file() and text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(1)
    raise AssertionError(f"{path.name} never said {text!r}:\n" + path.read_text(errors="replace")[-4000:])


def _worker_output(ray_tmp: str, dest: Path) -> Path:
    """Every Ray worker's own output files, both nodes' (complete; the driver's forwarded copy can lose the last
    lines), copied to `dest`."""
    logs = [d for d in sorted(Path(ray_tmp).glob("ray/session_*/logs")) if not d.parent.is_symlink()]
    files = [f for d in logs for f in sorted(d.glob("worker-*.out")) + sorted(d.glob("worker-*.err"))]
    dest.write_text("".join(f.read_text(errors="replace") for f in files))
    return dest


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory: Any) -> Dict[str, Any]:
    msrl = Path(os.environ["MINDSPEED_RL_SRC"]).resolve()
    work = tmp_path_factory.mktemp("cluster_launch")
    prep_env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(msrl), str(HERE)]))  # the test's own set-up
    prep = subprocess.run([sys.executable, "-c", PREP, str(work), str(ROOT / "configs" / f"{CONFIG}.yaml"),
                           str(msrl), str(ITERS)], env=prep_env, capture_output=True, text=True, timeout=600,
                          cwd=str(work))
    assert prep.returncode == 0, prep.stdout[-3000:] + prep.stderr[-5000:]
    info = json.loads(next(x for x in prep.stdout.splitlines() if x.startswith("PREP "))[5:])
    assert info["rc"] == 0
    line = " ".join(shlex.quote(a) for a in ["asp_launch", CONFIG, "2", "2", str(ENTRY), *info["overrides"]])
    ray_tmp = tempfile.mkdtemp(prefix="asp-cl-", dir="/tmp")  # short (AF_UNIX paths), and never /tmp/ray
    port = _free_port()
    logs = {0: work / "node0.log", 1: work / "node1.log"}
    t0 = time.time()
    head = _launch(line, _env(work, ray_tmp, msrl, 0, port), logs[0])
    node1 = None
    try:
        _wait_for(logs[0], "Ray nodes alive: 1 / 2", head, timeout=300)  # planned, and waiting for node 1
        late_by = time.time() - t0
        node1 = _launch(line, _env(work, ray_tmp, msrl, 1, port, ASP_STANDIN_ENGINE_START_DELAY_S=str(SLOW_ENGINE_S)),
                        logs[1])
        head.wait(timeout=900)
        took = time.time() - t0
    finally:
        _stop(head)
        if node1 is not None:
            _stop(node1)
    text = {r: p.read_text(errors="replace") for r, p in logs.items()}
    assert head.returncode == 0, text[0][-6000:] + "\n--- node 1:\n" + text[1][-3000:]
    return {"work": work, "logs": text, "workers": _worker_output(ray_tmp, work / "worker_output.log"),
            "late_by": late_by, "took": took,
            "train_log": (work / "node0" / "train.log").read_text(errors="replace"),
            "audit": [json.loads(x) for x in (work / "asp_audit.jsonl").read_text().splitlines()]}


@pytest.mark.timeout(1500)
def test_the_shipped_config_trains_through_the_launcher_on_two_nodes(cluster_run):
    its = read_iterations(cluster_run["workers"])
    assert len(its) == ITERS, cluster_run["train_log"][-4000:]
    # the launch-line override of an asp: key reached ASP's processes (its audit is where the override says)
    assert len(cluster_run["audit"]) >= ITERS
    assert max(lag for r in cluster_run["audit"] for lag in r["lags"]) <= 1, cluster_run["audit"][:2]  # shipped max_lag
    assert {i for r in cluster_run["audit"] for i in r["instances"]} == {0, 1}  # both instances served
    composed = (cluster_run["work"] / "node0" / "config" / f"{CONFIG}.yaml").read_text()
    assert "objective: decoupled" in composed and "max_lag: 1" in composed  # the shipped values, kept
    tier_env = (cluster_run["work"] / "node0" / "config" / "runtime_env_cpu_tier.yaml").read_text()
    assert "py_modules" in tier_env and "mindspeed_asp.integrations.mindspeed_rl.setup_hook" not in tier_env


@pytest.mark.timeout(1500)
def test_the_head_waits_for_a_late_node_and_for_its_slow_engines(cluster_run):
    head, node1 = cluster_run["logs"][0], cluster_run["logs"][1]
    assert head.index("Ray nodes alive: 1 / 2") < head.index("Ray nodes alive: 2 / 2") < head.index("training:")
    assert "Ray node up (joined 127.0.0.1:" in node1
    engines = check_engines(cluster_run["train_log"], Bounds(trainer_ranks=1))
    assert engines.status != FAIL, engines
    took = float(engines.value.split(" in ")[1].split(" s")[0])
    assert took >= SLOW_ENGINE_S, f"the slow node's engines were not waited for: {engines.value}"
