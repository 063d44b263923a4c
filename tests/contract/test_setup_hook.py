"""Ray runs `worker_process_setup_hook` before it puts the driver's directories on `sys.path`: on a node whose
`ray start` had no PYTHONPATH to MindSpeed-RL the hook must find it through `MINDSPEED_RL_SRC` (exported by
the launcher before `ray start`), or fail with one error that says what to set.

Each case runs in a fresh interpreter whose `sys.path` does not reach MindSpeed-RL, as such a worker's does.
The NPU stack is replaced by the CPU tier's stand-ins (tests/msrl_e2e/cpu_standins.py), installed first as the
tier's own hook does."""
import json
import os
import subprocess
import sys
from pathlib import Path

E2E = Path(__file__).resolve().parents[1] / "msrl_e2e"

HOOK = r"""
import json, os, sys
assert not any((os.path.isdir(os.path.join(p or ".", "mindspeed_rl"))) for p in sys.path), sys.path
import cpu_standins
cpu_standins.install()                       # stand-ins only: they do not put MindSpeed-RL on the path
from mindspeed_asp.integrations.mindspeed_rl.setup_hook import apply_all, LIVENESS_TARGET
targets = apply_all()
import mindspeed_rl
print(json.dumps({"targets": targets, "liveness": LIVENESS_TARGET,
                  "msrl_file": mindspeed_rl.__file__, "on_path": os.environ["MINDSPEED_RL_SRC"] in sys.path}))
"""

NO_MSRL = r"""
from mindspeed_asp.integrations.mindspeed_rl.setup_hook import apply_all
try:
    apply_all(check_pin=False)
except Exception as exc:
    print(type(exc).__name__ + ": " + str(exc))
"""


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "MINDSPEED_RL_SRC", "ASP_MSRL_CONFIG", "ASP_PATCHES", "MINDSPEED_SRC")}
    env.update(extra)
    return env


def test_hook_finds_mindspeed_rl_through_mindspeed_rl_src(msrl_src, tmp_path):
    env = _clean_env(PYTHONPATH=str(E2E), MINDSPEED_RL_SRC=str(msrl_src))
    out = subprocess.run([sys.executable, "-c", HOOK], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["on_path"] and res["msrl_file"].startswith(str(msrl_src))
    assert res["liveness"] in res["targets"] and len(res["targets"]) >= 13
    assert f"mindspeed-asp: applied {len(res['targets'])} MindSpeed-RL patches" in out.stderr


def test_hook_without_mindspeed_rl_names_what_to_set(tmp_path):
    empty = tmp_path / "not_msrl"
    empty.mkdir()
    for extra in ({"MINDSPEED_RL_SRC": str(empty)}, {}):
        out = subprocess.run([sys.executable, "-c", NO_MSRL], cwd=tmp_path, env=_clean_env(**extra),
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        msg = out.stdout.strip().splitlines()[-1]
        assert msg.startswith("ConfigError: key 'MINDSPEED_RL_SRC': mindspeed_rl is not importable"), msg
        assert "PYTHONPATH" in msg and "before `ray start`" in msg
        assert (str(empty) in msg) if extra else ("MINDSPEED_RL_SRC is not set" in msg)
