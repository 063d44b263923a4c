"""The window feed records how long the run's loop waited for each window's plan.

A window planned ahead is free only when its search finished before the window was due; one that is still
searching makes the loop wait for the rest, and that wait is planning on the critical path too. The real
WindowPlanner plans here; only its search is slowed (`solve` sleeps first) so the wait is long enough to see.
"""
from __future__ import annotations

import time

import numpy as np

from mindspeed_asp.runtime.engine_steps import EngineStepLog
from mindspeed_asp.runtime.replan import WindowPlanner
from mindspeed_asp.runtime.rollout_control import RolloutControl
from mindspeed_asp.runtime.run_config import load_run_config, packaged_config_path
from mindspeed_asp.runtime.window_feed import WindowFeed

from factories import prompt_set

SLOW_S = 0.4


def _feed(tmp_path, plan_ahead: bool, slow_s: float = 0.0):
    cfg = load_run_config(packaged_config_path(), overrides=[
        "asp.mode=asp", "asp.max_lag=1", f"asp.plan_ahead={str(plan_ahead).lower()}", "asp.online_fit=false",
        "asp.slots=64", "data.num_prompts=32", "run.steps=4"])
    P = cfg.data.num_prompts
    epoch = prompt_set(np.full(P, 12, dtype=np.int64), cfg.data.n, prefix="p")
    prompts = [(f"p{i}", [1] * 12, cfg.data.max_new_tokens) for i in range(P)]
    planner = WindowPlanner(cfg.asp, epoch, cfg.data.max_new_tokens, cfg.asp.instances,
                            rollout_log=tmp_path / "rollout_log.jsonl", seed=0)
    solve = planner.solve

    def slow_solve(pending):
        time.sleep(slow_s)
        return solve(pending)

    planner.solve = slow_solve
    control = RolloutControl("asp", cfg.asp.instances, cfg.asp.max_lag, cfg.asp.minibatch_groups, cfg.asp.slots,
                             cfg.data.n)
    events = []
    feed = WindowFeed(cfg, control, prompts, planner, None, EngineStepLog(planner), finished=lambda gid: True,
                      event=lambda kind, **kw: events.append((kind, kw)))
    return feed, control, events


def _hand_out(control: RolloutControl) -> None:
    """Dispatch the whole window (the slots are many), so the next window is due once the trainer moves on."""
    control.admit(0)
    assert control.dispatcher.queued() == 0


def test_a_window_planned_ahead_but_not_finished_counts_the_wait(tmp_path):
    feed, control, events = _feed(tmp_path, plan_ahead=True, slow_s=SLOW_S)
    feed.ensure_loaded(version=0)  # window 0: nothing to plan ahead from, planned here
    first = feed.loaded_plans[0]
    assert not first["ahead"] and first["wait_seconds"] >= first["plan_seconds"] + SLOW_S * 0.9
    feed.plan_ahead()  # window 1's search starts on the planning thread and sleeps
    _hand_out(control)
    feed.ensure_loaded(version=1)  # due at once (an update later): the loop waits for the rest of the search
    second = feed.loaded_plans[1]
    assert second["ahead"] and second["wait_seconds"] >= SLOW_S * 0.5
    plan_events = [kw for kind, kw in events if kind == "plan"]
    assert [e["wait_seconds"] for e in plan_events] == [round(w["wait_seconds"], 4) for w in feed.loaded_plans]
    feed.shutdown()


def test_a_window_planned_ahead_in_time_waits_for_nothing(tmp_path):
    feed, control, _ = _feed(tmp_path, plan_ahead=True)
    feed.ensure_loaded(version=0)
    feed.plan_ahead()
    feed.prepared[2].result(timeout=120)  # the search finished before the window is due
    _hand_out(control)
    feed.ensure_loaded(version=1)
    second = feed.loaded_plans[1]
    assert second["ahead"] and second["wait_seconds"] < 0.2
    feed.shutdown()
