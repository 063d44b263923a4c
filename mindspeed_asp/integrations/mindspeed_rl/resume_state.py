"""ASP's part of a MindSpeed-RL checkpoint: written beside Megatron's whenever MindSpeed-RL saves, read on resume.

Why a file of our own: Megatron's checkpoint holds the weights, the optimizer, `iteration` and
`consumed_train_samples` (from which `cli/train_grpo.py` skips that many batches of the loader), but nothing of
the asynchronous trainer. Without ASP's state a resumed run would restart the rollout pool at version 0, lose
the groups that had finished but were not trained yet, and generate again (and train twice) the windows the
old run had already fed ahead of its updates.

`<save>/asp_state/iter_XXXXXXX.json` (Megatron's iteration naming) is written atomically right after
`RayGRPOTrainer.save_checkpoint` returns, so it exists only beside a completed Megatron checkpoint; a resumed
run reads the file of the iteration Megatron loaded. It holds:

- the policy version (the instances restart from the checkpointed weights under that version),
- the plan cursor: how many loader batches (plan windows) were fed and the next group id,
- the groups already trained (ids only), the finished but untrained groups (results with their behaviour
  log-probs and the version each counts under: they are trained after the restart, not generated again),
  and the groups still generating or queued (requests: only these are generated again),
- the rollout driver's counters (queue and lag policy), so the logged counters continue.

The MindSpeed-RL path has no length history to keep: it plans once per run (docs/ascend.md, section 5).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from mindspeed_asp.errors import ConfigError, InputError
from mindspeed_asp.runtime.requests import GroupRequest, GroupResult, SampleResult

STATE_DIR = "asp_state"
FORMAT = "mindspeed-asp/msrl-state"
FORMAT_VERSION = 1
#: Settings a resumed run must share with the saved one (the state would mean something else otherwise).
MATCHED = ("mode", "max_lag", "instances", "gbs", "n")


def state_path(directory: str | Path, iteration: int) -> Path:
    """Where the state of `iteration` lives under a Megatron save/load directory."""
    return Path(directory) / STATE_DIR / f"iter_{int(iteration):07d}.json"


# ------------------------------------------------------------------------ values <-> JSON
def encode_value(value: Any) -> Any:
    """A dataset column value (a tensor, a number, a string) as JSON; tensors keep dtype and shape."""
    if hasattr(value, "tolist") and hasattr(value, "dtype") and hasattr(value, "shape"):
        return {"tensor": value.tolist(), "dtype": str(value.dtype).replace("torch.", ""),
                "shape": list(value.shape)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot keep a dataset value of type {type(value).__name__} in ASP's checkpoint state")


def decode_value(value: Any) -> Any:
    if isinstance(value, dict) and "tensor" in value:
        import torch
        return torch.tensor(value["tensor"], dtype=getattr(torch, value["dtype"])).reshape(value["shape"])
    return value


def request_to_json(req: GroupRequest) -> Dict[str, Any]:
    return dataclasses.asdict(req)


def request_from_json(data: Dict[str, Any]) -> GroupRequest:
    return GroupRequest(**data)


def result_to_json(res: GroupResult) -> Dict[str, Any]:
    return dataclasses.asdict(res)


def result_from_json(data: Dict[str, Any]) -> GroupResult:
    fields = dict(data)
    fields["samples"] = [SampleResult(**s) for s in data["samples"]]
    return GroupResult(**fields)


# ------------------------------------------------------------------------ the file
def build_state(iteration: int, settings: Dict[str, Any], driver: Dict[str, Any], *, version: int,
                windows_fed: int, next_gid: int, extra: Dict[int, Dict[str, Any]],
                plan_path: Optional[str]) -> Dict[str, Any]:
    """The JSON state of an asynchronous run after `iteration` updates.

    `driver` is `LockstepRollout.snapshot()`; `extra[gid]` the dataset's additional keys of each group still to
    train (what `put_groups` writes into the TransferDock beside the generated rows).
    """
    def ext(gid: int) -> Dict[str, Any]:
        return {k: encode_value(v) for k, v in extra.get(gid, {}).items()}

    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "iteration": int(iteration),
        "policy_version": int(version), **{k: settings[k] for k in MATCHED},
        "plan": {"path": plan_path, "windows_fed": int(windows_fed), "next_gid": int(next_gid)},
        "trained_gids": [int(g) for g in driver["trained_gids"]],
        "ready": [{"request": request_to_json(req), "result": result_to_json(res), "version": int(v),
                   "extra": ext(int(req.group_id))} for req, res, v in driver["ready"]],
        "unfinished": [{"request": request_to_json(req), "instance": int(j), "extra": ext(int(req.group_id))}
                       for req, j in driver["unfinished"]],
        "isolated": [int(g) for g in driver.get("isolated", [])],  # unfinished gids the plan isolated
        "counters": dict(driver["counters"]),
        # the lag policy's and dispatcher's own state: a restart re-dispatches as the standalone runtime does
        "dispatch": driver.get("dispatch"),
    }


def colocated_state(iteration: int, settings: Dict[str, Any], windows_fed: int,
                    plan_path: Optional[str]) -> Dict[str, Any]:
    """The state of a plan-ordered run on MindSpeed-RL's own engines (max_lag 0): the plan cursor only."""
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "iteration": int(iteration),
            "policy_version": int(iteration), **{k: settings[k] for k in MATCHED},
            "plan": {"path": plan_path, "windows_fed": int(windows_fed)}}


def write_state(directory: str | Path, state: Dict[str, Any]) -> Path:
    """Write `state` atomically (temporary file + rename) as the state of its iteration."""
    from mindspeed_asp.utils.atomic import write_json
    return write_json(state_path(directory, state["iteration"]), state, key="actor_config.save")


def read_state(directory: str | Path, iteration: int, settings: Dict[str, Any]) -> Dict[str, Any]:
    """The state saved with `iteration` under `directory`, checked against the run's `settings`."""
    from mindspeed_asp.utils.textfile import read_text
    path = state_path(directory, iteration)
    if not path.is_file():
        raise InputError(f"MindSpeed-RL resumes from iteration {iteration}, but ASP's state of that iteration is "
                         "missing (written beside every checkpoint saved with ASP installed); resuming without it "
                         "would train groups twice", path=str(path))
    try:
        state = json.loads(read_text(path))
    except ValueError as exc:
        raise InputError(f"not valid JSON: {exc}", path=str(path)) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise InputError(f"not an ASP checkpoint state (format {FORMAT!r} expected)", path=str(path))
    if state.get("format_version") != FORMAT_VERSION:
        raise InputError(f"state format version {state.get('format_version')} is not {FORMAT_VERSION}", path=str(path))
    if state.get("iteration") != int(iteration):
        raise InputError(f"holds iteration {state.get('iteration')}, not {iteration}", path=str(path))
    for key in MATCHED:
        if state.get(key) != settings[key]:
            name = {"gbs": "megatron_training.global_batch_size", "n": "rl_config.n_samples_per_prompt"}.get(
                key, f"asp.{key}")
            raise ConfigError(f"the checkpoint was saved with {key}={state.get(key)!r}, the run has "
                              f"{settings[key]!r}; resume with the saved value", path=str(path), key=name)
    return state


def ready_groups(state: Dict[str, Any]) -> List[Any]:
    """(request, result, version, extra) of every finished, untrained group of a state."""
    return [(request_from_json(r["request"]), result_from_json(r["result"]), int(r["version"]),
             {k: decode_value(v) for k, v in r["extra"].items()}) for r in state["ready"]]


def unfinished_groups(state: Dict[str, Any]) -> List[Any]:
    """(request, instance, extra) of every group that was queued or generating when the state was saved."""
    return [(request_from_json(r["request"]), int(r["instance"]), {k: decode_value(v) for k, v in r["extra"].items()})
            for r in state["unfinished"]]


# ------------------------------------------------------------------------ the patch
STATE_HOOK = "asp_checkpoint_state"  # trainer attribute: callable(iteration) -> state dict, set by asp_fit


def save_checkpoint_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    """After MindSpeed-RL's own save has returned (every rank wrote), write ASP's state of that iteration."""
    def save_checkpoint(self, iteration):
        out = orig(self, iteration)
        hook = getattr(self, STATE_HOOK, None)
        save_dir = getattr(self.actor_worker.megatron_config, "save", None)
        if hook is not None and save_dir:
            write_state(save_dir, hook(int(iteration)))
        return out
    save_checkpoint.__wrapped__ = orig  # type: ignore[attr-defined]
    return save_checkpoint


CHECKPOINT_PATCHES = [
    ("mindspeed_rl.trainer.grpo_trainer_hybrid.RayGRPOTrainer.save_checkpoint", save_checkpoint_wrapper),
]


# ------------------------------------------------------------------------ relaunch: resume or refuse
#: the Megatron keys that decide whether a relaunch resumes (iteration, optimizer, RNG) or starts afresh
RESUME_OVERRIDES = ("++actor_config.finetune=false", "++actor_config.no_load_optim=false",
                    "++actor_config.no_load_rng=false")  # ++: set whether or not the config names the key


def latest_iteration(directory: str | Path) -> Optional[int]:
    """The iteration Megatron's `latest_checkpointed_iteration.txt` under `directory` names; None when the
    file is absent or says `release` (a converted starting checkpoint, no training state)."""
    marker = Path(directory) / "latest_checkpointed_iteration.txt"
    try:
        text = marker.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def resumable_iteration(directory: Optional[str | Path]) -> Optional[int]:
    """The latest iteration under `directory` that ASP saved its state beside (a run ASP can continue)."""
    if not directory:
        return None
    it = latest_iteration(directory)
    return it if it is not None and it > 0 and state_path(directory, it).is_file() else None


def check_resume_settings(load: Optional[str], finetune: bool, no_load_optim: bool, ignore_saved_state: bool,
                          path: str) -> Optional[int]:
    """Refuse a start that would silently ignore ASP's saved state: `load` holds a checkpoint of iteration N
    with ASP's state, but `finetune` (Megatron then restarts at iteration 0: plan window 0, version 0, the LR
    schedule from scratch, trained windows trained again) or `no_load_optim` (Adam's moments reset) would
    discard it. Returns N (None: nothing to resume). `asp.ignore_saved_state: true` starts afresh on purpose."""
    it = resumable_iteration(load)
    if it is None or ignore_saved_state:
        return it
    how = ("relaunch through a shell/ launcher (it sets these when the save directory holds ASP's state), or set "
           "asp.ignore_saved_state: true to start afresh from these weights on purpose")
    if finetune:
        raise ConfigError(f"actor_config.load {load} holds iteration {it} with ASP's state, but finetune: true "
                          f"restarts at iteration 0 (plan window 0, policy version 0, the LR schedule anew, trained "
                          f"windows trained again): set actor_config.finetune: false to resume, or {how}",
                          path=path, key="actor_config.finetune")
    if no_load_optim:
        raise ConfigError(f"actor_config.load {load} holds iteration {it} with ASP's state, but no_load_optim: true "
                          f"resets Adam's moments on resume: set actor_config.no_load_optim: false, or {how}",
                          path=path, key="actor_config.no_load_optim")
    return it
