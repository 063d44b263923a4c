"""Project-wide error types.

Every error a user can cause carries the file, line or key that caused it, so the CLI can print one clear
line instead of a traceback.
"""
from __future__ import annotations

from typing import Iterator, List, Optional


class AspError(Exception):
    """Base class for errors the CLI reports as one line (no traceback)."""


class InputError(AspError):
    """Bad user input: a malformed file, line, column or value."""

    def __init__(self, message: str, path: Optional[str] = None, line: Optional[int] = None,
                 key: Optional[str] = None) -> None:
        where = []
        if path:
            where.append(str(path) + (f":{line}" if line is not None else ""))
        if key:
            where.append(f"key '{key}'")
        prefix = (" ".join(where) + ": ") if where else ""
        super().__init__(prefix + message)
        self.path, self.line, self.key = path, line, key


class ConfigError(InputError):
    """A configuration file or override is invalid (unknown key, wrong type, impossible value)."""


class OutputError(InputError):
    """An output path cannot be written (a file where a directory is needed, no write permission, a directory
    where a file is wanted) or already holds a run that would be mixed with the new one."""


class PlanMismatchError(AspError):
    """A dispatch plan was built for another dataset (fingerprint differs) or another schema version."""


class WeightSyncError(AspError):
    """A weight-sync round failed or moved nothing; never ignored (vLLM communicators disable silently)."""


class WeightSyncTimeout(WeightSyncError):
    """A weight-sync peer did not answer within the deadline; the message names which one (rank, label)."""


class RunError(AspError):
    """A run could not continue (instances failed to start, every instance died, a step timed out)."""


class CheckpointError(RunError):
    """A run's checkpoint could not be written (a full disk, a quota, a refused write): the message names the
    checkpoint's path, and the previous checkpoint stays whole for `asp train --resume`."""

    def __init__(self, message: str, path: Optional[str] = None) -> None:
        super().__init__(message)
        self.path = path


def error_chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and the errors it wraps (cause or context), each once: where a library wraps the OSError that says
    why (a full disk under torch's own error), the caller finds it here."""
    seen: List[int] = []
    cur: Optional[BaseException] = exc
    while cur is not None and id(cur) not in seen:
        seen.append(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__
