"""Two Ray nodes started by the launcher's own shell functions, as a cluster starts them: real `ray start
--head` and `ray start --address` processes on 127.0.0.1, each node in its own process group, with no
PYTHONPATH but the one the launcher exports. The worker node is started first and waits for a head that comes
up late; node 0 waits for both nodes; a task placed on the worker node (the only one with NPUs) finds
MindSpeed-RL on its path and the composed config in its environment (the setup hook and ASP's processes need
both, and Ray runs the hook before it adds the driver's paths). A node whose head never comes up stops within
ASP_JOIN_TIMEOUT with an error naming the head."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="needs the runtime extra: pip install mindspeed-asp[runtime]")
pytest.importorskip("hydra", reason="needs hydra-core (MindSpeed-RL's config system)")

from launcher_nodes import free_port as _free_port  # noqa: E402
from launcher_nodes import stop_launcher as _stop  # noqa: E402
from vendor_paths import mindspeed_rl_src, missing_reason  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
COMMON = ROOT / "shell" / "msrl_common.sh"
MSRL = mindspeed_rl_src()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(MSRL is None, reason=missing_reason())]

PROBE = r"""
import importlib.util, json, os, ray
ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR")

@ray.remote(resources={"NPU": 1}, num_cpus=0)
def probe():
    spec = importlib.util.find_spec("mindspeed_rl")
    return {"node": ray.get_runtime_context().get_node_id(), "msrl": spec.origin if spec else None,
            "config": os.environ.get("ASP_MSRL_CONFIG"), "pythonpath": os.environ.get("PYTHONPATH", "")}

npu_nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("NPU", 0) > 0]
print("PROBE " + json.dumps({"task": ray.get(probe.remote(), timeout=120), "npu_nodes": npu_nodes,
                             "alive": sum(n["Alive"] for n in ray.nodes())}), flush=True)
"""


_RAY_TMP = tempfile.mkdtemp(prefix="asp-2n-", dir="/tmp")  # short (AF_UNIX paths); not /tmp/ray: a later bare
# ray.init() elsewhere in the suite must not find these clusters as "the one running on this machine"


def _env(tmp_path: Path, rank: int, port: int, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "ASP_", "PYTEST_")) and k not in ("PYTHONPATH", "MINDSPEED_RL_SRC")}
    env.update(MINDSPEED_RL_ROOT=str(MSRL), RUN_DIR=str(tmp_path / f"node{rank}"), NODE_RANK=str(rank),
               MASTER_ADDR="127.0.0.1", NODE_IP="127.0.0.1", RAY_PORT=str(port), NNODES="2",
               ASP_PYTHON=sys.executable, ASP_MINDSPEED_RL_COMMIT="05a90d7", PYTHONDONTWRITEBYTECODE="1",
               ASCEND_TOOLKIT_HOME=str(tmp_path / "no-toolkit"), RAY_USAGE_STATS_ENABLED="0",
               RAY_OVERRIDE_RESOURCES=json.dumps({"CPU": 4}), RAY_TMPDIR=_RAY_TMP, **extra)
    return env


def _start(script: str, env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(["bash", "-c", f"source {COMMON}; {script}"], env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.timeout(600)
def test_a_late_head_a_joining_node_and_the_launchers_environment_on_it(tmp_path):
    port = _free_port()
    worker = _start('asp_prepare qwen25_7b_A3_asp rl_config.n_samples_per_prompt=4; asp_start_ray 2; '
                    'echo "[test] joined"; wait "$RAY_PID"', _env(tmp_path, 1, port), tmp_path / "node1.log")
    head = None
    try:
        time.sleep(8)  # the worker node is up first and must wait for the head, not give up
        assert worker.poll() is None, (tmp_path / "node1.log").read_text()[-3000:]
        probe = tmp_path / "probe.py"
        probe.write_text(PROBE)
        head = _start(f'asp_prepare qwen25_7b_A3_asp rl_config.n_samples_per_prompt=4; asp_start_ray 0; '
                      f'asp_wait_nodes 2; "$PY" {probe}', _env(tmp_path, 0, port), tmp_path / "node0.log")
        head.wait(timeout=420)
        text = (tmp_path / "node0.log").read_text()
        assert head.returncode == 0, text[-4000:] + "\n--- node 1:\n" + (tmp_path / "node1.log").read_text()[-3000:]
        res = json.loads(next(x for x in text.splitlines() if x.startswith("PROBE "))[6:])
        assert res["alive"] == 2 and len(res["npu_nodes"]) == 1
        task = res["task"]
        assert task["node"] == res["npu_nodes"][0], "the NPU task did not run on the joining node"
        assert task["msrl"] and task["msrl"].startswith(str(MSRL)), task  # the launcher's PYTHONPATH reached it
        assert task["pythonpath"].split(os.pathsep)[0] == str(MSRL)
        composed = tmp_path / "node1" / "config" / "qwen25_7b_A3_asp.yaml"
        assert task["config"] == str(composed) and "n_samples_per_prompt: 4" in composed.read_text()
        node1 = (tmp_path / "node1.log").read_text()
        assert "[test] joined" in node1 and "Ray node up (joined 127.0.0.1:" in node1
    finally:
        if head is not None:
            _stop(head)
        _stop(worker)


@pytest.mark.timeout(300)
def test_a_node_whose_head_never_comes_up_stops_within_the_join_timeout(tmp_path):
    t0 = time.time()
    out = subprocess.run(["bash", "-c", f"source {COMMON}; asp_prepare qwen25_7b_A3_asp; asp_start_ray 2"],
                         env=_env(tmp_path, 1, _free_port(), ASP_JOIN_TIMEOUT="6"), capture_output=True, text=True,
                         timeout=240)
    assert out.returncode != 0 and time.time() - t0 < 120
    assert "did not come up within 6 s (ASP_JOIN_TIMEOUT)" in out.stderr and "MASTER_ADDR" in out.stderr
