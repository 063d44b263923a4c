"""`asp train` as a child process for the fault-injection tests, and the check that none of its processes is
left: several runtime test files start, kill and resume the same run this way.

A run is told apart by an environment tag (`RUN_TAG`) that the driver and everything it starts (Ray's GCS,
raylet, agents, workers, the vLLM instances) inherit. psutil is imported inside the functions, so a core-only
install (no psutil) still imports this module when it collects the test files.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, List

if TYPE_CHECKING:
    import psutil

RUN_TAG = "ASP_RESUME_TEST_TAG"


def tagged_processes(tag: str) -> List[psutil.Process]:
    """Processes of this user carrying the run's environment tag: the run's driver and everything it started
    (Ray's processes and workers inherit the driver's environment)."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "uids"]):
        try:
            if p.info["uids"] and p.info["uids"].real == os.getuid() and p.environ().get(RUN_TAG) == tag:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def assert_nothing_left(tag: str) -> None:
    """Fail naming every process of the tagged run still alive 30 s after its driver ended, and kill them so the
    next test does not inherit them (Ray's processes exit a moment after the driver)."""
    import psutil

    deadline = time.time() + 30
    left = tagged_processes(tag)
    while left and time.time() < deadline:
        time.sleep(1)
        left = tagged_processes(tag)
    described = []
    for p in left:
        try:
            described.append(f"{p.pid} {' '.join(p.cmdline())[:100]}")
            p.kill()  # started by this test's run: do not leave it to the next test
        except psutil.Error:
            pass
    assert not described, "processes of the run left behind:\n" + "\n".join(described)


def asp_process(args: List[str], cwd: Path, tag: str, log: Path) -> subprocess.Popen:
    """`python -m mindspeed_asp ARGS` tagged with `tag`, stdout and stderr to LOG.out / LOG.err; RAY_ADDRESS is
    dropped so the run starts its own Ray rather than joining one this test process may hold."""
    env = dict(os.environ, **{RUN_TAG: tag})
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen([sys.executable, "-m", "mindspeed_asp", *args], cwd=cwd, env=env,
                            stdout=open(log.with_suffix(".out"), "w"), stderr=open(log.with_suffix(".err"), "w"))


def read_lines(path: Path) -> List[dict]:
    """The records of a JSON-lines file a running run appends to; none while the file does not exist yet."""
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
