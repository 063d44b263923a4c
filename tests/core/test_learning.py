"""learning.py: final reward, time to a target reward, seed intervals and KS, checked by hand."""
import math

import pytest

from mindspeed_asp.core import learning
from mindspeed_asp.commands.compare import compare_table


def test_final_reward_is_the_last_quarter_mean():
    assert learning.final_reward([0, 0, 0, 0, 0, 0, 1, 3]) == 2.0
    assert learning.final_reward([5.0]) == 5.0
    with pytest.raises(ValueError):
        learning.final_reward([])


def test_smoothed_is_a_trailing_mean():
    assert learning.smoothed([3, 0, 0, 6], window=3).tolist() == [3.0, 1.5, 1.0, 2.0]


def test_target_needs_a_full_window_and_counts_updates_from_one():
    # one lucky first minibatch does not reach the target
    assert learning.updates_to_target([0.9, 0.0, 0.0, 0.0], 0.5) is None
    # trailing means: -, -, 0.2, 0.4, 0.6 -> the fifth update reaches 0.5
    assert learning.updates_to_target([0.0, 0.3, 0.3, 0.6, 0.9], 0.5) == 5
    t_end = [10.0, 20.0, 30.0, 40.0, 50.0]
    assert learning.seconds_to_target([0.0, 0.3, 0.3, 0.6, 0.9], t_end, t_start=4.0, target=0.5) == 46.0
    assert learning.seconds_to_target([0.0] * 5, t_end, 4.0, 0.5) is None


def test_mean_interval_is_student_t():
    m, lo, hi = learning.mean_interval([1.0, 2.0, 3.0])
    # sd 1, n 3: t(0.975, 2) = 4.3027 -> half-width 4.3027 / sqrt(3) = 2.4841
    assert m == 2.0 and hi - m == pytest.approx(2.4841, abs=1e-4) and m - lo == pytest.approx(2.4841, abs=1e-4)
    assert learning.mean_interval([4.0]) == (4.0, 4.0, 4.0)
    assert all(math.isnan(x) for x in learning.mean_interval([None, float("inf")]))


def test_ks_distance():
    assert learning.ks_distance([1, 2, 3], [1, 2, 3]) == 0.0
    assert learning.ks_distance([1, 2], [5, 6]) == 1.0
    assert learning.ks_distance([1, 2, 3, 4], [3, 4, 5, 6]) == 0.5


def test_learning_summary_and_compare_columns():
    s = learning.learning_summary([0.1, 0.3, 0.5, 0.5], [1.0, 2.0, 3.0, 4.0], 0.5, target=0.4)
    assert s == {"learning/target_reward": 0.4, "learning/updates_to_target": 4,
                 "learning/seconds_to_target": 3.5}
    assert learning.learning_summary([0.1], [1.0], 0.0, None) == {"learning/target_reward": None}
    fast = {"name": "asp", "mode": "asp", "reward/final": 0.3, "learning/target_reward": 0.4,
            "learning/updates_to_target": 6, "learning/seconds_to_target": 30.0}
    slow = dict(fast, name="stock", mode="stock", **{"learning/seconds_to_target": 60.0})
    header, rows = compare_table([slow, fast])
    assert header[-2:] == ["upd to R*", "s to R*"]
    assert rows[1][-1] == "30 (x2.00)"  # half the time to the target: x2 better


def test_discarded_attempts_are_the_regenerated_ones_not_the_leftovers():
    # gid 1: discarded at t=1, regenerated at t=5 and trained; gid 2: never trained, one attempt (leftover)
    attempts = [(1, 1.0, False), (2, 2.0, False), (1, 5.0, True), (3, 3.0, True)]
    assert learning.discarded_attempts(attempts) == [True, False, False, False]


def test_length_starvation_bins_discards_by_length():
    attempts = [(0, 0.0, True, [2, 2]), (1, 0.0, True, [4, 4]), (2, 0.0, False, [40, 40]),
                (3, 0.0, True, [10, 10]), (2, 9.0, True, [30, 30])]
    s = learning.length_starvation(attempts, edges=[3, 5, 20])
    assert s["discarded_share_by_quartile"] == [0.0, 0.0, 0.0, 0.5]  # the long attempt was thrown away
    assert s["discarded_share"] == 0.2
    assert s["generated_len_mean"] == pytest.approx(17.2) and s["trained_len_mean"] == pytest.approx(11.5)
    assert 0 < s["ks_trained_vs_generated"] < 1
