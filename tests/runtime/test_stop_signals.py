"""A stop signal while Ray starts: recorded inside the shield, honoured once Ray is whole, never a crash."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from mindspeed_asp.runtime.stop_signals import RunInterrupted, StopSignals


def test_a_signal_inside_the_shield_is_raised_when_the_block_ends():
    stop = StopSignals(announce=False)
    stop.install()
    reached_end = False
    try:
        with pytest.raises(RunInterrupted) as exc:
            with stop.shielded():
                signal.raise_signal(signal.SIGTERM)
                assert stop.requested == signal.SIGTERM  # recorded, not raised: the block goes on
                reached_end = True
        assert reached_end and exc.value.signum == signal.SIGTERM
    finally:
        stop.restore()


def test_the_shield_keeps_rays_sigterm_handler_out_and_puts_ours_back():
    pytest.importorskip("ray", reason="needs the runtime extra: pip install mindspeed-asp[runtime]")
    import ray._private.utils as ray_utils

    original = ray_utils.set_sigterm_handler
    stop = StopSignals(announce=False)
    stop.install()
    try:
        with stop.shielded():
            ray_utils.set_sigterm_handler(lambda *_: sys.exit(15))  # what ray.init does first
            assert signal.getsignal(signal.SIGTERM) == stop._handle
            signal.signal(signal.SIGINT, signal.default_int_handler)  # anything else the block replaces
        assert signal.getsignal(signal.SIGINT) == stop._handle
        assert ray_utils.set_sigterm_handler is original
    finally:
        stop.restore()


def test_no_signal_no_exception_and_an_armed_run_keeps_its_safe_point():
    stop = StopSignals(announce=False)
    stop.install()
    try:
        with stop.shielded():
            pass
        stop.arm()
        with stop.shielded():
            signal.raise_signal(signal.SIGINT)
        assert stop.requested == signal.SIGINT and not stop.aborted  # the loop stops after its update
    finally:
        stop.restore()


STARTER = textwrap.dedent("""
    import os, signal, sys, threading, time
    from mindspeed_asp.runtime.ray_utils import start_local_ray_shielded
    from mindspeed_asp.runtime.stop_signals import RunInterrupted, exit_status
    sig, delay = getattr(signal, sys.argv[1]), float(sys.argv[2])
    threading.Timer(delay, lambda: os.kill(os.getpid(), sig)).start()
    try:  # as `asp train` and `asp demo` start their local Ray
        start_local_ray_shielded(num_cpus=2, object_store_mb=128)
        print("STARTED BEFORE THE SIGNAL", flush=True)
    except RunInterrupted as exc:
        print("INTERRUPTED", flush=True)
        sys.exit(exit_status(exc.signum))
    """)


@pytest.mark.slow
@pytest.mark.parametrize("sig,delay", [("SIGINT", 0.3), ("SIGTERM", 0.3), ("SIGTERM", 1.0)])
def test_a_signal_while_ray_starts_stops_the_run_cleanly(tmp_path, sig, delay):
    """Ctrl-C or SIGTERM in the first second of a run (while `ray.init` starts Ray's processes): the exit status
    is the signal's (130/143), no segfault or abort, and no Ray process of this run is left."""
    pytest.importorskip("ray", reason="needs the runtime extra: pip install mindspeed-asp[runtime]")
    ray_tmp = tempfile.mkdtemp(prefix="asp-sig-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_TMPDIR=ray_tmp, RAY_USAGE_STATS_ENABLED="0")
    out = subprocess.run([sys.executable, "-c", STARTER, sig, str(delay)], capture_output=True, text=True,
                         timeout=180, env=env, cwd=str(tmp_path))
    text = out.stdout + out.stderr
    assert out.returncode == 128 + getattr(signal, sig), f"exit {out.returncode}:\n{text[-3000:]}"
    assert "INTERRUPTED" in out.stdout
    assert "Fatal Python error" not in text and "Segmentation fault" not in text and "Traceback" not in text
    left = subprocess.run(["pgrep", "-f", ray_tmp], capture_output=True, text=True).stdout.split()
    assert not left, f"Ray processes of this run still alive: {left}"
    assert Path(ray_tmp).is_dir()


def test_a_stop_requested_by_the_run_waits_for_the_safe_point_and_says_why():
    import threading

    stop = StopSignals(announce=False)
    stop.arm()
    t = threading.Thread(target=stop.request_stop, args=("Ray's GCS (pid 7) exited with code -9",))
    t.start()
    t.join()
    assert stop.requested == signal.SIGTERM and stop.reason.startswith("Ray's GCS") and not stop.aborted
    stop.request_stop("a second reason")  # the first one stands
    assert stop.reason.startswith("Ray's GCS")
