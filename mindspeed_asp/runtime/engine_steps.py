"""Every engine step the rollout instances ran (active sequences, KV tokens, prefill tokens, seconds).

Two readers: the asp planner's online cost fit, which gets each instance's new steps before it plans a
window (`read`), and the run directory's engine_steps.jsonl, written at the end for fitting this machine's
cost model afterwards (`asp fit-cost`, benchmarks/bench_runtime.py). The warm-up's steps are not the run's:
`mark_start` after the warm-up sets where the run's own steps begin.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional

if TYPE_CHECKING:
    from mindspeed_asp.runtime.replan import WindowPlanner
    from mindspeed_asp.runtime.rollout_pool import RolloutPool


class EngineStepLog:
    """Per-instance cursors into the instances' step logs (each instance keeps its own, `step_log(since)`)."""

    def __init__(self, planner: Optional["WindowPlanner"]) -> None:
        self.planner = planner
        self.pool: Optional["RolloutPool"] = None
        self.cursor: Dict[int, int] = {}  # per instance: engine steps already read
        self.start: Dict[int, int] = {}  # per instance: steps before the run's own (the warm-up's)
        self.refs: Optional[Dict[int, Any]] = None  # step_log calls sent and not read yet (plan ahead)

    def mark_start(self) -> None:
        """The steps run so far (the warm-up's) are not the run's."""
        self.read()
        self.start = dict(self.cursor)

    def read(self, wait: bool = True) -> bool:
        """Hand the engine steps each live instance ran since the last read to the planner's cost fit.

        `wait=False` (planning ahead) only sends the calls, or takes their answers once all are in, and
        returns whether they were taken: the loop is not held up while a busy instance answers."""
        import ray

        if self.refs is None:
            self.refs = {j: self.pool.handles[j].step_log.remote(self.cursor.get(j, 0)) for j in self.pool.live()}
        refs = self.refs
        if not wait and refs:
            ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=0)
            if len(ready) < len(refs):
                return False
        self.refs = None
        for j, ref in refs.items():
            try:
                total, rows = ray.get(ref, timeout=30)
            except Exception:  # noqa: BLE001 - a dead instance is the pool's to notice; its steps are lost
                continue
            if j in self.cursor and self.planner is not None:  # the first read only sets the cursor
                self.planner.add_engine_steps(rows)
            self.cursor[j] = int(total)
        return True

    def write(self, path: Path) -> None:
        """engine_steps.jsonl: every engine step of the run per instance, one JSON object per line."""
        import ray

        from mindspeed_asp.utils.atomic import write_text

        lines = []
        for j in self.pool.live():
            try:
                _, rows = ray.get(self.pool.handles[j].step_log.remote(self.start.get(j, 0)), timeout=30)
            except Exception:  # noqa: BLE001 - an instance that died: its steps are lost
                continue
            lines.extend(json.dumps({"instance": j, "active": r[0], "kv_tokens": r[1], "prefill_tokens": r[2],
                                     "step_time": r[3]}) for r in rows)
        write_text(path, "\n".join(lines) + ("\n" if lines else ""))
