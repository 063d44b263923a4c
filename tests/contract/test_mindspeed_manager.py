"""ASP's patches next to MindSpeed's own MindSpeedPatchesManager (MindSpeed @ ac9f0e74, the vendored
`patch_utils.py`) on MindSpeed-RL's real transfer dock and GRPO actor loss. Runs in subprocesses: MindSpeed's
patch table is class-global.

ASP keeps its patches in its own registry. MindSpeed's repatch flow (`remove_patches()` then
`apply_patches()`) restores the original of every target *its* table holds, so ASP's patches held there
(the design before) came back as stock `compute_loss`, silently; held by ASP they survive, and a MindSpeed
wrapper registered later on the same target still stacks on top of ASP's.

Only these two targets are applied: MindSpeed's `apply_patch` calls `hasattr` on every module in
`sys.modules`, and on this CPU machine transformers' lazy submodules (pulled in by MindSpeed-RL's dataloader)
raise ModuleNotFoundError for torchvision on attribute access. Ascend nodes have torchvision 0.22.1 installed
(MindSpeed-RL requirements)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PUT = "mindspeed_rl.trainer.utils.transfer_dock.put_prompts_experience"
LOSS = "mindspeed_rl.models.loss.grpo_actor_loss_func.GRPOActorLossFunc.compute_loss"

PRELUDE = r"""
import json, sys
sys.path.insert(0, {here!r}); sys.path.insert(0, {ms!r})
import msrl_shim; msrl_shim.install()
from mindspeed.patch_utils import MindSpeedPatchesManager as pm
from mindspeed_asp.errors import RunError
from mindspeed_asp.integrations.mindspeed_rl.patch_registry import (
    check_patches_live, current_value, get_patch_manager, reverted_targets)
from mindspeed_asp.integrations.mindspeed_rl.setup_hook import register
from mindspeed_asp.integrations.mindspeed_rl.data_patches import DATA_PATCHES
from mindspeed_asp.integrations.mindspeed_rl.loss_patch import LOSS_PATCHES
from mindspeed_rl.trainer.utils import transfer_dock
from mindspeed_rl.models.loss.grpo_actor_loss_func import GRPOActorLossFunc
PUT, LOSS = {put!r}, {loss!r}
PATCHES = [p for p in DATA_PATCHES + LOSS_PATCHES if p[0] in (PUT, LOSS)]
orig_put, orig_loss = transfer_dock.put_prompts_experience, GRPOActorLossFunc.compute_loss

def feature_wrapper(fn):                                     # a MindSpeed feature registering later
    def inner(*a, **k):
        return fn(*a, **k)
    inner.__wrapped_by_feature__ = True
    return inner
"""

ASP_REGISTRY = PRELUDE + r"""
copy_holder = type(sys)("asp_copy_holder"); copy_holder.put_prompts_experience = orig_put
sys.modules["asp_copy_holder"] = copy_holder                  # a `from x import f` copy made before applying
mgr = get_patch_manager()
targets = register(mgr, PATCHES)
mgr.apply_patches()
installed = {{t: current_value(t) for t in targets}}
copy_rebound = copy_holder.put_prompts_experience is transfer_dock.put_prompts_experience
for t in (PUT, LOSS):
    pm.register_patch(t, feature_wrapper)
pm.apply_patches()
stacked = [getattr(transfer_dock.put_prompts_experience, "__wrapped_by_feature__", False),
           getattr(GRPOActorLossFunc.compute_loss, "__wrapped_by_feature__", False)]
live_with_feature = reverted_targets(installed)
copy_follows_feature = copy_holder.put_prompts_experience is transfer_dock.put_prompts_experience
pm.remove_patches(); pm.apply_patches()                      # MindSpeed's repatch flow
print(json.dumps({{
    "manager_is_mindspeeds": mgr is pm,
    "mindspeed_table": sorted(pm.patches_info),
    "patched": [installed[PUT].__wrapped__ is orig_put, installed[LOSS].__wrapped__ is orig_loss],
    "copy_rebound": copy_rebound, "copy_follows_feature": copy_follows_feature,
    "stacked": stacked, "live_with_feature": live_with_feature,
    "after_repatch_is_asps": [transfer_dock.put_prompts_experience is installed[PUT],
                              GRPOActorLossFunc.compute_loss is installed[LOSS]],
    "copy_after_repatch_is_asps": copy_holder.put_prompts_experience is installed[PUT],
    "live_after_repatch": check_patches_live(installed, "MindSpeed's repatch"),
    "mindspeed_llm_imported": "mindspeed_llm" in sys.modules,
}}))
"""

MINDSPEED_TABLE = PRELUDE + r"""
targets = register(pm, PATCHES)                              # the design before: ASP's patches in MindSpeed's table
pm.apply_patches()
installed = {{t: current_value(t) for t in targets}}
pm.remove_patches(); pm.apply_patches()
try:
    check_patches_live(installed, "initialize_megatron")
    error = None
except RunError as exc:
    error = str(exc)
print(json.dumps({{"reverted": sorted(reverted_targets(installed)), "error": error,
                   "stock_again": [transfer_dock.put_prompts_experience is orig_put,
                                   GRPOActorLossFunc.compute_loss is orig_loss]}}))
"""


def _run(script: str, msrl_src: Path) -> dict:
    ms = os.environ.get("MINDSPEED_SRC")
    if not ms or not (Path(ms) / "mindspeed" / "patch_utils.py").is_file():
        pytest.skip("MINDSPEED_SRC not set: point it at a directory holding MindSpeed's mindspeed/ (ac9f0e74)")
    env = dict(os.environ, MINDSPEED_RL_SRC=str(msrl_src))
    code = script.format(here=str(HERE), ms=ms, put=PUT, loss=LOSS)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_asp_patches_survive_mindspeeds_repatch_and_still_compose(msrl_src):
    res = _run(ASP_REGISTRY, msrl_src)
    assert not res["manager_is_mindspeeds"]
    assert res["mindspeed_table"] == sorted([PUT, LOSS])  # MindSpeed's table holds only its own feature
    assert res["patched"] == [True, True] and res["copy_rebound"]
    # MindSpeed's later wrapper stacks on top of ASP's: its Patch takes the attribute's current value, ASP's
    # wrapper, as the original; the liveness check accepts a wrapper that calls through to ASP's.
    assert res["stacked"] == [True, True] and res["copy_follows_feature"]
    assert res["live_with_feature"] == {}
    # remove_patches() + apply_patches() puts back what MindSpeed took as the original: ASP's wrapper.
    assert res["after_repatch_is_asps"] == [True, True] and res["copy_after_repatch_is_asps"]
    assert res["live_after_repatch"] == 2
    assert not res["mindspeed_llm_imported"]


def test_patches_held_in_mindspeeds_table_revert_and_the_liveness_check_names_them(msrl_src):
    """Why ASP's patches stay out of MindSpeed's table: its repatch flow reverts them to stock."""
    res = _run(MINDSPEED_TABLE, msrl_src)
    assert res["stock_again"] == [True, True]
    assert res["reverted"] == sorted([PUT, LOSS])
    assert "2 of 2 patches were reverted after initialize_megatron" in res["error"]
    assert PUT in res["error"] and LOSS in res["error"] and "refusing to train" in res["error"]
