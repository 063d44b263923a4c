"""Apply ASP's MindSpeed-RL patches in every Ray worker process.

Ray workers are fresh processes that import MindSpeed-RL's classes by reference, so patches applied in the
launcher never reach them. MindSpeed-RL's `cli/train_grpo.py` calls `ray.init(runtime_env=<YAML at
rl_config.runtime_env_path>)`; the project's `runtime_env.yaml` names `apply_all` as Ray's
`worker_process_setup_hook`, which runs in each worker before it executes any task or actor.

Ray runs the hook before it puts the driver's directories (its cwd, the MindSpeed-RL root) on `sys.path`;
they arrive only with the first task. On a node whose `ray start` environment has no PYTHONPATH to
MindSpeed-RL the hook could not import it, so `apply_all` first prepends `MINDSPEED_RL_SRC` (exported by the
launcher before `ray start`, inherited by every worker) to `sys.path`.

The hook never imports `mindspeed_llm`: importing it parses the worker's argv and patches Megatron at once
(MindSpeed-LLM's adaptor). Megatron is patched later, inside `initialize_megatron`, as MindSpeed-RL intends.
Group `liveness` wraps the call of `initialize_megatron` in every Megatron worker and refuses to train when
anything (MindSpeed's repatch flow included) reverted an ASP patch there.

Every target module is imported at hook time, in every Ray process (TransferDock, rule rewards and the
rollout pool included), on purpose. Deferring the patches until a process first imports MindSpeed-RL would
save little: `mindspeed_rl/__init__.py` imports the whole framework (workers, vLLM engine, torch_npu), so the
first import of any submodule pays the full cost anyway, and every MindSpeed-RL actor or task imports it to
unpickle its class or function. It would move the failure of a pin check or a missing target from the hook
(the worker exits with "Failed to execute the setup hook") into whatever import happens first, e.g. halfway
through Ray unpickling an actor class, and a deferred patch could miss `from x import f` copies made while
the package imports itself. The price is start-up time and resident memory of ASP-only processes.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from mindspeed_asp.errors import ConfigError

RUNTIME_ENV_FILE = Path(__file__).with_name("runtime_env.yaml")
PATCH_GROUPS_ENV = "ASP_PATCHES"  # comma list of groups to apply (default: all)
MSRL_SRC_ENV = "MINDSPEED_RL_SRC"  # MindSpeed-RL's root (with mindspeed/, megatron/, mindspeed_llm/ copied in)
LIVENESS_TARGET = "mindspeed_rl.workers.base_worker.BaseWorker.setup_distributed_rank"
_STATE: Dict[str, Any] = {"applied": False, "targets": [], "installed": {}}
log = logging.getLogger("mindspeed_asp.setup_hook")


def _say(msg: str, *args: Any) -> None:
    """One INFO line that reaches a Ray worker's log even when nothing configured logging there."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s - %(levelname)s - %(message)s"))
        log.addHandler(handler)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    log.info(msg, *args)


def ensure_mindspeed_rl_path() -> Optional[str]:
    """Prepend `MINDSPEED_RL_SRC` to sys.path (when set and not there yet); ConfigError when MindSpeed-RL still
    does not import. Returns the directory added, or None."""
    added = None
    raw = os.environ.get(MSRL_SRC_ENV, "").strip()
    if raw:
        src = str(Path(raw).expanduser().resolve())
        if src not in {str(Path(p).resolve()) if p else p for p in sys.path}:
            sys.path.insert(0, src)
            importlib.invalidate_caches()
            added = src
    if "mindspeed_rl" in sys.modules:
        return added
    try:
        found = importlib.util.find_spec("mindspeed_rl") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        where = (f"{MSRL_SRC_ENV}={raw} holds no mindspeed_rl/ package" if raw else f"{MSRL_SRC_ENV} is not set")
        raise ConfigError(f"mindspeed_rl is not importable in this Ray worker (pid {os.getpid()}): {where}, and "
                          "PYTHONPATH does not reach it either. Export MINDSPEED_RL_SRC (or PYTHONPATH) to the "
                          "MindSpeed-RL checkout before `ray start` on every node", key=MSRL_SRC_ENV)
    return added


def installed_patches() -> Dict[str, Any]:
    """target -> the object ASP installed there, in this process (what the liveness check compares)."""
    if _STATE["applied"]:
        return dict(_STATE["installed"])
    from mindspeed_asp.integrations.mindspeed_rl.patch_registry import get_patch_manager
    reg = get_patch_manager()
    return {t: p.applied for t, p in reg.patches_info.items() if p.applied is not None}


def setup_distributed_rank_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Check, right after `initialize_megatron` returns in a Megatron worker, that ASP's patches are live.

    `BaseWorker.setup_distributed_rank` is MindSpeed-RL's only call of `self.initialize_func(config=...)`
    (`initialize_megatron`, which runs MindSpeed-LLM's adaptor and MindSpeed's patch manager) for the actor,
    reference, reward, critic and ViT workers; the wrapper runs the check between that call and the rest of
    the method.
    """
    def setup_distributed_rank(self):
        init = getattr(self, "initialize_func", None)
        if not callable(init):
            return orig(self)

        def initialize_func(*args, **kwargs):
            out = init(*args, **kwargs)
            from mindspeed_asp.integrations.mindspeed_rl.patch_registry import check_patches_live
            n = check_patches_live(installed_patches(), "initialize_megatron")
            _say("mindspeed-asp: %d patches live after initialize_megatron (pid %d)", n, os.getpid())
            return out

        self.initialize_func = initialize_func
        try:
            return orig(self)
        finally:
            self.initialize_func = init
    setup_distributed_rank.__wrapped__ = orig  # type: ignore[attr-defined]
    return setup_distributed_rank


LIVENESS_PATCHES = [(LIVENESS_TARGET, setup_distributed_rank_wrapper)]


def patch_groups() -> dict:
    """name -> [(target, patch)] (imports stay light: the patch modules import MindSpeed-RL lazily)."""
    from mindspeed_asp.integrations.mindspeed_rl.async_trainer import TRAINER_PATCHES
    from mindspeed_asp.integrations.mindspeed_rl.data_patches import (
        DATA_PATCHES, DOCK_PATCHES, REWARD_PATCHES, ROW_PATCHES)
    from mindspeed_asp.integrations.mindspeed_rl.loss_patch import LOSS_PATCHES
    from mindspeed_asp.integrations.mindspeed_rl.resume_state import CHECKPOINT_PATCHES
    return {"data": DATA_PATCHES, "dock": DOCK_PATCHES, "rows": ROW_PATCHES, "trainer": TRAINER_PATCHES,
            "loss": LOSS_PATCHES, "reward": REWARD_PATCHES, "checkpoint": CHECKPOINT_PATCHES,
            "liveness": LIVENESS_PATCHES}


def selected_patches(groups: Optional[Iterable[str]] = None) -> List[Tuple[str, Any]]:
    all_groups = patch_groups()
    if groups is None:
        raw = os.environ.get(PATCH_GROUPS_ENV, "")
        groups = [g.strip() for g in raw.split(",") if g.strip()] or list(all_groups)
    out: List[Tuple[str, Any]] = []
    for g in groups:
        if g not in all_groups:
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
    """Ray's worker_process_setup_hook: put MindSpeed-RL on sys.path, check its pin, register and apply ASP's
    patches (once) in ASP's own registry, and record what each target now holds (the liveness check's
    reference)."""
    if _STATE["applied"]:
        return list(_STATE["targets"])
    ensure_mindspeed_rl_path()
    if check_pin:
        from mindspeed_asp.integrations.mindspeed_rl.pins import check_mindspeed_rl_commit
        check_mindspeed_rl_commit()
    from mindspeed_asp.integrations.mindspeed_rl.patch_registry import current_value, get_patch_manager
    if manager is None:
        manager = get_patch_manager()
    targets = register(manager, selected_patches(groups))
    manager.apply_patches()
    installed = {t: current_value(t) for t in targets}
    _STATE.update(applied=True, targets=targets, installed=installed)
    _say("mindspeed-asp: applied %d MindSpeed-RL patches in pid %d", len(targets), os.getpid())
    return targets


def runtime_env_path() -> str:
    """Absolute path of the runtime_env.yaml to pass as `rl_config.runtime_env_path`."""
    return str(RUNTIME_ENV_FILE.resolve())


if __name__ == "__main__":  # `python -m ...setup_hook` prints the path for shell scripts
    print(runtime_env_path())
