"""A run's output directory: refuse to mix two runs in one, or clear the old run's files when told to.

`asp train` appends to rollout_log.jsonl, and the next `asp plan` reads that log as one history, so a second
run written into the same directory would silently make a prompt's epoch hold two runs' lengths. A directory
that already holds a run is therefore refused unless the user asks for `--overwrite`, which removes the
files a run writes (and only those: anything else the user put there stays), or continues that run with
`asp train --resume DIR` from its checkpoint.

A live run also holds an advisory lock on `DIR/run.lock` (`lock_run_dir`, `fcntl.flock`) from before it writes
anything until it ends: a second `asp train --out DIR`, `--overwrite` or `--resume DIR` is refused at once,
naming the other run's pid, instead of interleaving two runs' lines or truncating a live run's files. The OS
drops the lock when the process dies, so a run killed with SIGKILL still resumes.
"""
from __future__ import annotations

import errno
import os
import shutil
import socket
import sys
from pathlib import Path
from types import TracebackType
from typing import Dict, List, Optional, Sequence, Type, Union

try:
    import fcntl
except ImportError:  # not POSIX: no advisory locks, runs are not guarded against each other
    fcntl = None  # type: ignore[assignment]

from mindspeed_asp.utils.atomic import check_output_dir
from mindspeed_asp.errors import OutputError

#: Every file `asp train` writes into its run directory (docs/runtime.md, "Errors and safe output").
RUN_FILES = ("summary.json", "metrics.jsonl", "trace.json", "rollout_log.jsonl", "length_history.jsonl",
             "dataset.jsonl", "gantt.png", "queue.png", "lag_hist.png", "reward.png", "checkpoint")
#: The files whose presence means the directory holds a run (any one of them).
RUN_MARKERS = ("summary.json", "rollout_log.jsonl", "metrics.jsonl", "checkpoint/latest.json")
#: Written by every checkpoint (runtime/checkpoint.py): a run that has one can be continued with --resume.
CHECKPOINT_POINTER = "checkpoint/latest.json"
#: The lock a live run holds (`lock_run_dir`); not a run file: --overwrite never removes a lock it holds.
LOCK_FILE = "run.lock"


def run_files(directory: Union[str, Path]) -> List[Path]:
    """The run files present in `directory` (none when it does not exist)."""
    d = Path(directory)
    return [d / name for name in RUN_FILES if (d / name).exists()]


def holds_run(directory: Union[str, Path]) -> Optional[str]:
    """The first run marker found in `directory`, or None."""
    d = Path(directory)
    return next((name for name in RUN_MARKERS if (d / name).is_file()), None)


def prepare_run_dir(directory: Union[str, Path], overwrite: bool, key: str = "--out",
                    markers: Sequence[str] = (), resume_flag: Optional[str] = None) -> Path:
    """Check that `directory` can take a new run, before any work starts.

    Refuses a path that cannot be a writable directory, and one that already holds a run (or one of the
    extra `markers` files) unless `overwrite`, in which case the old run's files are removed now, so the new
    run never appends to them. `resume_flag` (asp train's `--resume`) is named in the refusal as the way to
    continue the run. Returns the directory (not created here).
    """
    d = check_output_dir(directory, key=key)
    check_run_dir_free(d, key=key)  # a live run's directory: its pid, before "holds a run"
    found = holds_run(d) or next((m for m in markers if (d / m).exists()), None)
    if found is None:
        return d
    if not overwrite:
        if resume_flag is None:
            hint = "use --overwrite to replace it, or another --out"
        elif (d / CHECKPOINT_POINTER).is_file():
            hint = (f"use {resume_flag} {d} to continue it from its checkpoint, --overwrite to replace it, "
                    f"or another --out")
        else:
            hint = (f"it has no checkpoint for {resume_flag} to continue from; use --overwrite to replace it, "
                    f"or another --out")
        raise OutputError(f"already holds a run ({found}); {hint}", path=str(d), key=key)
    with lock_run_dir(d, key=key):  # no run may start in it while its old files go
        for f in run_files(d) + [d / m for m in markers if (d / m).is_file()]:
            try:
                if f.is_dir():
                    shutil.rmtree(f)
                else:
                    f.unlink()
            except OSError as exc:
                raise OutputError(f"cannot remove the old run's {f.name}: {exc.strerror or exc}", path=str(d),
                                  key=key) from None
    return d


# --------------------------------------------------------------------------------------------- the run lock
#: Locks this process holds, by lock file path: a forked child closes its copies (`_close_in_child`), so the
#: lock ends with the run's own process, not with whatever it forked.
_HELD: Dict[str, "RunLock"] = {}


class RunLock:
    """An exclusive `flock` on DIR/run.lock, held while a run uses DIR. `release` removes the file while still
    holding it (a process that opened the old file sees another inode and retries), then closes it."""

    def __init__(self, path: Path, fd: Optional[int]) -> None:
        self.path = path
        self.fd = fd

    def release(self) -> None:
        """Give the directory up (idempotent); the OS does the same if the process dies first."""
        if self.fd is None:
            return
        _HELD.pop(_held_key(self.path), None)
        try:
            os.unlink(self.path)
        except OSError:
            pass  # a read-only directory or a removed one: the lock still ends with the close
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.release()


def _close_in_child() -> None:
    """After a fork: the child drops its copies of the lock's descriptor (closing them does not unlock the
    parent's), so a child that outlives a killed run does not keep its directory locked."""
    for lock in list(_HELD.values()):
        if lock.fd is not None:
            try:
                os.close(lock.fd)
            except OSError:
                pass
            lock.fd = None
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


def _held_key(path: Path) -> str:
    return os.path.realpath(path)


def _holder(fd: int) -> str:
    """What the lock's holder wrote into the file: 'pid N on host H' (or 'pid unknown' in the instant before)."""
    try:
        words = os.pread(fd, 256, 0).decode("utf-8", "replace").split()
    except OSError:
        words = []
    if not words:
        return "pid unknown"
    host = f" on {words[1]}" if len(words) > 1 and words[1] != socket.gethostname() else ""
    return f"pid {words[0]}{host}"


def _in_use(directory: Path, holder: str, key: Optional[str]) -> OutputError:
    return OutputError(f"in use by another run ({holder}): one directory takes one run at a time; wait for that "
                       f"run to end or stop it first", path=str(directory), key=key)


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` still names the file `fd` has open (a run that just ended removes its lock file)."""
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


#: flock's answers on a filesystem that has no locks (some NFS mounts): the run goes on unguarded, warned
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS}


def _unlocked(directory: Path, path: Path, exc: OSError) -> RunLock:
    """No lock to be had on this filesystem: say so once, leave no lock file, and let the run go on."""
    print(f"asp: warning: {directory}: the filesystem refuses locks ({exc.strerror or exc}); nothing stops a "
          f"second run from using this directory at the same time", file=sys.stderr)
    try:
        os.unlink(path)
    except OSError:
        pass
    return RunLock(path, None)


def lock_run_dir(directory: Union[str, Path], key: Optional[str] = None) -> RunLock:
    """Take `directory`'s run lock (the directory must exist) or refuse at once, naming the holder's pid.

    Why flock: the kernel releases it when the holder dies, however it dies, so there is no stale lock to
    clear by hand after a SIGKILL or a power loss, and nothing to guess from pids."""
    d = Path(directory)
    path = d / LOCK_FILE
    if fcntl is None:
        return RunLock(path, None)
    if _held_key(path) in _HELD:
        raise _in_use(d, f"pid {os.getpid()}, this process", key)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise OutputError(f"cannot create the run lock {LOCK_FILE}: {exc.strerror or exc}", path=str(d),
                              key=key) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise _in_use(d, holder, key) from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in _NO_LOCKS:
                raise OutputError(f"cannot lock {LOCK_FILE}: {exc.strerror or exc}", path=str(d), key=key) from None
            return _unlocked(d, path, exc)
        if _same_file(fd, path):
            break
        os.close(fd)  # locked a file its holder had just removed: take the new one
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    lock = RunLock(path, fd)
    _HELD[_held_key(path)] = lock
    return lock


def check_run_dir_free(directory: Union[str, Path], key: Optional[str] = None) -> None:
    """Refuse now a directory a live run holds locked (the pid named), creating nothing: for the checks made
    before a command starts; the run itself takes the lock with `lock_run_dir`."""
    path = Path(directory) / LOCK_FILE
    if fcntl is None or _held_key(path) in _HELD:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # no lock file: no live run (a live run's lock file exists while it holds it)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: needs only read access
    except BlockingIOError:
        raise _in_use(Path(directory), _holder(fd), key) from None
    except OSError:
        return  # a filesystem without locks: the run's own lock_run_dir says so
    finally:
        os.close(fd)
