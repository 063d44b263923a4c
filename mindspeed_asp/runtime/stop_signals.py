"""SIGINT and SIGTERM stop a run at a safe point; a second signal aborts it at once.

Why: schedulers pre-empt with SIGTERM and people press Ctrl-C. Killing the driver in the middle of an update or
a weight sync loses the work since the last checkpoint and, before this module, left Ray's agents behind. So
the first signal only asks the run loop to stop after the current update (`requested`); the loop then writes
a checkpoint, a summary marked interrupted and the plots, and shuts down what it started. A second signal
raises `RunAborted` wherever the driver is (the checkpoint write is atomic, so the last complete checkpoint
stays), and later signals are ignored so the shutdown of Ray's processes is not cut short itself.

Before the run loop starts (`arm()`), there is nothing to save and instance start-up can take minutes, so
the first signal raises `RunInterrupted` at once, except inside `shielded()`: starting Ray (`ray.init`) must not
be cut in half (an exception raised into it leaves its C++ threads half started, and the process then dies with
a segfault at exit; `ray.init` also installs its own SIGTERM handler, `sys.exit`, first thing). Inside the shield
a signal is recorded, Ray's handler is kept out, and `RunInterrupted` is raised when the block has finished, so
the caller's clean-up stops a Ray that is whole. Handlers are installed only in the main thread (Python delivers
signals there) and the previous ones are put back by `restore()`.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
from types import FrameType
from typing import Any, Dict, Iterator, Optional

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(KeyboardInterrupt):
    """A stop signal arrived before the run loop started (nothing trained, nothing to save)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class RunAborted(KeyboardInterrupt):
    """A second stop signal: the run is abandoned without a checkpoint at this point."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_status(signum: int) -> int:
    """The shell's status for a process stopped by `signum` (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + int(signum)


class StopSignals:
    """The run's stop request: `requested` holds the first signal's number once one arrived."""

    def __init__(self, announce: bool = True) -> None:
        self.announce = announce
        self.requested: Optional[int] = None
        self.armed = False
        self.aborted = False
        self.shielding = False
        self.reason: Optional[str] = None  # a stop asked for by the run itself (request_stop), not a signal
        self._previous: Dict[int, Any] = {}

    @property
    def requested_name(self) -> Optional[str]:
        return None if self.requested is None else signal.Signals(self.requested).name

    def install(self) -> bool:
        """Take over SIGINT and SIGTERM; False (nothing changed) outside the main thread. Calling it again
        takes them back from whoever replaced them since (`ray.init` sets its own SIGTERM handler) and keeps
        the handlers found the first time for `restore`."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for s in STOP_SIGNALS:
            prev = signal.signal(s, self._handle)
            self._previous.setdefault(s, prev)
        return True

    def restore(self) -> None:
        """Put the handlers that were there before `install` back."""
        for s, prev in self._previous.items():
            signal.signal(s, prev if prev is not None else signal.SIG_DFL)
        self._previous = {}

    @contextlib.contextmanager
    def shielded(self) -> Iterator[None]:
        """Run a block that must not be interrupted halfway (starting Ray); a stop signal that arrives inside is
        honoured when the block has finished. Ray's own SIGTERM handler is not installed meanwhile."""
        self.shielding = True  # first: importing Ray below takes a while too
        patched = None
        try:
            patched = _keep_ray_sigterm_handler_out()
            yield
        finally:
            self.shielding = False
            if patched is not None:
                patched()
            self.install()  # whatever the block put in place of ours
        if self.requested is not None and not self.armed and not self.aborted:
            self.aborted = True
            self._say(f"asp: {self.requested_name} during start-up: stopping (nothing trained yet)")
            raise RunInterrupted(self.requested)

    def request_stop(self, reason: str) -> None:
        """Stop at the next safe point as a first SIGTERM would (callable from any thread): the run has lost
        something it cannot go on without (Ray's GCS) but can still write its checkpoint and summary."""
        if self.requested is None:
            self.reason = reason
            self.requested = signal.SIGTERM
            self._say(f"asp: {reason}: stopping after the current update, then writing a checkpoint, the summary "
                      f"and the plots")

    def arm(self) -> None:
        """From now on the first signal waits for a safe point instead of raising."""
        self.armed = True

    def _say(self, text: str) -> None:
        if self.announce:
            print(text, file=sys.stderr, flush=True)

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        name = signal.Signals(signum).name
        if self.aborted:
            return  # already unwinding: let the shutdown of Ray's processes finish
        if self.requested is None:
            self.requested = signum
            if self.shielding and not self.armed:
                self._say(f"asp: {name} while Ray starts: stopping once it is up (to shut it down whole)")
                return
            if not self.armed:
                self.aborted = True
                self._say(f"asp: {name} during start-up: stopping (nothing trained yet)")
                raise RunInterrupted(signum)
            self._say(f"asp: {name}: stopping after the current update, then writing a checkpoint, the "
                      f"summary and the plots (send it again to abort at once)")
            return
        self.aborted = True
        self._say(f"asp: second {name}: aborting now; the run resumes from its last checkpoint")
        raise RunAborted(signum)


def _keep_ray_sigterm_handler_out() -> Optional[Any]:
    """Make `ray.init`'s SIGTERM handler installation a no-op; returns the function that undoes it (None when
    Ray is not installed)."""
    try:
        import ray._private.utils as ray_utils
    except ImportError:
        return None
    original = ray_utils.set_sigterm_handler

    def keep_ours(handler: Any) -> None:
        """`ray.init` would install `sys.exit` for SIGTERM: the run's own handler stays."""

    ray_utils.set_sigterm_handler = keep_ours

    def undo() -> None:
        ray_utils.set_sigterm_handler = original
    return undo
