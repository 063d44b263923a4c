"""The sample queue on the shared lag policy: audit, order, stale handling, synchronous max_lag=0, no double
training, and the policy's guarantee that nothing goes stale when the trainer follows its waiting rule."""
import random
import threading
from collections import deque

import pytest

from mindspeed_asp.core.policy import LagPolicy
from mindspeed_asp.runtime.sample_queue import SampleQueue
from mindspeed_asp.runtime.requests import GroupResult, SampleResult


def group(gid, versions, minibatch=-1):
    """A finished group whose samples were generated with the given (min) versions."""
    samples = [SampleResult(token_ids=[5, 1], logprobs=[-1.0, -1.0], min_version=v, max_version=v,
                            finish_reason="stop") for v in versions]
    return GroupResult(group_id=str(gid), prompt_id=f"p{gid}", instance=0, samples=samples,
                       prompt_token_ids=[0, 3], t_enqueued=0.0, t_started=0.0, t_finished=0.0,
                       minibatch=minibatch)


def test_stale_removal_frees_admission_budget():
    c = LagPolicy(max_lag=0, minibatch_groups=2)
    c.on_dispatched(0, 2)
    assert c.budget(0) == 0
    q = SampleQueue(c, stale_policy="drop")
    q.put([group(1, [0]), group(2, [0])])
    assert c.ready[0] == 2
    assert q.next_minibatch(1) is None  # version moved on: both now stale (lag 1 > 0)
    assert q.dropped_stale == 2 and c.accepted == 0 and c.stale == 2
    assert c.budget(1) == 4  # capacity (1+0+1)*2 = 4 with nothing accepted


def test_queue_counts_under_the_dispatch_version_when_given():
    c = LagPolicy(max_lag=1, minibatch_groups=1)
    c.on_dispatched(2)
    q = SampleQueue(c)
    q.put(group(1, [3]), version=2)  # dispatched at 2, first token at 3: the policy's version is 2
    assert c.ready[2] == 1
    assert q.next_minibatch(4) is None and q.regenerated == 1  # 4 - 2 > 1: stale by its dispatch version
    assert c.untrained[2] == 0 and c.accepted == 0


def test_next_minibatch_waits_for_M_trainable_groups_and_excludes_stale():
    c = LagPolicy(max_lag=1, minibatch_groups=3)
    q = SampleQueue(c, stale_policy="regenerate")
    q.put([group(1, [2]), group(2, [3])])
    assert q.next_minibatch(3) is None and q.occupancy() == 2
    q.put(group(3, [0, 3]))  # one sample from version 0: lag 3 at version 3
    assert q.next_minibatch(3) is None
    assert q.regenerated == 1 and q.dropped_stale == 0 and q.occupancy() == 2
    stale = q.take_stale()
    assert [g.group_id for g in stale] == ["3"] and q.take_stale() == []
    q.put(group(4, [3]))
    batch = q.next_minibatch(3)
    assert sorted(g.group_id for g in batch) == ["1", "2", "4"]
    row = q.log_rows[-1]
    assert row.occupancy_before == 3 and row.occupancy_after == 0
    assert sorted(row.lags) == [0, 0, 1] and row.train_version == 3
    assert q.trained == 3 and q.occupancy() == 0
    assert q.lag_stats()["lag/max"] == 1.0


def test_no_group_is_trained_twice():
    c = LagPolicy(max_lag=4, minibatch_groups=1)
    q = SampleQueue(c)
    assert q.put([group(7, [0]), group(7, [0])]) == 1  # the second copy is refused
    assert q.next_minibatch(0)[0].group_id == "7"
    assert q.put(group(7, [0])) == 0  # a late duplicate of a trained group (e.g. a re-dispatch)
    assert q.duplicates == 2 and q.next_minibatch(1) is None and q.was_trained("7")
    assert q.counters()["queue/trained"] == 1


def test_prefer_oldest_and_plan_tag_order_oldest_version_first():
    c = LagPolicy(max_lag=2, minibatch_groups=2)
    q = SampleQueue(c)
    q.put([group("a", [4], minibatch=3), group("b", [3], minibatch=1), group("c", [4], minibatch=0),
           group("d", [2], minibatch=5), group("e", [3], minibatch=-1)])
    # At version 4: "d" (version 2, lag at the bound) whatever its tag, then version 3 by tag ("b" before the
    # untagged "e"), not the lowest tag overall ("c" is version 4)
    assert [g.group_id for g in q.next_minibatch(4, prefer="plan_tag")] == ["d", "b"]
    q2 = SampleQueue(LagPolicy(max_lag=2, minibatch_groups=2))
    q2.put([group("a", [4]), group("b", [3]), group("c", [4])])
    assert [g.group_id for g in q2.next_minibatch(4, prefer="oldest")] == ["b", "a"]


def run_pipeline(max_lag, M=4, groups=120, finish_p=0.35, seed=0, policy="regenerate", wait=True):
    """A toy asynchronous loop: groups finish out of order, the trainer updates when M are ready.

    Every tick: dispatch what the policy admits (generated at the current version), finish each in-flight
    group with probability finish_p, try to train (`wait`: only when the policy's waiting rule allows).
    Returns the queue and the admission/lag observations.
    """
    rng = random.Random(seed)
    c = LagPolicy(max_lag, M)
    q = SampleQueue(c, stale_policy=policy)
    todo = deque(range(groups))
    in_flight, version, trained, over_capacity = [], 0, [], 0
    for _ in range(20000):
        while todo and c.admits(version):
            c.on_dispatched(version)
            in_flight.append((todo.popleft(), version))
        over_capacity += c.accepted > (version + max_lag + 1) * M  # AReaL bound, written out
        done = [x for x in in_flight if rng.random() < finish_p]
        in_flight = [x for x in in_flight if x not in done]
        for gid, v in done:
            q.put(group(gid, [v] * 3), version=v)
        batch = None if wait and c.must_wait(version) else q.next_minibatch(version, M)
        if batch is not None:
            trained.append([g.group_id for g in batch])
            version += 1  # the update; the instances generate with the new weights from now on
        todo.extendleft(int(g.group_id) for g in q.take_stale())
        if not todo and not in_flight and q.occupancy() < M:
            break
    assert c.accepted == c.trained + sum(c.untrained) and c.running == len(in_flight)
    return q, c, trained, over_capacity


@pytest.mark.parametrize("max_lag", [0, 1, 2, 4])
@pytest.mark.parametrize("wait", [True, False])
def test_pipeline_never_exceeds_the_bound_and_trains_each_group_once(max_lag, wait):
    q, c, trained, over_capacity = run_pipeline(max_lag, wait=wait)
    assert over_capacity == 0
    flat = [gid for b in trained for gid in b]
    assert len(flat) == len(set(flat)) == q.trained
    assert q.lag_stats()["lag/max"] <= max_lag and q.lag_stats()["lag/frac_over_bound"] == 0.0
    assert q.trained == 120  # regenerate: every group is eventually trained (120 is a multiple of M)
    assert all(max(r.lags) <= max_lag for r in q.log_rows if r.lags)
    if wait:  # the policy's guarantee: following its waiting rule, no group ever goes stale
        assert q.stale_total == 0 and c.stale == 0


def test_max_lag_zero_is_synchronous():
    q, c, trained, _ = run_pipeline(0, finish_p=0.2)
    assert q.stale_total == 0  # nothing can go stale: no group is generated ahead of the trainer
    assert set(q.all_lags) == {0}
    assert [r.train_version for r in q.log_rows] == list(range(len(trained)))


def test_stale_groups_are_counted_and_never_trained():
    # a trainer that ignores the waiting rule makes stale groups: the queue removes and counts them
    q, c, trained, _ = run_pipeline(1, finish_p=0.15, seed=3, policy="drop", wait=False)
    assert q.dropped_stale > 0 and q.regenerated == 0 and c.stale == q.dropped_stale
    assert q.trained + q.dropped_stale <= 120
    stale_lags = [lag for lag in q.all_lags if lag > 1]
    assert stale_lags == []
    q2, *_ = run_pipeline(1, finish_p=0.15, seed=3, policy="regenerate", wait=False)
    assert q2.regenerated > 0 and q2.trained == 120


def test_concurrent_puts_lose_nothing():
    q = SampleQueue(LagPolicy(max_lag=1, minibatch_groups=8))

    def producer(base):
        for i in range(200):
            q.put(group(base + i, [0]))

    threads = [threading.Thread(target=producer, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert q.occupancy() == 800 and q.received == 800


def test_bad_arguments():
    with pytest.raises(ValueError, match="stale_policy"):
        SampleQueue(LagPolicy(1, 1), stale_policy="keep")
    with pytest.raises(ValueError, match="M must be"):
        SampleQueue(LagPolicy(1, 1)).next_minibatch(0, 0)
    with pytest.raises(ValueError, match="minibatch order"):
        SampleQueue(LagPolicy(1, 1)).next_minibatch(0, prefer="newest")
