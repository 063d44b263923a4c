"""Atomic file output, and output paths checked before the work starts.

Every file the tools write (plans, histories, datasets, summaries, truth and cost files, JSON results, plots)
is written to a temporary file in the target's own directory and then renamed over the target with
`os.replace`, which is atomic within one filesystem: an interrupt, a full disk or a crash leaves either the
previous file or the new one, never half of one, and never loses the previous version. `check_output_file`
and `check_output_dir` refuse an unwritable path before a command's expensive pass, so a bad `-o` fails in a
second instead of after minutes of planning. OS errors become an `OutputError` naming the path and the option.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator, Optional, Union

from mindspeed_asp.errors import OutputError

PathLike = Union[str, Path]


def _os_error(exc: OSError, path: Path, key: Optional[str]) -> OutputError:
    return OutputError(f"cannot write: {exc.strerror or exc}", path=str(path), key=key)


def _nearest_existing(path: Path) -> Path:
    """`path` or its closest ancestor that exists (a relative path ends at '.')."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_creatable_dir(directory: Path, key: Optional[str], target: Path) -> None:
    """`directory` exists as a writable directory, or can be created under a writable one."""
    anchor = _nearest_existing(directory)
    if not anchor.is_dir():
        raise OutputError(f"cannot create directory {directory}: {anchor} is not a directory", path=str(target),
                          key=key)
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise OutputError(f"directory {anchor} is not writable", path=str(target), key=key)


def check_output_file(path: PathLike, key: Optional[str] = None) -> Path:
    """Refuse now an output file that could not be written later: the target is a directory, or its parent
    is (or lies under) a file or an unwritable directory. Creates nothing."""
    target = Path(path)
    if target.is_dir():
        raise OutputError("is a directory; give a file path", path=str(target), key=key)
    _check_creatable_dir(target.parent, key, target)
    if target.exists() and not os.access(target, os.W_OK):
        # os.replace would still succeed in a writable directory; a read-only file is a user's "keep this"
        raise OutputError("file is read-only", path=str(target), key=key)
    return target


def check_output_dir(path: PathLike, key: Optional[str] = None) -> Path:
    """Refuse now an output directory that could not be written later (a file, or not creatable/writable)."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise OutputError("exists and is not a directory", path=str(target), key=key)
    _check_creatable_dir(target, key, target)
    return target


def _file_mode(target: Path) -> int:
    """The mode the new file gets: the old file's, else what the umask gives a plain `open`."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


@contextlib.contextmanager
def atomic_path(path: PathLike, key: Optional[str] = None) -> Iterator[Path]:
    """Yield a temporary path beside `path` (same suffix, so writers that pick a format by suffix work);
    when the block succeeds it replaces `path`, when it fails it is removed and `path` is untouched."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=f".tmp{target.suffix}",
                                    dir=str(target.parent))
        os.close(fd)
    except OSError as exc:
        raise _os_error(exc, target, key) from None
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, _file_mode(target))
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError):
            raise _os_error(exc, target, key) from None
        raise


@contextlib.contextmanager
def atomic_open(path: PathLike, mode: str = "w", key: Optional[str] = None, **kwargs: Any) -> Iterator[IO]:
    """`open(path, mode)` whose content appears at `path` only once the block has finished (text is UTF-8)."""
    if "w" not in mode:
        raise ValueError(f"atomic_open writes whole files; mode {mode!r} is not a write mode")
    if "b" not in mode:
        kwargs.setdefault("encoding", "utf-8")
    with atomic_path(path, key) as tmp:
        with open(tmp, mode, **kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())


def write_text(path: PathLike, text: str, key: Optional[str] = None) -> Path:
    """Write `text` to `path` atomically; returns the path."""
    with atomic_open(path, "w", key=key) as fh:
        fh.write(text)
    return Path(path)


def write_json(path: PathLike, obj: Any, key: Optional[str] = None, **dump_kwargs: Any) -> Path:
    """`json.dumps(obj, **dump_kwargs)` plus a newline, written atomically; the JSON is built before the
    file is touched, so an unserialisable value leaves the old file in place."""
    return write_text(path, json.dumps(obj, **dump_kwargs) + "\n", key=key)
