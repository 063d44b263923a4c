"""Finds rollout instances whose engine hung while their actor still answers.

A dead actor is found by the calls the driver makes anyway (a submit, drain or status that fails). An engine
that hangs inside a step (a device kernel or collective that never returns) is not: the actor's other threads
go on answering, its groups never finish, and the run would only stop at `run.step_timeout_s`. The instance
reports how long its step loop has been silent (`status()["loop_silent_s"]`); an instance silent for longer
than `run.stall_timeout_s` is declared dead, so its groups go to the others and the run goes on.

Weight loads hold the engine between two steps, so a loop is also silent while a sync round runs; the driver
checks between rounds, never during one, and the timeout is meant to be far above one round's time.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

#: how often the driver asks for statuses, at most (and at least every timeout / 3)
MAX_CHECK_EVERY_S = 10.0


class EngineStalled(RuntimeError):
    """A rollout instance's engine loop stopped coming round (raised into the pool's death handling)."""


class StallWatch:
    """Rate-limited check of every live instance's `loop_silent_s` against a timeout.

    `check(statuses)` takes one status dict per instance (or the exception its status call raised) and returns
    (instance, reason) for each one to declare dead: its status call failed, or its loop has been silent for
    longer than `timeout_s`. `due()` says whether a check is due (every `every_s`, by default the smaller of
    timeout / 3 and MAX_CHECK_EVERY_S), so the driver's loop can ask on every turn at no cost.
    """

    def __init__(self, timeout_s: float, every_s: Optional[float] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not timeout_s > 0:
            raise ValueError(f"stall timeout must be > 0 s, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self.every_s = float(every_s) if every_s is not None else min(self.timeout_s / 3.0, MAX_CHECK_EVERY_S)
        self.clock = clock
        self.last_check: Optional[float] = None
        self.checks = 0

    def due(self) -> bool:
        now = self.clock()
        return self.last_check is None or now - self.last_check >= self.every_s

    def check(self, statuses: Mapping[int, Union[Dict[str, Any], BaseException]]) -> List[Tuple[int, str]]:
        self.last_check = self.clock()
        self.checks += 1
        out: List[Tuple[int, str]] = []
        for j, st in sorted(statuses.items()):
            if isinstance(st, BaseException):
                out.append((j, f"its status call failed ({type(st).__name__}: {st})"))
                continue
            silent = float(st.get("loop_silent_s", 0.0) or 0.0)
            if silent > self.timeout_s:
                out.append((j, f"its engine loop has not come round for {silent:.0f} s (run.stall_timeout_s="
                               f"{self.timeout_s:g}) with {st.get('running_groups', 0)} groups running and "
                               f"{st.get('queued', 0)} queued: a hung engine step"))
        return out
