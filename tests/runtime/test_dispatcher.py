"""Dispatcher rules: stock chunks, least-loaded, plan order, stealing, admission, re-dispatch on death."""
from __future__ import annotations

import pytest

from mindspeed_asp.core.policy import LagPolicy
from mindspeed_asp.runtime.dispatcher import Dispatcher, Ticket


def tickets(n, pred=None):
    return [Ticket(g, float(pred[g]) if pred else 1.0) for g in range(n)]


def test_stock_gives_contiguous_dataset_ordered_chunks():
    d = Dispatcher("stock", instances=2)
    d.load_window(tickets(5))
    out = d.fill()
    by = {0: [], 1: []}
    for j, t in out:
        by[j].append(t.gid)
    assert by == {0: [0, 1, 2], 1: [3, 4]}
    assert d.fill() == [] and d.in_flight_count() == 5


def test_least_loaded_picks_fewest_in_flight_in_dataset_order():
    d = Dispatcher("least_loaded", instances=2, capacity=2)
    d.load_window(tickets(6))
    out = d.fill()
    assert [t.gid for _, t in out] == [0, 1, 2, 3]
    assert sorted(j for j, _ in out) == [0, 0, 1, 1]
    j0 = d.owner(0)
    assert d.on_finished(j0, 0)
    nxt = d.fill()
    assert nxt == [(j0, nxt[0][1])] and nxt[0][1].gid == 4


def test_plan_order_is_followed_then_tail_is_stolen():
    pred = {g: 10.0 * (g + 1) for g in range(6)}
    d = Dispatcher("plan", instances=2, capacity=1, clock=lambda: 1.0)
    d.load_window(tickets(6, pred), plan_queues=[[5, 0, 1, 2], [4, 3]])
    first = dict((j, t.gid) for j, t in d.fill())
    assert first == {0: 5, 1: 4}
    assert d.on_finished(1, 4)
    assert [(j, t.gid) for j, t in d.fill()] == [(1, 3)]
    assert d.on_finished(1, 3)
    # instance 1's queue is empty: it steals from the tail of instance 0's queue
    assert [(j, t.gid) for j, t in d.fill()] == [(1, 2)]
    assert [(s.thief, s.victim, s.gid) for s in d.steals] == [(1, 0, 2)]
    assert list(t.gid for t in d.queues[0]) == [0, 1]


def test_own_work_goes_first_then_the_thief_steals():
    # instance 0 is idle with an empty queue; instance 1 has its own work: under a budget of one, instance 1
    # takes its own head (the plan), and instance 0 steals only with the next admission
    lag = LagPolicy(max_lag=0, minibatch_groups=1)
    d = Dispatcher("plan", instances=2, capacity=1, clock=lambda: 0.0, lag=lag)
    d.load_window(tickets(3), plan_queues=[[], [0, 1, 2]])
    assert [(j, t.gid) for j, t in d.fill(version=0)] == [(1, 0)]
    assert d.steals == []
    assert [(j, t.gid) for j, t in d.fill(version=1)] == [(0, 2)]
    assert [(s.thief, s.victim, s.gid) for s in d.steals] == [(0, 1, 2)]


def test_no_stealing_when_disabled():
    d = Dispatcher("plan", instances=2, capacity=1, work_stealing=False)
    d.load_window(tickets(3), plan_queues=[[0, 1, 2], []])
    assert [(j, t.gid) for j, t in d.fill()] == [(0, 0)]
    assert d.steals == []


def test_lag_policy_caps_dispatch_and_counts_dispatches_and_losses():
    lag = LagPolicy(max_lag=0, minibatch_groups=4)
    d = Dispatcher("least_loaded", instances=2, capacity=8, lag=lag)
    d.load_window(tickets(20))
    out = d.fill(version=0)
    assert len(out) == 4 and all(t.version == 0 for _, t in out)
    assert d.fill(version=0) == [] and lag.accepted == 4 and lag.untrained[0] == 4
    with pytest.raises(ValueError, match="version"):
        d.fill()
    lost = d.in_flight_count(0)
    d.on_instance_dead(0)  # its groups no longer hold a place: their re-dispatch counts them again
    assert lag.accepted == 4 - lost and lag.lost == lost
    again = d.fill(version=0)
    assert len(again) == lost and all(j == 1 for j, _ in again)
    # the policy would admit 8 more at version 2 ((2+0+1)*4 = 12), the live instance has room for 4 (capacity 8)
    assert len(d.fill(version=2)) == 4 and lag.budget(2) == 4
    assert lag.accepted == 8 and lag.untrained[2] == 4


def test_dead_instance_groups_are_redispatched_once():
    d = Dispatcher("plan", instances=3, capacity=2)
    d.load_window(tickets(9), plan_queues=[[0, 1, 2], [3, 4, 5], [6, 7, 8]])
    d.fill()
    lost = d.on_instance_dead(1)
    assert set(lost) == {3, 4, 5}
    assert not d.on_finished(1, 3)  # a late result from the dead instance is refused
    seen = []
    while not d.idle():
        for j, t in d.fill():
            assert j != 1
        for j in (0, 2):
            for gid in list(d.in_flight[j]):
                assert d.on_finished(j, gid)
                seen.append(gid)
    assert len(seen) == len(set(seen))
    assert d.done == set(range(9)) and d.redispatched == 2


def test_a_death_marked_in_the_shared_liveness_list_is_still_handled_once():
    """The rollout pool shares the dispatcher's `alive` list and marks an instance dead before calling the
    dispatcher's death hook: the hook must still hand the instance's groups on, once."""
    d = Dispatcher("plan", instances=2, capacity=2)
    shared = d.alive
    d.load_window(tickets(4), plan_queues=[[0, 1], [2, 3]])
    d.fill()
    shared[1] = False  # what RolloutPool.mark_dead does first
    assert set(d.on_instance_dead(1)) == {2, 3} and d.on_instance_dead(1) == []
    assert not d.on_finished(1, 2)
    d.load_state_dict(d.state_dict())  # a resume restores liveness in place: the pool's list is the same object
    assert d.alive is shared and shared == [True, True]


@pytest.mark.parametrize("policy", ["stock", "least_loaded", "plan"])
def test_every_group_done_exactly_once_with_death(policy):
    d = Dispatcher(policy, instances=2, capacity=None if policy == "stock" else 2)
    ts = tickets(10)
    d.load_window(ts, plan_queues=[[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]] if policy == "plan" else None)
    d.fill()
    d.on_instance_dead(0)
    finished = []
    while not d.idle():
        d.fill()
        for gid in list(d.in_flight[1]):
            assert d.on_finished(1, gid)
            finished.append(gid)
    assert sorted(finished) == list(range(10))


def test_duplicate_window_and_bad_plan_are_rejected():
    d = Dispatcher("plan", instances=2)
    with pytest.raises(ValueError):
        d.load_window(tickets(3), plan_queues=[[0, 1], [1]])
    d.load_window(tickets(2), plan_queues=[[0], [1]])
    with pytest.raises(ValueError):
        d.load_window(tickets(1), plan_queues=[[0], []])


def test_requeue_puts_stale_group_first():
    d = Dispatcher("least_loaded", instances=1, capacity=1)
    d.load_window(tickets(3))
    (j, t), = d.fill()
    assert d.on_finished(j, t.gid)
    d.requeue(t.gid)
    assert [x.gid for x in d.fifo] == [0, 1, 2]
    assert d.fifo[0].attempt == 1


def test_a_shared_plan_window_goes_least_loaded_in_plan_order():
    d = Dispatcher("plan", instances=2, capacity=2)
    d.load_window(tickets(5), plan_queues=[[4, 0, 2], [1, 3]], shared=True)  # queue: 4, 1, 0, 3, 2
    out = d.fill()
    assert [t.gid for _, t in out] == [4, 1, 0, 3]
    assert sorted(j for j, _ in out) == [0, 0, 1, 1] and d.steals == []
    j = d.owner(1)
    assert d.on_finished(j, 1)
    assert [(k, t.gid) for k, t in d.fill()] == [(j, 2)]


def test_windows_go_out_oldest_first_whether_pinned_or_shared():
    d = Dispatcher("plan", instances=2, capacity=1)
    d.load_window(tickets(4), plan_queues=[[0, 1], [2, 3]], shared=True)
    d.load_window([Ticket(g) for g in (4, 5)], plan_queues=[[4], [5]])  # a newer pinned window
    first = d.fill()
    assert sorted(t.gid for _, t in first) == [0, 2]  # the older shared window first
    for j, t in first:
        assert d.on_finished(j, t.gid)
    assert sorted(t.gid for _, t in d.fill()) == [1, 3]
    d2 = Dispatcher("plan", instances=2, capacity=1)
    d2.load_window(tickets(4), plan_queues=[[0, 1], [2, 3]])
    d2.load_window([Ticket(g) for g in (4, 5)], plan_queues=[[4, 5], []], shared=True)  # newer shared window
    assert sorted(t.gid for _, t in d2.fill()) == [0, 2]  # pinned, older work first
    state = d2.state_dict()
    d3 = Dispatcher("plan", instances=2, capacity=1)
    d3.load_state_dict(state)
    assert d3.window_of == d2.window_of and d3.windows_loaded == d2.windows_loaded == 2


def test_an_instance_running_an_isolated_group_does_not_steal():
    # instance 0 runs the isolated group 0 and has a free slot; instance 1 holds the queued work. Instance 0
    # may steal only once group 0 is done; a free instance without an isolated group steals at once.
    d = Dispatcher("plan", instances=3, capacity=2, clock=lambda: 0.0)
    d.load_window(tickets(6), plan_queues=[[0], [1, 2, 3, 4, 5], []], isolated=[0])
    first = [(j, t.gid) for j, t in d.fill()]
    assert (0, 0) in first
    assert all(s.thief != 0 for s in d.steals)
    assert any(s.thief == 2 for s in d.steals)  # the other free instance stole instead
    assert d.on_finished(0, 0)
    assert d.on_finished(2, d.steals[0].gid)
    more = [(j, t.gid) for j, t in d.fill()]
    assert any(j == 0 for j, _ in more) and any(s.thief == 0 for s in d.steals)
    # without the isolation, instance 0 steals beside group 0 from the start
    d2 = Dispatcher("plan", instances=3, capacity=2, clock=lambda: 0.0)
    d2.load_window(tickets(6), plan_queues=[[0], [1, 2, 3, 4, 5], []])
    d2.fill()
    assert any(s.thief == 0 for s in d2.steals)


def test_isolated_groups_must_belong_to_the_window_and_survive_a_checkpoint():
    d = Dispatcher("plan", instances=2, capacity=1)
    with pytest.raises(ValueError, match="isolated group 7"):
        d.load_window(tickets(2), plan_queues=[[0], [1]], isolated=[7])
    assert d.queued() == 0 and d.isolated == set()  # a refused window leaves nothing behind
    d.load_window(tickets(2), plan_queues=[[0], [1]], isolated=[1])
    d2 = Dispatcher("plan", instances=2, capacity=1)
    d2.load_state_dict(d.state_dict())
    assert d2.isolated == {1}
