"""What the standalone runtime's checkpoint holds, and how a fresh driver takes it back.

One state.json per checkpoint (written by `runtime/checkpoint.py`): the version, the mode and config, the
driver's own records (`driver`: the window cursor, per-group records, sync rounds, trained gids, memory peak,
engine steps of the earlier parts, resumes), the rollout control's sections (`policy`, `dispatcher`, `queue`),
the recorder's, the planner's and the RNG states. A restore puts every part into the freshly built
components before any instance starts; the groups that were generating are generated again, everything else
goes on. Nothing in the run directory is written while restoring (the run's files are cut back only once the
run is known to proceed).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Protocol

import numpy as np

from mindspeed_asp.errors import InputError, RunError
from mindspeed_asp.runtime.run_config import RunConfig, dump_config

if TYPE_CHECKING:
    from mindspeed_asp.runtime.platform import Platform
    from mindspeed_asp.runtime.replan import WindowPlanner
    from mindspeed_asp.runtime.rollout_control import RolloutControl
    from mindspeed_asp.runtime.rollout_pool import RolloutPool
    from mindspeed_asp.runtime.run_recorder import GroupSpan, RunRecorder
    from mindspeed_asp.runtime.stop_signals import StopSignals
    from mindspeed_asp.runtime.trainer import GRPOTrainer
    from mindspeed_asp.runtime.window_feed import WindowFeed


class CheckpointedDriver(Protocol):
    """What a checkpoint saves and restores of the standalone driver (`runtime/driver.py::Driver` is one):
    its parts, and the records of its own it keeps between updates. Named here so this module does not
    import the driver that calls it."""

    cfg: RunConfig
    mode: str
    version: int
    feed: "WindowFeed"
    control: "RolloutControl"
    recorder: "RunRecorder"
    planner: Optional["WindowPlanner"]
    pool: "RolloutPool"
    trainer: "GRPOTrainer"
    platform: "Platform"
    stop: "StopSignals"
    resume_dir: Optional[Path]
    checkpoint_dir: Optional[Path]
    steals_logged: int
    sync_rounds: List[Dict[str, Any]]
    peak_rss: float
    resumes: List[Dict[str, Any]]
    decode_steps_before: Dict[int, int]
    spans: Dict[int, "GroupSpan"]
    restored_rng: Optional[Dict[str, Any]]


def build_state(d: CheckpointedDriver) -> Dict[str, Any]:
    """The whole state of a run at a safe point (between two updates)."""
    from mindspeed_asp.runtime.checkpoint import rng_state

    return {
        "version": d.version, "mode": d.mode, "config": dump_config(d.cfg),
        "driver": {**d.feed.state_dict(), "steals_logged": d.steals_logged, "sync_rounds": d.sync_rounds,
                   "trained_gids": list(d.control.trained), "peak_rss": d.peak_rss,
                   "decode_steps": decode_steps_total(d), "resumes": d.resumes},
        **d.control.state_dict(), "recorder": d.recorder.state_dict(),
        "planner": None if d.planner is None else d.planner.state_dict(), "rng": rng_state(),
    }


def restore_state(d: CheckpointedDriver, state: Dict[str, Any]) -> List[int]:
    """Put a checkpoint's state into the driver's fresh feed, rollout control and recorder (the planner's,
    which cuts the rollout log back, once the run proceeds). Returns the gids generated again."""
    from mindspeed_asp.runtime.checkpoint import STATE_FILE, check_rng_state, check_rollout_log, restoring

    where = d.resume_dir / STATE_FILE
    if state["mode"] != d.mode:
        raise RunError(f"checkpoint in {d.resume_dir} is a {state['mode']} run, this one {d.mode}")
    with restoring(where, "driver"):
        s = state["driver"]
        d.version = int(state["version"])
        d.feed.load_state_dict(s)
        d.steals_logged = int(s["steals_logged"])
        d.sync_rounds = list(s["sync_rounds"])
        trained = [int(g) for g in s["trained_gids"]]
        d.peak_rss = float(s["peak_rss"])
        d.decode_steps_before = {int(j): int(n) for j, n in s["decode_steps"].items()}
        d.resumes = list(s["resumes"])
    regenerate = d.control.load_state_dict(state, trained, section=lambda name: restoring(where, name))
    with restoring(where, "recorder"):
        d.recorder.load_state_dict(state["recorder"], defer_files=True)  # metrics.jsonl: open_steps
        d.spans = {g.gid: g for g in d.recorder.groups}  # the latest span of each group
    if d.planner is not None:
        if not isinstance(state["planner"], dict):
            raise InputError("an asp run's checkpoint needs a planner section", path=str(where), key="planner")
        check_rollout_log(d.planner.rollout_log, state["planner"], where)
    with restoring(where, "rng"):
        check_rng_state(state["rng"])
    d.restored_rng = state["rng"]
    kept = d.control.queue.occupancy()
    d.resumes.append({"from_version": d.version, "regenerate": len(regenerate), "kept": kept,
                      "checkpoint": d.resume_dir.name})
    d.recorder.event("resumed", version=d.version, regenerate=regenerate, kept=kept)
    return regenerate


def resume_weights(d: CheckpointedDriver) -> None:
    """The trainer takes the checkpoint's weights, optimizer and RNG; the instances, started from the model
    path, get the same weights under the checkpoint's version before the first dispatch."""
    from mindspeed_asp.runtime.checkpoint import trainer_file

    path = trainer_file(d.resume_dir)
    try:
        d.trainer.load_checkpoint(path)
    except (RuntimeError, ValueError, KeyError, EOFError) as exc:  # torch's unpickling and shape refusals
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RunError(f"checkpoint {path}: cannot restore the trainer ({first})") from exc
    if d.trainer.version != d.version:
        raise RunError(f"checkpoint {d.resume_dir}: trainer at version {d.trainer.version}, run state "
                       f"at {d.version}")
    sync = d.pool.sync(d.version, d.trainer.named_weights, verify=d.cfg.run.verify_weights)
    d.recorder.event("resume_sync", version=d.version, seconds=round(float(sync.get("seconds", 0.0)), 3),
                     verified=bool(sync.get("verified", False)))


def summary_fields(d: CheckpointedDriver) -> Dict[str, Any]:
    """What summary.json adds to the recorder's metrics: the config, the sync rounds, what was trained and
    dispatched, memory, each window's plan, and how the run ended (a run stopped by SIGINT/SIGTERM before
    run.steps is partial, resumable from its checkpoint)."""
    sync_s = [r["seconds"] for r in d.sync_rounds]
    disp = d.control.dispatcher
    return {
        "config": dump_config(d.cfg), "platform": d.platform.kind,
        "weight_sync/rounds": len(d.sync_rounds),
        "weight_sync/verified_all": all(r["verified"] for r in d.sync_rounds),
        "weight_sync/mean_s": float(np.mean(sync_s)) if sync_s else 0.0,
        "versions": [r["version"] for r in d.sync_rounds],
        "trained_groups": len(d.control.trained), "trained_unique": len(set(d.control.trained)),
        "steals": len(disp.steals), "redispatched": disp.redispatched,
        "instances_alive": len(d.pool.live()), "instance_nodes": list(d.pool.nodes),
        "memory/peak_rss_gib": d.peak_rss,
        "plan/windows": d.feed.loaded_plans,  # asp: what each window was planned with, its queues and tags
        **d.control.queue.counters(),
        "interrupted": d.version < d.cfg.run.steps, "stop_signal": d.stop.requested_name,
        "stop_reason": d.stop.reason, "steps_planned": d.cfg.run.steps, "resumes": d.resumes,
        "checkpoint": None if d.checkpoint_dir is None else {"dir": str(d.checkpoint_dir), "version": d.version},
    }


def decode_steps_total(d: CheckpointedDriver) -> Dict[int, int]:
    """Engine steps per instance over the whole run (earlier parts included); {} when not all known."""
    now = d.pool.decode_steps()
    if len(now) != d.pool.count or (d.resumes and not d.decode_steps_before):
        return {}
    return {j: d.decode_steps_before.get(j, 0) + n for j, n in now.items()}
