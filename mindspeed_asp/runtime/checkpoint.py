"""A run's checkpoint on disk: written atomically, found again by `asp train --resume DIR`.

Layout under the run directory:

    checkpoint/latest.json          {"dir": "ckpt-000004-2", "version": 4, ...}, replaced atomically
    checkpoint/ckpt-000004-2/       state.json (driver, dispatcher, queue, policy, recorder, history, RNG,
                                    config) and trainer.pt (model, optimizer, reference model, torch RNG)

A checkpoint directory is written under a temporary name and renamed when complete; only then does
`latest.json` point at it (`os.replace`), and older ones are removed. An interrupt or a crash at any moment
leaves `latest.json` naming a complete checkpoint (or no checkpoint at all, before the first). A write that
fails (a full disk, a quota) removes what it had written and ends the run with a `CheckpointError` naming the
path; the previous checkpoint stays whole.

Integrity: `state.json` records the SHA-256 of every other file of its directory (`"sha256"`) and
`latest.json` the SHA-256 of `state.json`; a resume verifies both before it trusts a byte (`verify_files`),
because `torch.load` does not check the zip's CRCs and a damaged but well-formed archive would train on its
values. Checkpoints written without hashes still load, with a warning. `load_state` also checks the keys and
types the driver reads, so a damaged `state.json` is refused naming the file and the key.

`state.json` is JSON so a checkpoint can be read and checked by eye; the finished groups waiting for the
trainer travel in it as tagged objects (`encode`/`decode`: `RequestId`, `GroupResult`, `SampleResult`).
What a checkpoint holds and what a resumed run regenerates: docs/runtime.md, "Checkpoints, resume and signals".
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import shutil
import sys
import time
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from mindspeed_asp.utils.atomic import write_text
from mindspeed_asp.errors import CheckpointError, InputError, error_chain
from mindspeed_asp.runtime.requests import GroupResult, RequestId, SampleResult
from mindspeed_asp.utils.textfile import read_text

CHECKPOINT_DIR = "checkpoint"
LATEST_FILE = "latest.json"
STATE_FILE = "state.json"
TRAINER_FILE = "trainer.pt"
FORMAT = "mindspeed_asp.run_checkpoint/1"
#: state.json's map {file name: SHA-256} of the other files of its checkpoint; latest.json's hash of state.json
HASHES_KEY = "sha256"
STATE_HASH_KEY = "state_sha256"
_PREFIX = "ckpt-"
_TMP_PREFIX = ".tmp-ckpt-"
#: errno values that mean "the filesystem is full" (a quota is the same to the user)
_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}

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


def check_rng_state(state: Dict[str, Any]) -> None:
    """Try `state` on private generators (the global ones are set only once the run proceeds): a damaged one
    raises here, before the instances start."""
    version, internal, gauss = state["python"]
    random.Random().setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.RandomState().set_state((n["name"], np.asarray(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"],
                                       n["gauss"]))


# --------------------------------------------------------------------------------------------- files
def checkpoint_root(run_dir: PathLike) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def write_checkpoint(run_dir: PathLike, state: Dict[str, Any], trainer: Any) -> Path:
    """Write `state` (encoded to JSON) and the trainer's state as the run's latest checkpoint; returns its
    directory. `state["version"]` names it. Atomic as a whole (module doc); a failed write leaves nothing of
    itself behind and raises `CheckpointError` for an OS refusal (full disk, quota, permissions)."""
    root = checkpoint_root(run_dir)
    version = int(state["version"])
    name = _next_name(root, version)
    tmp, final = root / f"{_TMP_PREFIX}{name}", root / name
    stage = "the checkpoint directory"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        stage = TRAINER_FILE
        trainer.save_checkpoint(tmp / TRAINER_FILE)
        stage = STATE_FILE
        hashes = {f.name: file_sha256(f, cache=False) for f in sorted(tmp.iterdir())
                  if f.is_file() and f.name != STATE_FILE}
        text = json.dumps({"format": FORMAT, **encode(state), HASHES_KEY: hashes})
        _write_synced(tmp / STATE_FILE, text)
        os.replace(tmp, final)
        stage = LATEST_FILE
        write_text(root / LATEST_FILE, json.dumps({"dir": name, "version": version, "written_at": time.time(),
                                                   STATE_HASH_KEY: _text_sha256(text)}) + "\n")
    except BaseException as exc:
        _discard_unreferenced(root, tmp, final)
        error = _write_error(exc, run_dir, final, stage)
        if error is None:
            raise
        raise error from exc
    for old in root.iterdir():  # older checkpoints and leftovers of an interrupted write
        if old.is_dir() and old.name != name and (old.name.startswith(_PREFIX) or old.name.startswith(_TMP_PREFIX)):
            shutil.rmtree(old, ignore_errors=True)
    return final


def _next_name(root: Path, version: int) -> str:
    seq = 1 + max([_seq(p.name) for p in root.glob(f"{_PREFIX}*")], default=0)
    return f"{_PREFIX}{version:06d}-{seq}"


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def _pointed_at(root: Path) -> Optional[str]:
    """The directory name latest.json points at, or None (no pointer, or not readable)."""
    try:
        return str(json.loads((root / LATEST_FILE).read_text(encoding="utf-8"))["dir"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _discard_unreferenced(root: Path, tmp: Path, final: Path) -> None:
    """After a failed write: remove its temporary directory, and the renamed one unless latest.json already
    names it (a failure after the pointer was replaced must not take the new checkpoint away)."""
    shutil.rmtree(tmp, ignore_errors=True)
    if final.exists() and _pointed_at(root) != final.name:
        shutil.rmtree(final, ignore_errors=True)


def _disk_full(exc: BaseException) -> Optional[str]:
    """What the OS or torch said if `exc` (or an error it wraps) is a full disk or quota, else None.

    torch.save reports a short write as a RuntimeError ("unexpected pos N vs M", from its zip writer, the
    OSError itself lost) or with the OS's text ("No space left on device"); the OutputError of an atomic
    write keeps the OSError as its context."""
    for cur in error_chain(exc):
        if isinstance(cur, OSError) and cur.errno in _FULL:
            return cur.strerror or os.strerror(cur.errno)
        text = str(cur).strip()
        if isinstance(cur, RuntimeError) and ("No space left" in text or "unexpected pos" in text):
            line = text.splitlines()[0]
            return f"the file came out short: {line}" if "unexpected pos" in text else line
    return None


def _write_error(exc: BaseException, run_dir: PathLike, final: Path, stage: str) -> Optional[CheckpointError]:
    """The one-line error for a failed checkpoint write, or None to re-raise `exc` as it is (an interrupt, a
    bug). Names the checkpoint, the file being written and what the user can do."""
    full = _disk_full(exc)
    os_error = next((c for c in error_chain(exc) if isinstance(c, OSError)), None)
    if full is None and os_error is None:
        return None
    if full is not None:
        what, fix = f"no space left on device (writing {stage}: {full})", "free space"
    else:
        what, fix = f"cannot write {stage} ({os_error.strerror or os_error})", "fix that"
    previous = _pointed_at(final.parent)
    after = (f"the previous checkpoint {previous} is intact: {fix}, then `asp train --resume {run_dir}`"
             if previous else "the run has no earlier checkpoint")
    return CheckpointError(f"checkpoint {final}: {what}; removed the partial checkpoint; {after}", path=str(final))


def _seq(name: str) -> int:
    try:
        return int(name.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return 0


def latest_checkpoint(run_dir: PathLike, key: str = "--resume") -> Path:
    """The directory of the run's latest complete checkpoint, its files verified against their recorded
    hashes; an InputError naming the file when there is none or it is damaged. A directory a live run holds
    locked is refused first (runtime files are only read here)."""
    from mindspeed_asp.utils.run_dir import check_run_dir_free

    root = checkpoint_root(run_dir)
    latest = root / LATEST_FILE
    if not Path(run_dir).is_dir():
        raise InputError("no such run directory", path=str(run_dir), key=key)
    check_run_dir_free(run_dir, key=key)
    if not latest.is_file():
        raise InputError(f"no checkpoint to resume from ({latest} is missing): a run writes one every "
                         f"run.checkpoint_every updates and when it stops at the end or on SIGINT/SIGTERM",
                         path=str(run_dir), key=key)
    pointer = _read_pointer(latest, key)
    directory = root / str(pointer["dir"])
    for f in (STATE_FILE, TRAINER_FILE):
        if not (directory / f).is_file():
            raise InputError(f"checkpoint {directory.name} has no {f}", path=str(directory), key=key)
    # torch.save writes a zip archive whose directory sits at its end: a truncated or overwritten copy fails
    # here in microseconds, not after Ray and the instances have started (write_checkpoint never leaves one)
    if not zipfile.is_zipfile(directory / TRAINER_FILE):
        raise InputError("not a complete torch checkpoint (truncated or overwritten since it was written); "
                         "restore the file, or start a new run", path=str(directory / TRAINER_FILE), key=key)
    verify_files(directory, key=key)
    return directory


def _read_pointer(latest: Path, key: Optional[str]) -> Dict[str, Any]:
    """latest.json as a dict holding `dir` (errors name the file)."""
    try:
        pointer = json.loads(read_text(latest))
    except ValueError as exc:
        raise InputError(f"not a checkpoint pointer: {exc}", path=str(latest), key=key) from None
    if not isinstance(pointer, dict) or not isinstance(pointer.get("dir"), str):
        raise InputError("not a checkpoint pointer (a JSON object with the checkpoint's \"dir\")", path=str(latest),
                         key=key)
    name = pointer["dir"]
    if Path(name).name != name or name in ("", ".", ".."):  # another run's checkpoint, or none of this run's
        raise InputError(f"\"dir\" {name!r} is not the name of a checkpoint directory of this run (a plain name "
                         f"under {latest.parent}): refusing to resume from elsewhere", path=str(latest), key=key)
    return pointer


# --------------------------------------------------------------------------------------------- integrity
#: (path, size, mtime, inode) -> SHA-256: the CLI's check and the driver's load hash each file once
_DIGESTS: Dict[Tuple[str, int, int, int], str] = {}


def file_sha256(path: PathLike, cache: bool = True) -> str:
    """The SHA-256 of a file's bytes (hex), read in 1 MiB blocks; with `cache`, remembered while the file is
    unchanged (same size, mtime and inode), so a resume checked by the CLI and then the driver reads it once."""
    st = os.stat(path)
    sig = (os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino)
    if sig in _DIGESTS:
        return _DIGESTS[sig]
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    if cache:
        _DIGESTS[sig] = h.hexdigest()
    return h.hexdigest()


def _text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _mismatch(path: Path, recorded_in: str, key: Optional[str]) -> InputError:
    return InputError(f"checkpoint file {path.name} does not match the hash recorded in {recorded_in}: damaged or "
                      f"replaced since the checkpoint was written; restore it, or start a new run", path=str(path),
                      key=key)


def verify_files(directory: PathLike, key: Optional[str] = "--resume") -> List[str]:
    """Check state.json against latest.json's hash and every file state.json lists against its own; refuse a
    mismatch or a missing file naming it. Returns the files left unverified (a checkpoint written before
    hashes were recorded: its state.json and trainer.pt), [] when all match."""
    d = Path(directory)
    state_path = d / STATE_FILE
    unverified: List[str] = []
    latest = d.parent / LATEST_FILE
    pointer = _read_pointer(latest, key) if latest.is_file() else {}
    recorded = pointer.get(STATE_HASH_KEY) if pointer.get("dir") == d.name else None
    if recorded is None:
        unverified.append(STATE_FILE)
    elif file_sha256(state_path) != recorded:
        raise _mismatch(state_path, LATEST_FILE, key)
    try:
        raw = json.loads(read_text(state_path))
    except ValueError as exc:
        raise InputError(f"not valid JSON: {exc}", path=str(state_path), key=key) from None
    hashes = raw.get(HASHES_KEY) if isinstance(raw, dict) else None
    if hashes is None:
        return unverified + sorted(f.name for f in d.iterdir() if f.is_file() and f.name != STATE_FILE)
    if not isinstance(hashes, dict) or not all(isinstance(v, str) for v in hashes.values()):
        raise InputError("not a map of file names to SHA-256 hashes", path=str(state_path), key=HASHES_KEY)
    for name, digest in sorted(hashes.items()):
        f = d / name
        if not f.is_file():
            raise InputError(f"checkpoint {d.name} has no {name} (listed in {STATE_FILE})", path=str(f), key=key)
        if file_sha256(f) != digest:
            raise _mismatch(f, STATE_FILE, key)
    return unverified


# --------------------------------------------------------------------------------------------- state.json
class CheckpointState(dict):
    """A decoded state.json: a plain dict whose missing top-level key is an InputError naming the file and the
    key (`state["config"]` of a damaged file), not a KeyError traceback."""

    path: Optional[str] = None

    def __missing__(self, key: str) -> Any:
        raise InputError("missing (the file is damaged, or not written by asp train)", path=self.path, key=key)


def read_state(directory: PathLike) -> Dict[str, Any]:
    """The decoded state.json of a checkpoint directory (errors name the file and key): its format and
    version are checked, and the config's type when present (`check_state` checks the rest)."""
    path = Path(directory) / STATE_FILE
    try:
        raw = json.loads(read_text(path))
    except ValueError as exc:
        raise InputError(f"not valid JSON: {exc}", path=str(path)) from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise InputError(f"not a {FORMAT} checkpoint (format {found!r})", path=str(path))
    _check_keys(raw, {"version": int, **({"config": dict} if "config" in raw else {})}, path)
    if raw["version"] < 0:
        raise InputError(f"must be 0 or more, found {raw['version']}", path=str(path), key="version")
    state = CheckpointState(decode(raw))
    state.path = str(path)
    return state


#: The sections and keys of state.json the driver reads, with their JSON types (dict: nested, checked too);
#: the inside of policy, dispatcher, queue, planner and rng is checked as each is restored (`restoring`).
STATE_SCHEMA: Dict[str, Any] = {
    "version": int, "mode": str, "config": dict,
    "driver": {"next_gid": int, "window_index": int, "plan_iteration": int, "steals_logged": int,
               "minibatch_tag": dict, "infos": list, "sync_rounds": list, "trained_gids": list,
               "peak_rss": float, "decode_steps": dict, "resumes": list},
    "policy": dict, "dispatcher": dict, "queue": {"pending": list}, "rng": {"python": list, "numpy": dict},
    "recorder": {"elapsed": float, "groups": list, "queue_trace": list, "trainer_idle": list, "steps": list,
                 "lags": list, "decode_steps": dict, "events": list},
}
_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", dict: "an object", list: "a list"}


def _check_keys(obj: Dict[str, Any], schema: Dict[str, Any], path: Path, prefix: str = "") -> None:
    """Refuse a missing key or a value of the wrong JSON type, naming the file and the dotted key."""
    for k, want in schema.items():
        key = prefix + k
        if k not in obj:
            raise InputError("missing (the file is damaged, or not written by asp train)", path=str(path), key=key)
        v = obj[k]
        typ = dict if isinstance(want, dict) else want
        if typ is float:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        else:
            ok = isinstance(v, typ) and not (typ is int and isinstance(v, bool))
        if not ok:
            raise InputError(f"must be {_TYPE_NAMES[typ]}, found {type(v).__name__} {_short(v)}", path=str(path),
                             key=key)
        if isinstance(want, dict):
            _check_keys(v, want, path, key + ".")


def _short(v: Any) -> str:
    text = json.dumps(v, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def check_state(state: Dict[str, Any], path: PathLike) -> None:
    """Refuse a state.json without the sections and keys the driver reads (or with wrong types), naming the
    file and the key, before anything is restored from it; `planner` is an object for asp runs, else null."""
    _check_keys(state, STATE_SCHEMA, Path(path))
    if "planner" not in state:
        raise InputError("missing (the file is damaged, or not written by asp train)", path=str(path), key="planner")
    if state["planner"] is not None and not isinstance(state["planner"], dict):
        raise InputError(f"must be an object or null, found {type(state['planner']).__name__}", path=str(path),
                         key="planner")


@contextlib.contextmanager
def restoring(path: PathLike, section: str) -> Iterator[None]:
    """Restore one section of state.json; a key missing or a value of the wrong type or shape inside it
    becomes an InputError naming the file and `section.key`, not a traceback from the component."""
    try:
        yield
    except KeyError as exc:
        inner = exc.args[0] if exc.args else "?"
        raise InputError("missing (the file is damaged, or not written by asp train)", path=str(path),
                         key=f"{section}.{inner}") from None
    except (TypeError, ValueError, AttributeError, IndexError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"cannot be restored ({first}): the file is damaged, or not written by this version",
                         path=str(path), key=section) from None


def load_state(directory: PathLike) -> Dict[str, Any]:
    """What a resuming driver reads: the checkpoint's files verified (`verify_files`), its state.json read and
    checked (`check_state`). A checkpoint without recorded hashes loads with a warning on stderr."""
    unverified = verify_files(directory, key=None)
    state = read_state(directory)
    check_state(state, Path(directory) / STATE_FILE)
    if unverified:
        print(f"asp: warning: checkpoint {directory} records no hashes for {', '.join(unverified)} (written "
              f"before checkpoints carried them): resuming without verifying them", file=sys.stderr)
    return state


def check_rollout_log(log: Optional[Path], planner_state: Dict[str, Any], path: PathLike) -> None:
    """Refuse now a rollout log shorter than the checkpoint counted (WindowPlanner.load_state_dict refuses it
    too, but only once the resume is known to proceed, because it also cuts the log back)."""
    with restoring(path, "planner"):
        size = int(planner_state["rollout_log_bytes"])
    have = log.stat().st_size if log is not None and log.is_file() else 0
    if log is not None and have < size:
        raise InputError(f"rollout log holds {have} bytes, the checkpoint counted {size}: it was changed after the "
                         f"checkpoint", path=str(log))


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
