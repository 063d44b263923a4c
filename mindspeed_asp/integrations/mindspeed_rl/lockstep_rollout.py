"""Drives the rollout instances of the MindSpeed-RL integration: dispatch, admission, lockstep stepping.

A threaded Ray actor next to the trainer, so generation continues while Megatron's blocking update runs.
Every decision is the standalone runtime's, made by the same `RolloutControl` (runtime/rollout_control.py:
the dispatcher's plan or least-loaded order and work stealing, the max-lag admission and waiting rule, the one
per-instance capacity rule, the sample queue's lag audit, minibatch order and stale groups), tested on the CPU
and GPU tiers. This class only adds MindSpeed-RL's instance shape: several TP-rank actors per instance, called
in lockstep, and what a checkpoint keeps of it (`snapshot` / `restore`, see resume_state.py).

A dead instance ends the run, fast. The Dispatcher could re-dispatch its groups, but MindSpeed-RL's weight
groups span every instance (one HCCL communicator per infer-TP rank, 1 + instances ranks) and cannot be
formed again cheaply: the next sync's broadcast would wait for the missing rank until asp.sync_timeout_s, with
the HCCL kernel blocking the Megatron rank's compute stream until HCCL_EXEC_TIMEOUT. So the first death (any
TP rank's step call failing, or a rank not answering the liveness probe before a sync) is recorded, nothing
more is issued, and the trainer's next call (`next_minibatch`, `pause`) raises a RunError naming the instance,
its TP ranks and the cause, before any broadcast starts.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mindspeed_asp.errors import RunError
from mindspeed_asp.runtime.dispatcher import Ticket
from mindspeed_asp.runtime.rollout_control import Admission, RolloutControl
from mindspeed_asp.runtime.requests import GroupRequest, GroupResult


class LockstepRollout:
    """Feeds `instances[j]` (a list of TP-rank actor handles) from the rollout control; collects finished groups.

    `mode` (async / asp) and `max_lag`, `minibatch_groups`, `slots` (each engine's sequence slots), `n`
    (samples per group), `work_stealing`, `stale_policy` configure the `RolloutControl` exactly as the
    standalone runtime's run config does. `steps_per_call`: engine steps per lockstep call.
    `labels[j][r]` names TP rank r of instance j in errors (its Ray actor name); default "instance j tp-rank r".
    `start=False` leaves the loop thread unstarted (a caller that steps it itself: tests).
    """

    def __init__(self, instances: Sequence[Sequence[Any]], mode: str, max_lag: int, minibatch_groups: int,
                 slots: int, n: int, steps_per_call: int = 16, work_stealing: bool = True,
                 stale_policy: str = "regenerate", labels: Optional[Sequence[Sequence[str]]] = None,
                 start: bool = True) -> None:
        self.instances = [list(ranks) for ranks in instances]
        self.labels = [list(names) for names in labels] if labels is not None else [
            [f"instance {j} tp-rank {r}" for r in range(len(ranks))] for j, ranks in enumerate(self.instances)]
        self.control = RolloutControl(mode, len(self.instances), max_lag, minibatch_groups, slots, n,
                                      work_stealing=work_stealing, stale_policy=stale_policy)
        self.steps = steps_per_call
        self.version = 0
        self.requests: Dict[int, GroupRequest] = {}
        self.pending: List[List[Tuple[GroupRequest, int]]] = [[] for _ in self.instances]
        self.outstanding: Dict[int, List[Any]] = {}
        self.issued_at: Dict[int, float] = {}  # instance -> when its outstanding step call was issued
        self.errors: List[str] = []
        self.deaths: List[Dict[str, Any]] = []
        self.paused = False
        self.stopped = False
        self.lock = threading.Condition()
        self.thread = threading.Thread(target=self._loop, name="asp-rollout-driver", daemon=True)
        if start:
            self.thread.start()

    # ---------------------------------------------------------------- control (called by the trainer)
    def load_window(self, requests: Sequence[GroupRequest], predicted: Dict[int, float],
                    plan_queues: Optional[List[List[int]]] = None, shared: bool = False,
                    isolated: Sequence[int] = ()) -> int:
        """Queue a window of groups (`group_id` = str of an int gid), in plan queues when the plan dispatches
        (`shared`: the plan left the window unpinned, one queue in its order, least-loaded; `isolated`: the
        gids the plan isolated, whose instance steals nothing while they run)."""
        with self.lock:
            tickets = []
            for req in requests:
                gid = int(req.group_id)
                self.requests[gid] = req
                tickets.append(Ticket(gid, float(predicted.get(gid, 1.0))))
            queued = self.control.load_window(tickets, plan_queues, shared=shared, isolated=isolated)
            self.lock.notify_all()
            return queued

    def set_version(self, version: int) -> None:
        with self.lock:
            self.version = int(version)
            self.lock.notify_all()

    def pause(self, timeout: float = 3600.0) -> bool:
        """Stop issuing engine steps and wait until no call is outstanding (weight sync may start); a dead
        instance raises RunError here. The trainer then calls `check_alive` (an instance may die while idle).

        A step call runs `steps_per_call` engine steps, so one that is still out after `timeout` means a hung
        engine (a device kernel or collective that never returns): the error names each such instance and how
        long its call has run, since MindSpeed-RL's weight sync spans every engine rank and cannot go on
        without it."""
        with self.lock:
            self.paused = True
            ok = self.lock.wait_for(lambda: not self.outstanding or self.errors, timeout=timeout)
            self._raise()
            if not ok:
                now = time.time()
                stuck = ", ".join(f"instance {j} ({len(self.instances[j])} TP ranks, call out for "
                                  f"{now - self.issued_at.get(j, now):.0f} s)" for j in sorted(self.outstanding))
                raise TimeoutError(f"rollout engine step calls still running after {timeout:g} s, cannot pause for "
                                   f"a weight sync: {stuck}; a hung engine (asp.sync_timeout_s bounds this wait)")
            return True

    def check_alive(self, timeout: float = 60.0) -> bool:
        """Ask every TP rank for `ready()` (paused: answered at once); a rank whose actor died is a death of its
        instance, raised as RunError, so a sync's broadcast never starts with a rank missing. A rank silent
        for `timeout` is a RunError too."""
        import ray
        refs = {r.ready.remote(): (j, k) for j, ranks in enumerate(self.instances) for k, r in enumerate(ranks)}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        for ref in ready:
            try:
                ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - the actor is gone (ActorDiedError) or its process is broken
                j, k = refs[ref]
                self._on_dead(j, exc, [k])
        silent = sorted({refs[ref] for ref in refs if ref not in ready})
        with self.lock:
            self._raise()
        if silent:
            raise RunError("rollout instance(s) do not answer a liveness probe within "
                           f"{timeout:g} s before a weight sync: "
                           + ", ".join(self.labels[j][k] for j, k in silent))
        return True

    def resume(self) -> None:
        with self.lock:
            self.paused = False
            self.lock.notify_all()

    def supply(self) -> int:
        """Groups that can still be trained: queued, in flight (admitted, generating) and finished untrained."""
        return self.control.supply()

    def next_minibatch(self, train_version: int, timeout: float = 86400.0,
                       feed_below: int = 0) -> Dict[str, Any]:
        """Block until the queue holds a trainable minibatch for `train_version`; return it with the wait.

        Stale groups found on the way are handed back to the dispatcher (regenerate) or dropped, per the
        queue's policy; both free their admission place. `feed_below` > 0: return early, without a batch,
        as `{"need_window": True, "supply": s}` when no batch is ready and the supply (`supply()`) is below
        it: under `stale_policy: drop` every dropped group shrinks the supply, and without a new window the
        update would wait forever for groups that no longer exist (the trainer passes M, feeds one window,
        and asks again).
        """
        t0 = time.time()
        deadline = t0 + timeout
        with self.lock:
            while True:
                self._raise()
                batch = self.control.next_minibatch(int(train_version))
                if batch is not None:
                    lags = [int(train_version) - int(s.min_version) for g in batch for s in g.samples]
                    d, queue = self.control.dispatcher, self.control.queue
                    return {"groups": batch, "lags": lags, "wait_s": time.time() - t0,
                            "queued": d.queued(), "in_flight": d.in_flight_count(),
                            "ready_left": queue.occupancy(), "counters": queue.counters()}
                supply = self.supply()
                if feed_below > 0 and supply < feed_below:
                    return {"need_window": True, "supply": supply, "wait_s": time.time() - t0,
                            "counters": self.control.queue.counters()}
                self.lock.notify_all()  # stale groups sent back on the way: the loop hands them out
                if time.time() >= deadline:
                    raise TimeoutError(f"no trainable minibatch for version {train_version} within {timeout}s")
                self.lock.wait(timeout=0.05)

    def stats(self) -> Dict[str, Any]:
        with self.lock:
            d, queue = self.control.dispatcher, self.control.queue
            return {"steals": [(s.thief, s.victim, s.gid) for s in d.steals],
                    "queued": d.queued(), "counters": queue.counters(),
                    "deaths": list(self.deaths), "lags": list(queue.all_lags)}

    # ---------------------------------------------------------------- checkpoint (resume_state.py)
    def snapshot(self) -> Dict[str, Any]:
        """One consistent cut (under the lock, `RolloutControl.cut`) with each group's request: trained gids,
        finished untrained groups with their versions, and the groups queued or generating (in flight first,
        each with its instance; -1 = the shared FIFO). A group that finishes after the cut counts as
        generating: a resumed run generates it again."""
        with self.lock:
            cut = self.control.cut()
            return {"trained_gids": cut.trained,
                    "ready": [(self.requests[int(res.group_id)], res, v) for res, v in cut.ready],
                    "unfinished": [(self.requests[gid], j) for gid, j in cut.unfinished], "counters": cut.counters,
                    "isolated": cut.isolated, "dispatch": cut.dispatch}

    def restore(self, version: int, trained_gids: Sequence[int], ready: Sequence[Tuple[GroupRequest, GroupResult, int]],
                unfinished: Sequence[Tuple[GroupRequest, int]], counters: Dict[str, int],
                isolated: Sequence[int] = (), dispatch: Optional[Dict[str, Any]] = None) -> int:
        """Continue a saved run in this fresh driver: its version, its trained groups, its finished groups
        (queued for the trainer under their saved versions) and its unfinished ones, re-dispatched by the
        standalone runtime's restart rule from the saved `dispatch` state (`RolloutControl.restore_cut`).
        Returns the groups queued."""
        with self.lock:
            if self.requests:
                raise RuntimeError("restore needs a fresh rollout driver")
            self.version = int(version)
            for req, _, _ in ready:
                self.requests[int(req.group_id)] = req
            for req, _ in unfinished:
                self.requests[int(req.group_id)] = req
            queued = self.control.restore_cut(trained_gids, [(res, int(v)) for _, res, v in ready],
                                              [(int(req.group_id), int(j)) for req, j in unfinished], counters,
                                              isolated, dispatch)
            self.lock.notify_all()
            return queued

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            self.lock.notify_all()
        self.thread.join(timeout=60)

    def _raise(self) -> None:
        if self.errors:
            raise RunError(self.errors[0])

    # ---------------------------------------------------------------- the loop
    def _admit(self) -> Admission:
        """Hand out what the rollout control admits at the current version (with the stale groups sent back
        for regeneration since the last call)."""
        admission = self.control.admit(self.version)
        for j, t in admission.picks:
            self.pending[j].append((self.requests[t.gid], self.version))
        return admission

    def _issue(self) -> None:
        if self.errors:  # the run is over: nothing more reaches an engine
            return
        for j, ranks in enumerate(self.instances):
            if j in self.outstanding or not self.control.dispatcher.alive[j]:
                continue
            if self.pending[j] or self.control.dispatcher.in_flight_count(j):
                jobs, self.pending[j] = self.pending[j], []
                self.outstanding[j] = [r.run.remote(jobs, self.steps) for r in ranks]
                self.issued_at[j] = time.time()

    def _loop(self) -> None:
        import ray
        while True:
            with self.lock:
                if self.stopped:
                    return
                if not self.paused:
                    self._admit()
                    self._issue()
                owner = {ref: (j, k) for j, refs in self.outstanding.items() for k, ref in enumerate(refs)}
                if not owner:
                    self.lock.wait(timeout=0.05)
                    continue
            # every TP rank's call: a dead rank 1 must be seen while rank 0 waits in a collective for it
            first, _ = ray.wait(list(owner), num_returns=1, timeout=0.05)
            if not first:
                continue
            done, _ = ray.wait(list(owner), num_returns=len(owner), timeout=0)
            done_set = set(done) | set(first)
            for j in sorted({owner[ref][0] for ref in done_set}):
                refs = self.outstanding.get(j)
                if refs is None:
                    continue
                failed: List[int] = []
                cause: Optional[BaseException] = None
                for k, ref in enumerate(refs):
                    if ref not in done_set:
                        continue
                    try:
                        ray.get(ref)
                    except Exception as exc:  # noqa: BLE001 - any failed rank counts as dead; the cause is reported
                        failed.append(k)
                        cause = cause or exc
                if failed:
                    self._on_dead(j, cause, failed)
                    continue
                if not all(ref in done_set for ref in refs):
                    continue  # lockstep ranks finish together: wait for the rest
                self._accept(j, ray.get(refs)[0])

    def _accept(self, j: int, results: Sequence[GroupResult]) -> None:
        """Instance j's lockstep call returned (rank 0's finished groups): into the rollout control."""
        with self.lock:
            self.outstanding.pop(j, None)
            for out in results:
                self.control.finish(j, out)
            self.lock.notify_all()

    def _on_dead(self, j: int, exc: Optional[BaseException], ranks: Sequence[int] = ()) -> None:
        """Record the death of instance j (its TP ranks `ranks` failed with `exc`) and end the run: nothing
        more is issued, and the trainer's next call raises (see the module docstring)."""
        cause = f"{type(exc).__name__}: {exc}" if exc is not None else "unknown cause"
        cause = " ".join(cause.split())[:600]
        names = ", ".join(self.labels[j])
        dead = ", ".join(self.labels[j][k] for k in ranks) or "?"
        with self.lock:
            self.outstanding.pop(j, None)
            self.pending[j] = []
            self.deaths.append({"instance": j, "ranks": list(ranks), "error": cause})
            if not self.errors:
                self.errors.append(
                    f"rollout instance {j} died (TP ranks: {names}; failed: {dead}): {cause}. A weight group "
                    f"spans every instance and cannot be formed again, so the run stops here instead of waiting "
                    f"asp.sync_timeout_s in the next weight sync; resume from the last checkpoint")
            self.lock.notify_all()
