"""A run's checkpoint on disk: written atomically, found again by `asp train --resume DIR`.

Layout under the run directory:

    checkpoint/latest.json          {"dir": "ckpt-000004-2", "version": 4, ...}, replaced atomically
    checkpoint/ckpt-000004-2/       state.json (driver, dispatcher, queue, policy, recorder, history, RNG,
                                    config) and trainer.pt (model, optimizer, reference model, torch RNG)

A checkpoint directory is written under a temporary name and renamed when complete; only then does
`latest.json` point at it (`os.replace`), and older ones are removed. An interrupt or a crash at any moment
leaves `latest.json` naming a complete checkpoint (or no checkpoint at all, before the first).

`state.json` is JSON so a checkpoint can be read and checked by eye; the finished groups waiting for the
trainer travel in it as tagged objects (`encode`/`decode`: `RequestId`, `GroupResult`, `SampleResult`).
What a checkpoint holds and what a resumed run regenerates: docs/runtime.md, "Checkpoints, resume and signals".
"""
from __future__ import annotations

import json
import os
import random
import shutil
import time
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, Optional, Union

import numpy as np

from mindspeed_asp.atomic import write_text
from mindspeed_asp.errors import InputError
from mindspeed_asp.runtime.types import GroupResult, RequestId, SampleResult
from mindspeed_asp.textfile import read_text

CHECKPOINT_DIR = "checkpoint"
LATEST_FILE = "latest.json"
STATE_FILE = "state.json"
TRAINER_FILE = "trainer.pt"
FORMAT = "mindspeed_asp.run_checkpoint/1"
_PREFIX = "ckpt-"
_TMP_PREFIX = ".tmp-ckpt-"

PathLike = Union[str, Path]


# --------------------------------------------------------------------------------------------- codec
def encode(obj: Any) -> Any:
    """Plain JSON data for `obj`: RequestId, GroupResult and SampleResult become tagged objects, tuples lists."""
    if isinstance(obj, RequestId):
        return {"__request_id__": [int(obj.gid), int(obj.attempt)]}
    if isinstance(obj, GroupResult):
        d = asdict(obj)
        d["group_id"] = encode(obj.group_id)
        return {"__group_result__": d}
    if isinstance(obj, dict):
        return {str(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return obj


def decode(obj: Any) -> Any:
    """Inverse of `encode` for the tagged objects (the rest stays plain data)."""
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if set(obj) == {"__request_id__"}:
        gid, attempt = obj["__request_id__"]
        return RequestId(int(gid), int(attempt))
    if set(obj) == {"__group_result__"}:
        d = dict(obj["__group_result__"])
        d["group_id"] = decode(d["group_id"])
        d["samples"] = [SampleResult(**s) for s in d["samples"]]
        return GroupResult(**d)
    return {k: decode(v) for k, v in obj.items()}


# --------------------------------------------------------------------------------------------- RNG
def rng_state() -> Dict[str, Any]:
    """Python's and numpy's global random states (torch's travels with the trainer's state)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"python": encode(random.getstate()),
            "numpy": {"name": name, "keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss),
                      "gauss": float(gauss)}}


def set_rng_state(state: Dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["name"], np.asarray(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["gauss"]))


# --------------------------------------------------------------------------------------------- files
def checkpoint_root(run_dir: PathLike) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def write_checkpoint(run_dir: PathLike, state: Dict[str, Any], trainer: Any) -> Path:
    """Write `state` (encoded to JSON) and the trainer's state as the run's latest checkpoint; returns its
    directory. `state["version"]` names it. Atomic as a whole (module doc)."""
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    version = int(state["version"])
    seq = 1 + max([_seq(p.name) for p in root.glob(f"{_PREFIX}*")], default=0)
    name = f"{_PREFIX}{version:06d}-{seq}"
    tmp = root / f"{_TMP_PREFIX}{name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    text = json.dumps({"format": FORMAT, **encode(state)})
    with open(tmp / STATE_FILE, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    trainer.save_checkpoint(tmp / TRAINER_FILE)
    final = root / name
    os.replace(tmp, final)
    write_text(root / LATEST_FILE, json.dumps({"dir": name, "version": version, "written_at": time.time()}) + "\n")
    for old in root.iterdir():  # older checkpoints and leftovers of an interrupted write
        if old.is_dir() and old.name != name and (old.name.startswith(_PREFIX) or old.name.startswith(_TMP_PREFIX)):
            shutil.rmtree(old, ignore_errors=True)
    return final


def _seq(name: str) -> int:
    try:
        return int(name.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return 0


def latest_checkpoint(run_dir: PathLike, key: str = "--resume") -> Path:
    """The directory of the run's latest complete checkpoint; an InputError naming the file when there is none."""
    root = checkpoint_root(run_dir)
    latest = root / LATEST_FILE
    if not Path(run_dir).is_dir():
        raise InputError("no such run directory", path=str(run_dir), key=key)
    if not latest.is_file():
        raise InputError(f"no checkpoint to resume from ({latest} is missing): a run writes one every "
                         f"run.checkpoint_every updates and when it stops at the end or on SIGINT/SIGTERM",
                         path=str(run_dir), key=key)
    try:
        pointer = json.loads(read_text(latest))
        directory = root / str(pointer["dir"])
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"not a checkpoint pointer: {exc}", path=str(latest), key=key) from None
    for f in (STATE_FILE, TRAINER_FILE):
        if not (directory / f).is_file():
            raise InputError(f"checkpoint {directory.name} has no {f}", path=str(directory), key=key)
    # torch.save writes a zip archive whose directory sits at its end: a truncated or overwritten copy fails
    # here in microseconds, not after Ray and the instances have started (write_checkpoint never leaves one)
    if not zipfile.is_zipfile(directory / TRAINER_FILE):
        raise InputError("not a complete torch checkpoint (truncated or overwritten since it was written); "
                         "restore the file, or start a new run", path=str(directory / TRAINER_FILE), key=key)
    return directory


def read_state(directory: PathLike) -> Dict[str, Any]:
    """The decoded state.json of a checkpoint directory (errors name the file)."""
    path = Path(directory) / STATE_FILE
    try:
        raw = json.loads(read_text(path))
    except ValueError as exc:
        raise InputError(f"not valid JSON: {exc}", path=str(path)) from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise InputError(f"not a {FORMAT} checkpoint (format {found!r})", path=str(path))
    return decode(raw)


def trainer_file(directory: PathLike) -> Path:
    return Path(directory) / TRAINER_FILE


def checkpoint_info(run_dir: PathLike) -> Optional[Dict[str, Any]]:
    """latest.json of a run directory, or None when it has no checkpoint (for messages and summaries)."""
    latest = checkpoint_root(run_dir) / LATEST_FILE
    if not latest.is_file():
        return None
    try:
        return json.loads(read_text(latest))
    except (ValueError, InputError):
        return None
