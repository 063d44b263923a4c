"""Shared by the tests that start Ray nodes with the launcher's shell functions: a free port, a launcher line in
its own process group, and stopping it the way a user's Ctrl-C on that node would."""
from __future__ import annotations

import os
import signal
import socket
import subprocess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_launcher(proc: subprocess.Popen) -> None:
    """SIGTERM to the launcher's process group (its trap stops exactly its own `ray start`), SIGKILL after 60 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
