"""ASP's patches registered with MindSpeed's own MindSpeedPatchesManager (MindSpeed @ ac9f0e74, env
MINDSPEED_SRC = a directory holding its `mindspeed/` package) against MindSpeed-RL's real transfer dock.
Runs in a subprocess: the manager's patch table is class-global.

Only the transfer-dock patch is applied here: MindSpeed's `apply_patches` calls `hasattr` on every module in
`sys.modules`, and on this CPU machine transformers' lazy submodules (pulled in by MindSpeed-RL's dataloader)
raise ModuleNotFoundError for torchvision on attribute access. Ascend nodes have torchvision 0.22.1 installed
(MindSpeed-RL requirements), so the full set applies there; ASP's own registry tolerates such modules."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

SCRIPT = r"""
import json, sys
sys.path.insert(0, {here!r}); sys.path.insert(0, {ms!r})
import msrl_shim; msrl_shim.install()
from mindspeed.patch_utils import MindSpeedPatchesManager as pm
from mindspeed_asp.integrations.mindspeed_rl.patch_registry import get_patch_manager
from mindspeed_asp.integrations.mindspeed_rl.setup_hook import register
from mindspeed_asp.integrations.mindspeed_rl.data_patches import DATA_PATCHES
from mindspeed_rl.trainer.utils import transfer_dock
orig_put = transfer_dock.put_prompts_experience
copy_holder = type(sys)("asp_copy_holder"); copy_holder.put_prompts_experience = orig_put
sys.modules["asp_copy_holder"] = copy_holder                  # a `from x import f` copy made before applying
mgr = get_patch_manager()
targets = register(mgr, [p for p in DATA_PATCHES if p[0].endswith("put_prompts_experience")])
mgr.apply_patches()
after = transfer_dock.put_prompts_experience
copy_rebound = copy_holder.put_prompts_experience is after

def feature_wrapper(fn):                                     # a MindSpeed feature registering later
    def inner(*a, **k):
        return fn(*a, **k)
    inner.__wrapped_by_feature__ = True
    return inner
pm.register_patch("mindspeed_rl.trainer.utils.transfer_dock.put_prompts_experience", feature_wrapper)
pm.apply_patches()
print(json.dumps({{
    "manager": mgr is pm,
    "targets": targets,
    "patched": getattr(after, "__wrapped__", None) is orig_put,
    "copy_rebound": copy_rebound,
    "copy_follows_feature": copy_holder.put_prompts_experience is transfer_dock.put_prompts_experience,
    "stacked": getattr(transfer_dock.put_prompts_experience, "__wrapped_by_feature__", False),
    "mindspeed_llm_imported": "mindspeed_llm" in sys.modules,
}}))
"""


def test_patches_go_through_mindspeed_manager(msrl_src):
    ms = os.environ.get("MINDSPEED_SRC")
    if not ms or not (Path(ms) / "mindspeed" / "patch_utils.py").is_file():
        pytest.skip("MINDSPEED_SRC not set: point it at a directory holding MindSpeed's mindspeed/ (ac9f0e74)")
    env = dict(os.environ, MINDSPEED_RL_SRC=str(msrl_src))
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(here=str(HERE), ms=ms)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["manager"] and res["patched"] and res["copy_rebound"]
    assert res["copy_follows_feature"]
    assert res["stacked"]  # MindSpeed's later wrapper stacks on top of ASP's (re-applied from the same table)
    assert not res["mindspeed_llm_imported"]
    assert "mindspeed_rl.trainer.utils.transfer_dock.put_prompts_experience" in res["targets"]
