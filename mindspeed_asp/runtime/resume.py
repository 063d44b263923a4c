"""The config of a resumed run: the checkpoint's own, with only the overrides that keep the run's meaning.

Why: a checkpoint's queue, counters and plan were made under its mode, max_lag, minibatch, instances, data and
seeds; continuing under others would train a run that is neither the old one nor a new one (and the lag
audit would judge old groups by a new bound). So `asp train --resume DIR key=value` accepts only keys that
say how long to run, where Ray is, and how to report (`RESUMABLE_KEYS`); `run.steps` may grow to extend a
run, and any other change is refused naming the key, the old and the new value.
"""
from __future__ import annotations

import copy
from typing import Any, Dict, Iterator, List, Optional, Tuple

from mindspeed_asp.errors import ConfigError
from mindspeed_asp.runtime.run_config import RunConfig, config_from_dict, dump_config

#: Keys a resume may change: how long, where and how the run reports, never what it trains or how it schedules.
RESUMABLE_KEYS = ("run.steps", "run.checkpoint_every", "run.plots", "run.target_reward", "run.start_timeout_s",
                  "run.step_timeout_s", "run.stall_timeout_s", "run.sync_timeout_s",
                  "run.verify_weights", "run.ray_address", "run.ray_num_cpus",
                  "run.ray_object_store_mb", "model.path")


def _flatten(data: Dict[str, Any], prefix: str = "") -> Iterator[Tuple[str, Any]]:
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _flatten(v, key + ".")
        else:
            yield key, v


def changed_keys(old: Dict[str, Any], new: Dict[str, Any]) -> List[Tuple[str, Any, Any]]:
    """(key, old value, new value) for every dotted key whose value differs between two dumped configs."""
    a, b = dict(_flatten(old)), dict(_flatten(new))
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def resume_config(saved: Dict[str, Any], run_dir: str, version: int, overrides: List[str],
                  where: str, devices: Optional[int] = None) -> RunConfig:
    """The run's config from its checkpoint (`saved`, a dumped RunConfig; `where` names the file) with
    `overrides` applied and checked; `run.out` becomes `run_dir`. Refuses a change to a key outside
    RESUMABLE_KEYS, and a `run.steps` the checkpoint (at update `version`) has already reached."""
    base = copy.deepcopy(saved)
    base.setdefault("run", {})["out"] = str(run_dir)
    asp = base.get("asp")
    if isinstance(asp, dict) and asp.get("mode") == "stock" and asp.get("max_lag", 0) != 0:
        # written when a stock run's config could carry another max_lag (its driver trained at 0, and its
        # checkpointed lag policy says 0): resumed under what it ran with
        asp["max_lag"] = 0
    cfg = config_from_dict(base, path=where, overrides=overrides, devices=devices)
    saved_keys, defaults = dict(_flatten(base)), dict(_flatten(dump_config(RunConfig())))
    for key, old, new in changed_keys(base, dump_config(cfg)):
        if key not in saved_keys and new == defaults.get(key):
            continue  # a key added since the checkpoint was written (e.g. trainer.devices), at its default
        if key not in RESUMABLE_KEYS:
            raise ConfigError(f"--resume continues the run under its own config; {key} cannot change "
                              f"({old!r} -> {new!r}). A resume may change only {', '.join(RESUMABLE_KEYS)}",
                              path=where, key=key)
    if cfg.run.steps <= int(version):
        raise ConfigError(f"the checkpoint is at update {version} of run.steps={cfg.run.steps}: nothing left to "
                          f"run; pass run.steps=N with N > {version} to extend the run", path=where, key="run.steps")
    return cfg
