"""Which groups the standalone runtime loads next, and how each window is planned (docs/runtime.md,
"Planning each window").

The driver's loop asks `ensure_loaded` once per turn. Stock loads iteration k's M groups once the previous
iteration is trained; the streaming modes load the next window when the dispatcher has handed out the
previous one and the max-lag counter admits more work, so a window is planned with every length observed up
to that moment. asp places each window with the `WindowPlanner` (from the length history, re-planned as
lengths come in); with `asp.plan_ahead` the next window's search starts on a thread of its own while the loop
waits, so loading it costs no planning time on the critical path. Epoch 0 of a run with `asp.plan_path`
takes the offline plan file's iterations instead.

Group ids: gid = epoch * P + prompt index, so every epoch's groups are distinct and a result names its
prompt and epoch.
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from mindspeed_asp.runtime.dispatcher import Ticket

if TYPE_CHECKING:
    from mindspeed_asp.runtime.engine_steps import EngineStepLog
    from mindspeed_asp.runtime.replan import WindowPlanner
    from mindspeed_asp.runtime.rollout_control import RolloutControl
    from mindspeed_asp.runtime.run_config import RunConfig
    from mindspeed_asp.scheduler.plan_file import DispatchPlan


@dataclass
class GroupInfo:
    """What the driver knows about one group (gid = epoch * P + prompt index)."""

    gid: int
    epoch: int
    prompt_index: int
    dispatch_version: int = -1
    window: int = 0


class WindowFeed:
    """Loads windows of groups into the rollout control, planned (asp) or in dataset order.

    `prompts[i]` is the task's prompt i: (prompt id, token ids, its cap on new tokens, the load measure of an
    unplanned group); `finished(gid)`
    says whether a group's lengths came back (plan-ahead waits for the previous epoch of a window's prompts);
    `event` writes the run's event log.
    """

    def __init__(self, cfg: "RunConfig", control: "RolloutControl", prompts: Sequence[Tuple[str, Any, int]],
                 planner: Optional["WindowPlanner"], plan_file: Optional["DispatchPlan"],
                 engine_steps: "EngineStepLog", finished: Callable[[int], bool],
                 event: Callable[..., None]) -> None:
        self.cfg = cfg
        self.mode = cfg.asp.mode
        self.M = cfg.asp.minibatch_groups
        self.control = control
        self.prompt_ids = [str(p[0]) for p in prompts]
        self.prompt_caps = [int(p[2]) for p in prompts]
        self.P = len(prompts)
        self.planner = planner
        self.plan_file = plan_file
        self.engine_steps = engine_steps
        self.finished = finished
        self.event = event
        self.next_gid = 0
        self.window_index = 0
        self.plan_iteration = 0
        self.infos: Dict[int, GroupInfo] = {}
        self.minibatch_tag: Dict[int, int] = {}  # gid -> the plan's minibatch tag
        self.loaded_plans: List[Dict[str, Any]] = []  # each loaded window: what it was planned with, its queues
        # (gids, PendingPlan, Future of its Assignment): the next window, being planned on `plan_thread` while
        # the loop goes on dispatching and collecting
        self.prepared: Optional[tuple] = None
        self.plan_thread: Optional[ThreadPoolExecutor] = None

    # ------------------------------------------------------------------ when
    def needed_groups(self) -> int:
        """Groups the run trains in all, plus one per stale group dropped (each dropped group is replaced)."""
        return self.cfg.run.steps * self.M + self.control.queue.dropped_stale

    def window_size(self) -> int:
        return self.cfg.asp.replan_every * self.M if self.cfg.asp.replan_every > 0 else self.P

    def ensure_loaded(self, version: int) -> None:
        """Load the next window if it is due (see the module docstring)."""
        if self.next_gid >= self.needed_groups():
            return
        d = self.control.dispatcher
        if self.mode == "stock":
            if d.idle() and self.control.queue.occupancy() == 0:
                self._load(self.M)
            return
        if d.queued() == 0 and self.control.lag_policy.admits(version):
            self._load(self.window_size())

    # ------------------------------------------------------------------ what
    def _new_gids(self, size: int) -> List[int]:
        size = min(size, self.needed_groups() - self.next_gid)
        gids = list(range(self.next_gid, self.next_gid + size))
        self.next_gid += size
        for g in gids:
            self.infos[g] = GroupInfo(g, g // self.P, g % self.P, window=self.window_index)
        return gids

    def _load(self, size: int) -> None:
        if self.plan_file is not None and self.next_gid < self.P:
            self._load_from_plan_file()
        elif self.planner is not None:
            self._load_planned(self._new_gids(size))
        else:
            gids = self._new_gids(size)
            self.control.load_window([Ticket(g, float(self.prompt_caps[g % self.P])) for g in gids])
        self.window_index += 1

    def _load_planned(self, gids: List[int]) -> None:
        ahead = self.prepared is not None and self.prepared[0] == gids
        t0 = time.perf_counter()
        if ahead:
            _, pending, future = self.prepared
            plan = self.planner.finish(pending, future.result())  # waits only if it is still planning
        else:
            if self.prepared is not None:  # planned for other groups (stale drops changed the count)
                self.prepared[2].cancel()
            plan = self._plan_window(gids)
        # what the loop waited here: the whole planning of a window not planned ahead, the rest of the search
        # of one planned ahead but not finished yet (0 when it was ready)
        wait_seconds = time.perf_counter() - t0
        self.prepared = None
        self.loaded_plans.append({"window": self.window_index, "groups": len(gids), "planner": plan.planner,
                                  "ahead": ahead, "plan_seconds": plan.plan_seconds,
                                  "wait_seconds": wait_seconds, "cost": plan.cost,
                                  "rho": plan.rho, "queues": plan.queues, "shared": plan.shared,
                                  "isolated": plan.isolated, "searched": plan.searched,
                                  "minibatch": [plan.minibatch[g] for g in gids], "gids": gids})
        self.minibatch_tag.update(plan.minibatch)
        self.control.load_window([Ticket(g, plan.predicted_tokens[g]) for g in gids], plan_queues=plan.queues,
                                 shared=plan.shared, isolated=plan.isolated)
        self.event("plan", window=self.window_index, groups=len(gids), with_history=plan.with_history,
                   planner=plan.planner, ahead=ahead, shared=plan.shared, isolated=len(plan.isolated),
                   plan_seconds=round(plan.plan_seconds, 4), wait_seconds=round(wait_seconds, 4), cost=plan.cost,
                   rho=plan.rho)

    def _plan_window(self, gids: List[int]):
        """Plan `gids` with the engine steps read so far (the online cost fit) and the measured rho. With
        `asp.plan_ahead` a window planned here is one the loop could not plan ahead: dispatch waits for it, so
        it reuses the last search's choice instead of searching (`WindowPlanner.prepare`, `urgent`)."""
        if self.cfg.asp.online_fit:
            self.engine_steps.read()
        return self.planner.plan(gids, urgent=bool(self.cfg.asp.plan_ahead))

    def _load_from_plan_file(self) -> None:
        """Epoch 0 of an asp run with `asp.plan_path`: the file's next iteration, queues as planned offline
        (later epochs are re-planned from the observed lengths)."""
        plan = self.plan_file
        it = plan.iterations()[self.plan_iteration]
        self.plan_iteration += 1
        gids = [int(r) for r in plan.iteration_rows(it)]
        queues = [[int(r) for r in plan.instance_rows(it, j)] for j in range(self.cfg.asp.instances)]
        self.next_gid = max(self.next_gid, max(gids) + 1)
        tickets = []
        for g in gids:
            self.infos[g] = GroupInfo(g, 0, g, window=self.window_index)
            pid = self.prompt_ids[g]
            self.minibatch_tag[g] = int(plan.minibatch_of(pid))
            tickets.append(Ticket(g, float(plan.predicted(pid).get("pred_group_max", 1.0)) * self.cfg.data.n))
        shared = plan.is_shared(it)
        isolated = [int(r) for r in plan.isolated_rows(it)]
        self.control.load_window(tickets, plan_queues=queues, shared=shared, isolated=isolated)
        self.event("plan", window=self.window_index, groups=len(gids), with_history=-1,
                   planner=f"file:{plan.path}", shared=shared, isolated=len(isolated))

    # ------------------------------------------------------------------ planning ahead
    def plan_ahead(self) -> None:
        """Streaming asp, while the driver waits: start planning the next window on a thread of its own, so
        that loading it later costs no planning time and the loop goes on collecting and dispatching while
        the planner searches; only once every group of the previous epoch of the window's prompts came back,
        so the plan sees the same per-prompt history as at load time. Only a copy of the history is taken
        here, on the loop's thread (the loop writes the history); the length estimate and the search
        (`WindowPlanner.solve`) run on the planning thread."""
        if (self.planner is None or self.mode != "asp" or self.prepared is not None or self.plan_file is not None
                or not self.cfg.asp.plan_ahead):
            return
        size = min(self.window_size(), self.needed_groups() - self.next_gid)
        if size <= 0:
            return
        gids = list(range(self.next_gid, self.next_gid + size))
        if any(g >= self.P and not self.finished(g - self.P) for g in gids):
            return  # a prompt's previous-epoch lengths are still coming: plan when the window is due
        if self.cfg.asp.online_fit and not self.engine_steps.read(wait=False):
            return  # the instances' step logs are on their way: plan at the next idle moment
        pending = self.planner.prepare(gids)
        if self.plan_thread is None:
            self.plan_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asp-plan")
        future: Future = self.plan_thread.submit(self.planner.solve, pending)
        self.prepared = (gids, pending, future)

    def shutdown(self) -> None:
        if self.plan_thread is not None:
            self.plan_thread.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> Dict[str, Any]:
        """The cursor and the per-group records (the keys of the checkpoint's `driver` section)."""
        return {"next_gid": self.next_gid, "window_index": self.window_index, "plan_iteration": self.plan_iteration,
                "minibatch_tag": dict(self.minibatch_tag), "infos": [asdict(i) for i in self.infos.values()]}

    def load_state_dict(self, d: Dict[str, Any]) -> None:
        self.next_gid, self.window_index = int(d["next_gid"]), int(d["window_index"])
        self.plan_iteration = int(d["plan_iteration"])
        self.minibatch_tag = {int(g): int(tag) for g, tag in d["minibatch_tag"].items()}
        self.infos = {int(i["gid"]): GroupInfo(**i) for i in d["infos"]}


def load_plan_file(cfg: "RunConfig", prompt_set: Any) -> "DispatchPlan":
    """`asp.plan_path`, checked against every setting the plan depends on (asp train checks it before Ray
    starts; code that calls run_training directly, benchmarks and the demo, gets the same refusal here)."""
    from mindspeed_asp.errors import RunError
    from mindspeed_asp.runtime.run_config import PLAN_SETTING_KEYS, plan_settings
    from mindspeed_asp.scheduler.plan_file import DispatchPlan

    plan = DispatchPlan.load(cfg.asp.plan_path, prompts=prompt_set)
    if plan.instances != cfg.asp.instances:
        raise RunError(f"plan {cfg.asp.plan_path} is for {plan.instances} instances, "
                       f"the run has asp.instances={cfg.asp.instances}")
    plan.check_settings(plan_settings(cfg, len(prompt_set.prompt_ids)), PLAN_SETTING_KEYS)
    return plan
