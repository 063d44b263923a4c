"""Adaptivity: observed response lengths flow into the length history and the next window is re-planned.

The runtime generates an epoch window by window. Every finished group is appended to a rollout log (JSON
Lines, the format `LengthHistory.append_rollout_log` reads) and to the in-memory history; when the
dispatcher needs the next window, `WindowPlanner.plan` estimates that window's lengths from the history as it
is now (so epoch e+1 is planned with what epoch e just showed, and the policy's length drift is followed)
and asks the configured planner (docs/design.md#planning) for per-instance queues and minibatch tags.

The plan is scored with the cost model and rho of the machine the run is on: the first window with the
configured ones, every later window (with `asp.online_fit`) with the cost fitted from the engines' own steps
and the rho measured from the run's own updates and windows (`runtime/online_cost.py`). Each window records
what it was planned with (`WindowPlan.cost`, `.rho`, `.plan_seconds`).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from mindspeed_asp.config import AspSection
from mindspeed_asp.cost_model import cost_from_section
from mindspeed_asp.runtime.online_cost import CostEstimate, OnlineCostFit, RhoEstimate, RhoMeter
from mindspeed_asp.core.problem import Assignment, CostModel, InstanceSpec, PlanningProblem, PromptSet

if TYPE_CHECKING:
    from mindspeed_asp.scheduler.history import LengthHistory


@dataclass
class WindowPlan:
    """The plan of one window: per-instance ordered gids, predicted group tokens and minibatch tags."""

    queues: List[List[int]]
    predicted_tokens: Dict[int, float]
    minibatch: Dict[int, int]
    planner: str
    with_history: int  # groups of this window whose prompt had history when planned
    params: Dict[str, float] = field(default_factory=dict)
    cost: Dict[str, Any] = field(default_factory=dict)  # CostEstimate.as_dict() it was planned with
    rho: Dict[str, Any] = field(default_factory=dict)  # RhoEstimate.as_dict() it was planned with
    plan_seconds: float = 0.0  # wall time of estimating + planning this window
    searched: bool = True  # False: the window reused the last search's choice (the planning budget was spent)
    shared: bool = False  # the planner left the window unpinned: one queue in plan order, least-loaded
    isolated: List[int] = field(default_factory=list)  # gids the plan isolated (Assignment.isolated)


@dataclass
class PendingPlan:
    """A window between `WindowPlanner.prepare` (a snapshot of the history, the cost and rho to plan with) and
    `finish`: `solve` (the length estimate, the problem, the search) needs nothing else, so the driver can run
    it on a thread while its loop keeps dispatching."""

    gids: List[int]
    prompts: PromptSet  # the window's rows
    history: Optional["LengthHistory"]  # a copy, so the loop may go on adding to the live one
    cost: CostEstimate
    rho: RhoEstimate
    problem_seed: int
    seed: int  # of the planner's generator (the window's own: `solve` touches no shared state)
    prepare_seconds: float
    reuse: Optional[Dict[str, Any]] = None  # plan_asp arguments of the last search's choice (no search)
    solve_seconds: float = 0.0
    # filled by `solve`, for `finish`
    with_history: int = 0
    predicted: Optional[np.ndarray] = None  # predicted tokens per group of the window


class WindowPlanner:
    """Keeps the length history of a run and plans each window from it.

    `prompts` is one epoch's PromptSet (row i = prompt i); a window is given as gids
    `epoch * len(prompts) + i`. Every window is scored under `asp.max_lag`, the one value the run's lag policy
    enforces too (resolved with the config: 0 in a lag-0 mode), read once here.
    """

    def __init__(self, asp: AspSection, prompts: PromptSet, max_new_tokens: int, instances: int,
                 rollout_log: Optional[Path] = None, history=None, cost: Optional[CostModel] = None,
                 seed: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        from mindspeed_asp.scheduler.estimators import make_estimator
        from mindspeed_asp.scheduler.history import LengthHistory
        from mindspeed_asp.scheduler.planners import get_planner

        self.asp = asp
        self.max_lag = int(asp.max_lag)  # the lag policy's bound (driver: LagPolicy(cfg.asp.max_lag, ...))
        self.prompts = prompts
        self.max_new_tokens = int(max_new_tokens)
        self.instances = int(instances)
        self.history = history if history is not None else LengthHistory()
        if asp.history_path and Path(asp.history_path).is_file() and history is None:
            self.history = LengthHistory.load(asp.history_path)
        self.estimator = make_estimator(asp.estimator)
        self.planner = get_planner(asp.planner)
        self.cost = cost or cost_from_section(asp.cost)
        self.online_cost = OnlineCostFit(self.cost)
        self.rho_meter = RhoMeter(float(asp.rho or 1.0), asp.minibatch_groups, instances, asp.slots)
        self._window_of: Dict[int, int] = {}  # gid -> index in self.windows (groups not yet back)
        self._window_left: Dict[int, int] = {}  # window index -> groups not yet back
        self._window_rows: Dict[int, Dict[int, List[int]]] = {}  # window index -> gid -> observed lengths
        self.rollout_log = Path(rollout_log) if rollout_log else None
        self.rng = np.random.default_rng(seed)
        self.observed = 0
        self.windows: List[WindowPlan] = []
        # the search's time budget (asp.plan_share of the wall time since the first window): a search is made
        # when the budget saved since the last one covers what that one took, else the choice is reused
        self.plan_credit = 0.0  # seconds of search the budget still allows (negative: a search to pay back)
        self.last_choice: Optional[Dict[str, Any]] = None
        self._t_last_prepare: Optional[float] = None
        self.clock = clock

    def observe(self, prompt_id: str, epoch: int, lengths: Sequence[int], gid: Optional[int] = None,
                **extra) -> None:
        """Record one finished group's response lengths (history + rollout log line); with its `gid`, a
        window whose groups are all back is measured for rho."""
        lengths = [int(x) for x in lengths]
        self.history.add(str(prompt_id), int(epoch), lengths)
        self.observed += 1
        if gid is not None and int(gid) in self._window_of:
            w = self._window_of.pop(int(gid))
            self._window_rows[w][int(gid)] = lengths
            self._window_left[w] -= 1
            if self._window_left[w] == 0:
                rows = self._window_rows.pop(w)
                del self._window_left[w]
                gids = sorted(rows)
                P = len(self.prompts)
                plen = np.asarray([self.prompts.prompt_lens[g % P] for g in gids], dtype=np.float64)
                n = max(len(r) for r in rows.values())
                L = np.zeros((len(gids), n))
                for i, g in enumerate(gids):
                    L[i, :len(rows[g])] = rows[g]
                self.rho_meter.add_window(L, plen)
        if self.rollout_log is not None:
            with open(self.rollout_log, "a") as fh:
                fh.write(json.dumps({"prompt_id": str(prompt_id), "epoch": int(epoch),
                                     "response_lengths": lengths, **extra}) + "\n")

    # ------------------------------------------------------------------ online cost and rho
    def add_engine_steps(self, rows) -> int:
        """Engine steps (active, kv_tokens, prefill_tokens, seconds) the instances ran since the last call."""
        return self.online_cost.add_steps(rows)

    def add_update(self, train_seconds: float) -> None:
        """One optimizer update took `train_seconds` of trainer time."""
        self.rho_meter.add_update(train_seconds)

    def planning_inputs(self) -> "tuple[CostEstimate, RhoEstimate]":
        """The cost and rho the next window is planned with: configured ones for the first window or without
        `asp.online_fit`, else the online fit and the measured rho (each once it has data)."""
        if not self.windows or not getattr(self.asp, "online_fit", False):
            return (CostEstimate(self.cost, "configured"),
                    RhoEstimate(float(self.asp.rho or 1.0), "configured"))
        cost = self.online_cost.estimate()
        return cost, self.rho_meter.estimate(cost.cost)

    def plan(self, gids: Sequence[int], rho: Optional[float] = None, urgent: bool = False) -> WindowPlan:
        """Estimate the window's lengths from the current history and place it on the instances.

        `rho` overrides the planning rho (tests); by default it is `planning_inputs()`'s. `urgent`: the caller
        waits for this plan (see `prepare`)."""
        pending = self.prepare(gids, rho, urgent=urgent)
        return self.finish(pending, self.solve(pending))

    def prepare(self, gids: Sequence[int], rho: Optional[float] = None, urgent: bool = False) -> PendingPlan:
        """What planning the window needs from the run's state: a copy of the history as it is now, the cost
        and rho to score with, the search-or-reuse decision. Runs where `observe` runs (it reads the history);
        kept to a copy because the driver's loop waits for it, while `solve` runs on a thread of its own
        (estimating a window's lengths took ~30 ms of the loop per window on the CPU runtime).

        `urgent` (a window the driver could not plan ahead, so dispatch waits for it): reuse the last search's
        choice whatever the budget says, so that no search (0.1-0.25 s on the CPU tier, against 20-40 ms for
        building a reused choice) holds up dispatch; the budget it leaves goes to the next window planned
        ahead. The first window is searched anyway: there is no choice to reuse yet."""
        t0 = time.perf_counter()
        cost_est, rho_est = self.planning_inputs()
        if rho is not None:
            rho_est = RhoEstimate(float(rho), "argument")
        P = len(self.prompts)
        rows = np.asarray([g % P for g in gids], dtype=np.int64)
        return PendingPlan(gids=[int(g) for g in gids], prompts=self.prompts.subset(rows),
                           history=self.history.select_epochs() if len(self.history) else None,
                           cost=cost_est, rho=rho_est, problem_seed=int(self.rng.integers(1 << 31)),
                           seed=int(self.rng.integers(1 << 31)), prepare_seconds=time.perf_counter() - t0,
                           reuse=self._reuse_or_search(urgent))

    def _estimate(self, pending: PendingPlan) -> PlanningProblem:
        """The window's planning problem: its lengths estimated from the history snapshot of `prepare`."""
        sub = pending.prompts
        est = self.estimator.estimate(sub, pending.history, self.max_new_tokens)
        pending.with_history = int(np.sum(est.has_history))
        pending.predicted = est.sample_lengths(sub.n).sum(axis=1)
        return PlanningProblem(prompts=sub, estimate=est, instances=self.instances,
                               spec=InstanceSpec(slots=self.asp.slots, kv_budget=self.asp.kv_budget_tokens),
                               minibatch=self.asp.minibatch_groups, cost=pending.cost.cost,
                               max_new_tokens=self.max_new_tokens, rho=max(float(pending.rho.rho), 1e-6),
                               seed=pending.problem_seed, max_lag=self.max_lag,
                               work_stealing=bool(self.asp.work_stealing))

    def _reuse_or_search(self, urgent: bool = False) -> Optional[Dict[str, Any]]:
        """The last search's choice when the planning budget saved since it does not cover another search.

        Why: where windows roll out in a second or two (a CPU run) a 0.2 s search per window takes a large
        share of the cores the instances generate on; where they take minutes every window is searched.
        Reusing the choice of theta, order rule and eps is what `build_plan` does between `reselect_every`
        windows."""
        now = self.clock()
        if self._t_last_prepare is not None:
            self.plan_credit += float(self.asp.plan_share) * (now - self._t_last_prepare)
        self._t_last_prepare = now
        if self.last_choice is None:
            return None
        if self.plan_credit >= 0.0 and not urgent:  # the last search's time is paid back
            return None
        return dict(self.last_choice)

    def solve(self, pending: PendingPlan) -> Assignment:
        """Estimate the window's lengths and place it (the planner's search): a function of `pending` alone,
        safe on another thread."""
        t0 = time.perf_counter()
        problem = self._estimate(pending)
        rng = np.random.default_rng(pending.seed)
        if pending.reuse is not None:
            from mindspeed_asp.scheduler.asp_planner import plan_asp
            assignment = plan_asp(problem, rng, name=self.asp.planner, **pending.reuse)
            assignment.params["reused_choice"] = 1.0
        else:
            assignment = self.planner(problem, rng)
        assignment.validate(len(pending.gids))
        pending.solve_seconds = time.perf_counter() - t0
        return assignment

    def finish(self, pending: PendingPlan, assignment: Assignment) -> WindowPlan:
        """The window's plan in gids, recorded as planned (its groups then count towards the rho meter)."""
        gids, pred = pending.gids, pending.predicted
        searched = pending.reuse is None
        if searched and self.asp.planner == "asp" and assignment.params.get("scenarios", 0.0) > 0:
            from mindspeed_asp.scheduler.asp_planner import fixed_choice
            self.last_choice = fixed_choice(assignment.params)
            self.plan_credit -= pending.solve_seconds
        plan = WindowPlan(
            queues=[[int(gids[i]) for i in order] for order in assignment.orders],
            predicted_tokens={int(gids[i]): float(pred[i]) for i in range(len(gids))},
            minibatch={int(gids[i]): int(assignment.minibatch[i]) for i in range(len(gids))},
            planner=assignment.planner, with_history=pending.with_history,
            params=dict(assignment.params), cost=pending.cost.as_dict(), rho=pending.rho.as_dict(),
            plan_seconds=pending.prepare_seconds + pending.solve_seconds, shared=bool(assignment.shared),
            isolated=[int(gids[i]) for i in assignment.isolated], searched=searched)
        w = len(self.windows)
        self.windows.append(plan)
        self._window_left[w] = len(gids)
        self._window_rows[w] = {}
        for g in gids:
            self._window_of[int(g)] = w
        return plan

    def save_history(self, path: Path) -> None:
        self.history.save(path)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> Dict[str, Any]:
        """The length history as records, the planner's random state and how much of the rollout log is
        the checkpointed run's (its size in bytes), as plain data."""
        pid, epoch, offsets, values = self.history.records()
        log_bytes = self.rollout_log.stat().st_size if self.rollout_log and self.rollout_log.is_file() else 0
        return {"history": [{"prompt_id": str(pid[r]), "epoch": int(epoch[r]),
                             "lengths": values[offsets[r]:offsets[r + 1]].tolist()} for r in range(len(pid))],
                "rng": self.rng.bit_generator.state, "observed": self.observed, "rollout_log_bytes": log_bytes}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue a checkpointed run's history: lengths observed after the checkpoint (groups that were
        still generating, or a crash after it) are cut from the rollout log, so each group's lengths appear
        once when those groups are generated again."""
        from mindspeed_asp.errors import InputError
        from mindspeed_asp.scheduler.history import LengthHistory

        self.history = LengthHistory()
        for rec in state["history"]:
            self.history.add(rec["prompt_id"], int(rec["epoch"]), rec["lengths"])
        self.rng.bit_generator.state = state["rng"]
        self.observed = int(state["observed"])
        size = int(state["rollout_log_bytes"])
        if self.rollout_log is not None:
            have = self.rollout_log.stat().st_size if self.rollout_log.is_file() else 0
            if have < size:
                raise InputError(f"rollout log holds {have} bytes, the checkpoint counted {size}: it was changed "
                                 f"after the checkpoint", path=str(self.rollout_log))
            if have > size:
                with open(self.rollout_log, "r+b") as fh:
                    fh.truncate(size)
