"""What a run tells its user: start-up progress while nothing else moves, and what happened to its instances.

Why one module: `asp train` and `asp demo` start the same runtime (a minute or two of vLLM start-ups before
the first update on a CPU) and end with the same kind of report; the start-up lines and the names of the
events (instance deaths, re-dispatched, regenerated and dropped groups, steals) are written once here and
read by the runtime's driver, `asp train`'s summary and `asp compare`'s table. Standard library only.
"""
from __future__ import annotations

import sys
import time
from typing import IO, Any, Callable, Dict, List, Optional, Tuple

PREFIX = "asp:"

#: (summary key of the derived count, title in reports, unusual): what happened to the run's instances and
#: groups. Steals are asp mode's ordinary work balancing, the others mean something went wrong (an instance
#: died, a group outlived the lag bound), which is what makes `asp compare` show the columns.
EVENTS: List[Tuple[str, str, bool]] = [
    ("events/instance_deaths", "deaths", True),
    ("events/redispatched", "re-dispatched", True),
    ("events/regenerated", "regenerated", True),
    ("events/dropped", "dropped", True),
    ("events/steals", "steals", False),
]


class StartupProgress:
    """One short stderr line per start-up stage (model, instance i/N starting and ready, all ready), each with
    the seconds since the run began, so the minute before the first update is not silent.

    Disabled (`enabled=False`, e.g. `--quiet`) it prints nothing.
    """

    def __init__(self, instances: int, enabled: bool = True, stream: Optional[IO[str]] = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.instances = int(instances)
        self.enabled = enabled
        self.stream = stream
        self.clock = clock
        self.t0 = clock()
        self.ready_count = 0

    def say(self, message: str) -> None:
        if self.enabled:
            out = self.stream if self.stream is not None else sys.stderr
            print(f"{PREFIX} [{self.clock() - self.t0:5.1f}s] {message}", file=out, flush=True)

    def model_ready(self, path: str) -> None:
        self.say(f"model ready: {path}")

    def instance_starting(self, j: int, attempt: int = 0) -> None:
        again = " (retry)" if attempt else ""
        self.say(f"starting rollout instance {j + 1}/{self.instances}{again}")

    def instance_ready(self, j: int, seconds: float) -> None:
        self.ready_count += 1
        self.say(f"rollout instance {j + 1}/{self.instances} ready (started in {seconds:.1f}s)")

    def all_ready(self) -> None:
        self.say(f"all {self.instances} rollout instances ready; trainer built, weights synced; training starts")


# ------------------------------------------------------------------------ events of a finished run
def _first(summary: Dict[str, Any], *keys: str) -> Optional[int]:
    for k in keys:
        v = summary.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return int(v)
    return None


def run_events(summary: Dict[str, Any]) -> Dict[str, Optional[int]]:
    """The counts of EVENTS in a summary (`asp train`'s summary.json; a MindSpeed-RL log's `asp/` keys as
    fall-backs); None where the summary does not say."""
    counts = summary.get("events") if isinstance(summary.get("events"), dict) else {}
    deaths = counts.get("instance_died")
    if deaths is None and isinstance(summary.get("instances"), int) and isinstance(summary.get("instances_alive"), int):
        deaths = summary["instances"] - summary["instances_alive"]
    return {
        "events/instance_deaths": None if deaths is None else int(deaths),
        "events/redispatched": _first(summary, "redispatched"),
        "events/regenerated": _first(summary, "queue/regenerated", "asp/queue/regenerated"),
        "events/dropped": _first(summary, "queue/dropped_stale", "asp/queue/dropped_stale"),
        "events/steals": _first(summary, "steals"),
    }


def any_events(summary: Dict[str, Any]) -> bool:
    """True when something unusual happened: an instance died, groups were re-dispatched, regenerated or
    dropped (steals alone do not count: they are asp mode's ordinary balancing)."""
    ev = run_events(summary)
    return any(ev[key] for key, _, unusual in EVENTS if unusual)


def format_events(summary: Dict[str, Any]) -> str:
    """One report line: every event count, and the instances still alive at the end."""
    ev = run_events(summary)
    parts = [f"{title} {'-' if ev[key] is None else ev[key]}" for key, title, _ in EVENTS]
    alive, total = summary.get("instances_alive"), summary.get("instances")
    if isinstance(alive, int) and isinstance(total, int):
        parts.append(f"instances alive {alive}/{total}")
    return ", ".join(parts)
