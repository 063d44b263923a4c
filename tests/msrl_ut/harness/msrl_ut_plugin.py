"""pytest plugin (`-p msrl_ut_plugin`) for one run of MindSpeed-RL's own `tests/ut` on a CPU.

Loaded as a plugin, not as a conftest: pytest imports `-p` plugins before any conftest (MindSpeed-RL's
`tests/conftest.py` included) and before any test module, so the stand-ins and ASP's patches are in place before
MindSpeed-RL is first imported, as on a cluster where the worker hook runs first.

What it adds to the run, and why:
- one local Ray head per run, started before the tests and stopped after them (`MSRL_UT_SHARED_RAY=1`): the UT
  calls `ray.init()` several times (class and function fixtures with `ray.shutdown()` around them); with
  `RAY_ADDRESS` set, each call connects to this head instead of starting and tearing down a whole cluster.
  Every call is still a new Ray job, so actors never outlive the fixture that made them, as in the UT's design.
  The head has 64 logical CPUs: TransferDock / TransferQueue actors ask `num_cpus=10` and stay alive across
  tests of a class, so the CPU count of a small machine leaves one unschedulable and a test hangs.
- Ray workers get `msrl_ut_hook.worker_setup` as `worker_process_setup_hook` through the driver's job config
  (what `ray job submit --runtime-env` injects), so every worker runs the same set-up as this process.
- every test starts from `random`/`numpy`/`torch` seeded with 0, so the runs of the three configurations draw
  the same random data and their outcomes can be compared test by test.
- the outcome of every test id (and every collection error) is written as JSON to `MSRL_UT_RESULTS`.
"""
from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional

import pytest

import msrl_ut_hook

msrl_ut_hook.setup("driver")  # before MindSpeed-RL's conftest and test modules are imported

RESULTS_ENV = "MSRL_UT_RESULTS"
SHARED_RAY_ENV = "MSRL_UT_SHARED_RAY"
RAY_CPUS = 64
HEAD_START_S = 180.0
_RUN: Dict[str, Any] = {"results": {}, "head": None, "t0": time.time()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_head() -> subprocess.Popen:
    """`ray start --head --block` as a child: it stops its own processes (and only them) on SIGTERM, unlike
    `ray stop`, which would stop every Ray on the machine. Ports are picked free so that the three runs and
    other users' Ray instances on the machine never collide."""
    temp_dir = os.environ["RAY_TMPDIR"]
    port = _free_port()
    cmd = [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", "--disable-usage-stats",
           f"--port={port}", f"--num-cpus={RAY_CPUS}", "--num-gpus=0", "--include-dashboard=false",
           f"--ray-client-server-port={_free_port()}", f"--dashboard-agent-listen-port={_free_port()}",
           "--min-worker-port=0", "--max-worker-port=0", f"--temp-dir={temp_dir}",
           f"--object-store-memory={256 * 1024 * 1024}"]
    log = open(Path(os.environ.get(RESULTS_ENV, temp_dir)).with_name("ray_head.log"), "w", encoding="utf-8")
    address_file = Path(temp_dir) / "ray_current_cluster"  # written once the head node is up
    head = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + HEAD_START_S
    while not address_file.is_file():
        if head.poll() is not None or time.time() > deadline:
            head.kill()
            raise RuntimeError(f"ray head did not start (rc {head.poll()}); see {log.name}")
        time.sleep(0.5)
    os.environ["RAY_ADDRESS"] = f"127.0.0.1:{port}"
    return head


def _stop_head(head: Optional[subprocess.Popen]) -> None:
    if head is None or head.poll() is not None:
        return
    head.terminate()
    try:
        head.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, 9)  # the head's own session (start_new_session): its processes only
        head.wait(timeout=30)


def pytest_configure(config: Any) -> None:
    os.environ["RAY_JOB_CONFIG_JSON_ENV_VAR"] = json.dumps(
        {"runtime_env": {"worker_process_setup_hook": "msrl_ut_hook.worker_setup"}})
    if os.environ.get(SHARED_RAY_ENV, "1") == "1":
        _RUN["head"] = _start_head()


def pytest_unconfigure(config: Any) -> None:
    try:
        import ray
        if ray.is_initialized():
            ray.shutdown()
    finally:
        _stop_head(_RUN["head"])


@pytest.fixture(autouse=True)
def _msrl_ut_seed() -> None:
    """Same random draws in every configuration (the UT samples indexes and tensors without a seed)."""
    import numpy as np
    import torch
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def _tail(report: Any, lines: int = 12) -> str:
    text = getattr(report, "longreprtext", "") or ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def pytest_runtest_logreport(report: Any) -> None:
    """Fold setup/call/teardown into one outcome per test id: the first failing phase decides."""
    rec = _RUN["results"].setdefault(report.nodeid, {"outcome": "passed", "tail": "", "duration": 0.0})
    rec["duration"] = round(rec["duration"] + float(report.duration), 3)
    if rec["outcome"] not in ("passed",):
        return
    if report.failed:
        rec["outcome"] = "failed" if report.when == "call" else "error"
        rec["tail"] = _tail(report)
    elif report.skipped:
        rec["outcome"] = "xfailed" if hasattr(report, "wasxfail") else "skipped"
        rec["tail"] = _tail(report, 2)


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _RUN["results"][report.nodeid] = {"outcome": "collect-error", "tail": _tail(report), "duration": 0.0}


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    msrl_ut_hook.write_marker("driver-end")  # was mindspeed_asp imported at all during the run?
    path = os.environ.get(RESULTS_ENV)
    if path:
        Path(path).write_text(json.dumps({"tests": _RUN["results"], "collected": session.testscollected,
                                          "exitstatus": int(exitstatus), "wall_s": time.time() - _RUN["t0"]},
                                         indent=1), encoding="utf-8")
