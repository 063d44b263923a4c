"""Drives the rollout instances: plan dispatch, max-lag admission, lockstep stepping, finished-group queue.

It runs as a threaded Ray actor next to the trainer so generation continues while the trainer's blocking
Megatron update runs. Dispatch decisions are the runtime's `Dispatcher` (plan / least-loaded, stealing) and
`admission_budget` (AReaL's max-lag rule), shared with the CPU and GPU tiers; this class only adds the
MindSpeed-RL instance shape (several TP ranks per instance, called in lockstep).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional, Sequence

from mindspeed_asp.integrations.mindspeed_rl.rollout_worker import GroupJob, GroupOutput
from mindspeed_asp.runtime.dispatcher import Dispatcher, Ticket, admission_budget


class RolloutDriver:
    """Feeds `instances[j]` (a list of TP-rank actor handles) from the dispatcher, collects finished groups.

    `max_lag`: a group admitted at version v is trained at a version <= v + max_lag (admission), and the
    trainer audits it again. `capacity`: groups in flight per instance (slots // n keeps vLLM's batch full).
    """

    def __init__(self, instances: Sequence[Sequence[Any]], policy: str, max_lag: int, minibatch_groups: int,
                 capacity: int, steps_per_call: int = 16, work_stealing: bool = True) -> None:
        import ray  # noqa: F401  (actor context)
        self.instances = [list(ranks) for ranks in instances]
        self.dispatcher = Dispatcher(policy, len(self.instances), capacity=capacity, work_stealing=work_stealing)
        self.max_lag, self.M, self.steps = max_lag, minibatch_groups, steps_per_call
        self.version = 0
        self.accepted = 0
        self.prompts: Dict[int, List[int]] = {}
        self.pending: List[List[GroupJob]] = [[] for _ in self.instances]
        self.outstanding: Dict[int, List[Any]] = {}
        self.finished: List[GroupOutput] = []
        self.errors: List[str] = []
        self.paused = False
        self.stopped = False
        self.lock = threading.Condition()
        self.thread = threading.Thread(target=self._loop, name="asp-rollout-driver", daemon=True)
        self.thread.start()

    # ---------------------------------------------------------------- control (called by the trainer)
    def load_window(self, prompts: Dict[int, List[int]], predicted: Dict[int, float],
                    plan_queues: Optional[List[List[int]]] = None) -> int:
        with self.lock:
            self.prompts.update({int(k): list(v) for k, v in prompts.items()})
            tickets = [Ticket(int(g), float(predicted.get(g, 1.0))) for g in prompts]
            self.dispatcher.load_window(tickets, plan_queues)
            self.lock.notify_all()
            return self.dispatcher.queued()

    def set_version(self, version: int) -> None:
        with self.lock:
            self.version = int(version)
            self.lock.notify_all()

    def pause(self, timeout: float = 3600.0) -> bool:
        """Stop issuing engine steps and wait until no call is outstanding (weight sync may start)."""
        with self.lock:
            self.paused = True
            ok = self.lock.wait_for(lambda: not self.outstanding or self.errors, timeout=timeout)
            self._raise()
            return bool(ok)

    def resume(self) -> None:
        with self.lock:
            self.paused = False
            self.lock.notify_all()

    def take(self, k: int, timeout: float = 86400.0) -> Dict[str, Any]:
        """Block until k finished groups are available; return them oldest version first, and the wait."""
        t0 = time.monotonic()
        with self.lock:
            ok = self.lock.wait_for(lambda: len(self.finished) >= k or self.errors, timeout=timeout)
            self._raise()
            if not ok:
                raise TimeoutError(f"no {k} finished groups within {timeout}s")
            self.finished.sort(key=lambda o: (o.version, o.end))
            out, self.finished = self.finished[:k], self.finished[k:]
            return {"groups": out, "wait_s": time.monotonic() - t0, "queued": self.dispatcher.queued(),
                    "in_flight": self.dispatcher.in_flight_count(), "ready_left": len(self.finished)}

    def requeue(self, gid: int) -> None:
        """A stale group is regenerated (counts again against admission)."""
        with self.lock:
            self.dispatcher.requeue(int(gid))
            self.accepted -= 1
            self.lock.notify_all()

    def drop(self, gid: int) -> None:
        with self.lock:
            self.accepted -= 1

    def stats(self) -> Dict[str, Any]:
        import ray
        with self.lock:
            steals = [(s.thief, s.victim, s.gid) for s in self.dispatcher.steals]
            queued = self.dispatcher.queued()
        per = ray.get([ranks[0].stats.remote() for ranks in self.instances]) if not self.outstanding else []
        return {"steals": steals, "queued": queued, "instances": per}

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            self.lock.notify_all()
        self.thread.join(timeout=60)

    def _raise(self) -> None:
        if self.errors:
            raise RuntimeError("rollout instance failed: " + self.errors[0])

    # ---------------------------------------------------------------- the loop
    def _loop(self) -> None:
        import ray
        while True:
            with self.lock:
                if self.stopped:
                    return
                if not self.paused:
                    budget = admission_budget(self.version, self.max_lag, self.M, self.accepted)
                    for j, t in self.dispatcher.fill(budget):
                        self.accepted += 1
                        self.pending[j].append(GroupJob(t.gid, self.prompts[t.gid], self.version))
                    for j, ranks in enumerate(self.instances):
                        if j in self.outstanding or not self.dispatcher.alive[j]:
                            continue
                        if self.pending[j] or self.dispatcher.in_flight_count(j):
                            jobs, self.pending[j] = self.pending[j], []
                            self.outstanding[j] = [r.run.remote(jobs, self.steps) for r in ranks]
                refs = {j: refs[0] for j, refs in self.outstanding.items()}
                if not refs:
                    self.lock.wait(timeout=0.05)
                    continue
            ready, _ = ray.wait(list(refs.values()), num_returns=1, timeout=0.05)
            for ref in ready:
                j = next(k for k, r in refs.items() if r == ref)
                try:
                    results = ray.get(self.outstanding[j])  # every TP rank: surfaces errors, keeps lockstep
                except Exception as exc:  # an instance died: re-dispatch its groups
                    with self.lock:
                        self.outstanding.pop(j, None)
                        self.pending[j] = []
                        try:
                            self.dispatcher.on_instance_dead(j)
                        except RuntimeError as fatal:
                            self.errors.append(f"{fatal}: {exc}")
                        self.lock.notify_all()
                    continue
                with self.lock:
                    self.outstanding.pop(j, None)
                    for out in results[0]:
                        if self.dispatcher.on_finished(j, out.gid):
                            self.finished.append(out)
                    self.lock.notify_all()
