"""What a local Ray exposes: its node address is loopback and, while Ray cannot bind its servers to loopback,
a run that switches Ray's token authentication off is warned (docs/runtime.md, "Network exposure")."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mindspeed_asp.runtime.ray_utils import exposure_warning


@pytest.mark.parametrize("value,warned", [(None, False), ("token", False), ("disabled", True), (" Disabled ", True)])
def test_switching_token_auth_off_is_warned(value, warned):
    env = {} if value is None else {"RAY_AUTH_MODE": value}
    msg = exposure_warning(env)
    assert (msg is not None) == warned
    if warned:
        assert "RAY_AUTH_MODE=disabled" in msg and "every interface" in msg


def test_a_local_ray_runs_on_loopback_and_warns_without_auth(tmp_path):
    """A real local Ray (the runtime's own start): its node is 127.0.0.1; with RAY_AUTH_MODE=disabled the start
    prints the warning on stderr."""
    pytest.importorskip("ray")
    code = ("import ray; from mindspeed_asp.runtime.ray_utils import start_local_ray, stop_local_ray; "
            "start_local_ray(num_cpus=1, object_store_mb=64); "
            "print('NODES', sorted({n['NodeManagerAddress'] for n in ray.nodes()})); stop_local_ray()")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "NODES ['127.0.0.1']" in out.stdout
    assert "asp: warning: RAY_AUTH_MODE=disabled" in out.stderr
