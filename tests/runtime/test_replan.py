"""Adaptivity without vLLM: observed lengths -> history + rollout log -> the next window's plan."""
from __future__ import annotations

import numpy as np

from mindspeed_asp.config import AspSection
from mindspeed_asp.runtime.replan import WindowPlanner
from mindspeed_asp.scheduler.history import LengthHistory
from mindspeed_asp.core.problem import PromptSet

from factories import prompt_set


def prompts(P: int = 16, n: int = 4) -> PromptSet:
    """`P` prompts `p0..` of 6 tokens: the replanning tests vary the lengths they observe, not the prompts."""
    return prompt_set(np.full(P, 6, dtype=np.int64), n, prefix="p")


def test_next_window_uses_observed_lengths(tmp_path):
    ps = prompts()
    log = tmp_path / "rollout_log.jsonl"
    wp = WindowPlanner(AspSection(slots=16, minibatch_groups=4), ps, max_new_tokens=200, instances=2,
                       rollout_log=log)
    first = wp.plan(list(range(16)))
    assert first.with_history == 0
    assert sorted(g for q in first.queues for g in q) == list(range(16))
    # epoch 0: prompt i produced lengths around 10 * (i + 1)
    for i in range(16):
        wp.observe(f"p{i}", 0, [10 * (i + 1)] * 4)
    second = wp.plan(list(range(16, 32)))  # epoch 1 of the same prompts
    assert second.with_history == 16
    pred = np.array([second.predicted_tokens[16 + i] for i in range(16)])
    assert np.all(np.diff(pred) > 0)  # predictions follow the observed ordering
    loads = [sum(second.predicted_tokens[g] for g in q) for q in second.queues]
    assert max(loads) / min(loads) < 1.5  # balanced on predicted work, not on counts
    assert set(second.minibatch) == set(range(16, 32))
    # the rollout log is what LengthHistory.append_rollout_log reads
    h = LengthHistory()
    assert h.append_rollout_log(log) == 16
    assert h.latest_epoch() == 0


def test_a_shared_window_reaches_the_dispatcher_as_one_queue():
    """A window the planner leaves unpinned is loaded as one FIFO in its order (not as instance queues)."""
    from mindspeed_asp.runtime.dispatcher import Dispatcher, Ticket

    ps = prompts()
    wp = WindowPlanner(AspSection(slots=16, minibatch_groups=4, planner="shared_desc"), ps, max_new_tokens=200,
                       instances=2)
    for i in range(16):
        wp.observe(f"p{i}", 0, [10 * (i + 1)] * 4)
    plan = wp.plan(list(range(16, 32)))
    assert plan.shared
    d = Dispatcher("plan", instances=2, capacity=3)
    d.load_window([Ticket(g, plan.predicted_tokens[g]) for g in range(16, 32)], plan_queues=plan.queues,
                  shared=plan.shared)
    assert all(not q for q in d.queues)
    assert [t.gid for t in d.fifo] == list(range(31, 15, -1))  # longest predicted first: the last prompts
    picks = d.fill()
    assert [t.gid for _, t in picks] == [31, 30, 29, 28, 27, 26] and d.steals == []


def budgeted_planner(now):
    """A planner with a 5% search budget on the clock `now[0]`, one epoch of history for 32 prompts."""
    wp = WindowPlanner(AspSection(slots=16, minibatch_groups=4, plan_share=0.05), prompts(P=32),
                       max_new_tokens=200, instances=2, clock=lambda: now[0])
    for i in range(32):
        wp.observe(f"p{i}", 0, [5 * (i % 7 + 1)] * 4)
    return wp


def test_the_search_keeps_to_its_share_of_the_wall_time():
    """asp.plan_share: a window due before the last search's time is paid back reuses that search's choice
    (no scoring); once enough wall time has passed, the next window is searched again."""
    now = [0.0]
    wp = budgeted_planner(now)
    first = wp.plan(list(range(32, 40)))
    assert first.searched and first.params["scenarios"] > 0
    cost = first.plan_seconds
    now[0] += 0.5 * cost / 0.05  # half the wall time the search's cost needs at a 5% share
    second = wp.plan(list(range(40, 48)))
    assert not second.searched and second.params.get("reused_choice") == 1.0
    assert second.params["order_rule"] == first.params["order_rule"]
    assert sorted(g for q in second.queues for g in q) == list(range(40, 48))
    now[0] += 2.0 * cost / 0.05  # now the budget covers it
    third = wp.plan(list(range(48, 56)))
    assert third.searched and "reused_choice" not in third.params


def test_a_window_dispatch_waits_for_reuses_the_last_choice_whatever_the_budget():
    """`urgent` (the driver could not plan the window ahead): no search holds up dispatch, the last search's
    choice is rebuilt instead even when the budget would pay for a search; the first window has no choice to
    reuse and is searched; the budget left goes to the next window planned ahead."""
    now = [0.0]
    wp = budgeted_planner(now)
    first = wp.plan(list(range(32, 40)), urgent=True)
    assert first.searched and first.params["scenarios"] > 0
    now[0] += 100.0 * first.plan_seconds / 0.05  # far more budget than one search needs
    second = wp.plan(list(range(40, 48)), urgent=True)
    assert not second.searched and second.params.get("reused_choice") == 1.0
    assert second.params["order_rule"] == first.params["order_rule"]
    assert sorted(g for q in second.queues for g in q) == list(range(40, 48))
    third = wp.plan(list(range(48, 56)))  # planned ahead: the budget is still there
    assert third.searched and "reused_choice" not in third.params


def test_the_estimate_runs_in_solve_on_the_history_as_prepare_saw_it():
    """`prepare` (the driver's loop thread) only copies the history; `solve` (the planning thread) estimates
    from that copy, so groups the loop records meanwhile neither race with it nor leak into the plan."""
    from concurrent.futures import ThreadPoolExecutor

    ps = prompts()
    wp = WindowPlanner(AspSection(slots=16, minibatch_groups=4, planner="lpt"), ps, max_new_tokens=200,
                       instances=2)
    for i in range(8):  # half of the prompts have an epoch of history
        wp.observe(f"p{i}", 0, [10 * (i + 1)] * 4)
    pending = wp.prepare(list(range(16, 32)))
    assert pending.predicted is None  # nothing estimated on the loop's thread
    for i in range(8, 16):  # the loop goes on recording the other half
        wp.observe(f"p{i}", 0, [500] * 4)
    with ThreadPoolExecutor(max_workers=1) as pool:
        plan = wp.finish(pending, pool.submit(wp.solve, pending).result())
    assert plan.with_history == 8  # the plan saw the history as it was at prepare
    assert len(wp.history.prompt_ids()) == 16  # while the live history has all of it
    again = wp.plan(list(range(16, 32)))
    assert again.with_history == 16


def test_the_planner_scores_with_the_lag_the_policy_enforces():
    """One max_lag for the window planner and the lag policy: the config's, resolved with its mode (stock trains
    at lag 0, so an unset max_lag is 0 there, and the planner scores stock windows at 0, not at the default 1)."""
    from mindspeed_asp.core.policy import LagPolicy

    for asp, want in ((AspSection(mode="stock", slots=16, minibatch_groups=4), 0),
                      (AspSection(slots=16, minibatch_groups=4), 1),
                      (AspSection(slots=16, minibatch_groups=4, max_lag=3), 3)):
        wp = WindowPlanner(asp, prompts(), max_new_tokens=200, instances=2, seed=0)
        problem = wp._estimate(wp.prepare(list(range(16))))
        assert problem.max_lag == wp.max_lag == LagPolicy(asp.max_lag, asp.minibatch_groups).max_lag == want
