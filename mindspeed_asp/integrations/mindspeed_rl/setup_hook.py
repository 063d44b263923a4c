"""Apply ASP's MindSpeed-RL patches in every Ray worker process.

Ray workers are fresh processes that import MindSpeed-RL's classes by reference, so patches applied in the
launcher never reach them. MindSpeed-RL's `cli/train_grpo.py` calls `ray.init(runtime_env=<YAML at
rl_config.runtime_env_path>)`; the project's `runtime_env.yaml` names `apply_all` as Ray's
`worker_process_setup_hook`, which runs in each worker before it executes any task or actor.

The hook never imports `mindspeed_llm`: importing it parses the worker's argv and patches Megatron at once
(MindSpeed-LLM's adaptor). Megatron is patched later, inside `initialize_megatron`, as MindSpeed-RL intends.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Iterable, List, Optional, Tuple

RUNTIME_ENV_FILE = Path(__file__).with_name("runtime_env.yaml")
PATCH_GROUPS_ENV = "ASP_PATCHES"  # comma list of groups to apply (default: all)
_STATE = {"applied": False, "targets": []}
log = logging.getLogger("mindspeed_asp.setup_hook")


def patch_groups() -> dict:
    """name -> [(target, patch)] (imports stay light: the patch modules import MindSpeed-RL lazily)."""
    from mindspeed_asp.integrations.mindspeed_rl.async_trainer import TRAINER_PATCHES
    from mindspeed_asp.integrations.mindspeed_rl.data_patches import (
        DATA_PATCHES, DOCK_PATCHES, REWARD_PATCHES, ROW_PATCHES)
    from mindspeed_asp.integrations.mindspeed_rl.loss_patch import LOSS_PATCHES
    from mindspeed_asp.integrations.mindspeed_rl.resume_state import CHECKPOINT_PATCHES
    return {"data": DATA_PATCHES, "dock": DOCK_PATCHES, "rows": ROW_PATCHES, "trainer": TRAINER_PATCHES,
            "loss": LOSS_PATCHES, "reward": REWARD_PATCHES, "checkpoint": CHECKPOINT_PATCHES}


def selected_patches(groups: Optional[Iterable[str]] = None) -> List[Tuple[str, Any]]:
    all_groups = patch_groups()
    if groups is None:
        raw = os.environ.get(PATCH_GROUPS_ENV, "")
        groups = [g.strip() for g in raw.split(",") if g.strip()] or list(all_groups)
    out: List[Tuple[str, Any]] = []
    for g in groups:
        if g not in all_groups:
            from mindspeed_asp.errors import ConfigError
            raise ConfigError(f"unknown patch group {g!r}; one of {sorted(all_groups)}", key=PATCH_GROUPS_ENV)
        out.extend(all_groups[g])
    return out


def register(manager: Any, patches: Iterable[Tuple[str, Any]]) -> List[str]:
    """Register (target, fn) pairs; targets that add a new method are created (create_dummy)."""
    targets = []
    for target, fn in patches:
        adds_method = target.rsplit(".", 1)[-1].startswith("asp_")
        manager.register_patch(target, fn, create_dummy=adds_method)
        targets.append(target)
    return targets


def apply_all(manager: Any = None, groups: Optional[Iterable[str]] = None, check_pin: bool = True) -> List[str]:
    """Ray's worker_process_setup_hook: check the MindSpeed-RL pin, register and apply ASP's patches (once)."""
    if _STATE["applied"]:
        return list(_STATE["targets"])
    if check_pin:
        from mindspeed_asp.integrations.mindspeed_rl.pins import check_mindspeed_rl_commit
        check_mindspeed_rl_commit()
    if manager is None:
        from mindspeed_asp.integrations.mindspeed_rl.patch_registry import get_patch_manager
        manager = get_patch_manager()
    targets = register(manager, selected_patches(groups))
    manager.apply_patches()
    _STATE.update(applied=True, targets=targets)
    log.info("mindspeed-asp: applied %d MindSpeed-RL patches in pid %d", len(targets), os.getpid())
    return targets


def runtime_env_path() -> str:
    """Absolute path of the runtime_env.yaml to pass as `rl_config.runtime_env_path`."""
    return str(RUNTIME_ENV_FILE.resolve())


if __name__ == "__main__":  # `python -m ...setup_hook` prints the path for shell scripts
    print(runtime_env_path())
