"""What a local Ray exposes: Ray 2.60 cannot bind its servers to loopback, so a run that switches Ray's token
authentication off is warned (docs/runtime.md, "Network exposure")."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from mindspeed_asp.runtime.ray_utils import exposure_warning


@pytest.mark.parametrize("value,warned", [(None, False), ("token", False), ("disabled", True), (" Disabled ", True)])
def test_switching_token_auth_off_is_warned(value, warned):
    env = {} if value is None else {"RAY_AUTH_MODE": value}
    msg = exposure_warning(env)
    assert (msg is not None) == warned
    if warned:
        assert "RAY_AUTH_MODE=disabled" in msg and "every interface" in msg


def test_a_local_ray_started_without_auth_warns():
    """A real local Ray (the runtime's own start) with RAY_AUTH_MODE=disabled prints the warning on stderr and
    starts; the node address Ray registers is printed for the record (Ray 2.60 registers the host's address even
    when asked for 127.0.0.1, which is why the warning exists)."""
    pytest.importorskip("ray")
    code = ("import ray; from mindspeed_asp.runtime.ray_utils import start_local_ray, stop_local_ray; "
            "start_local_ray(num_cpus=1, object_store_mb=128); "
            "print('NODES', sorted({n['NodeManagerAddress'] for n in ray.nodes()})); stop_local_ray()")
    ray_tmp = tempfile.mkdtemp(prefix="asp-ray-", dir="/tmp")  # short: Ray's socket paths are at most 107 bytes
    try:
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": ray_tmp}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "NODES [" in out.stdout
    assert "asp: warning: RAY_AUTH_MODE=disabled" in out.stderr
