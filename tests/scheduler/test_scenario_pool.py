"""Scenario sampling resamples each prompt's own history (scheduler/scenarios.py, the estimate's ResidualPool)."""
import numpy as np
import pytest

from mindspeed_asp.scheduler import scenarios
from mindspeed_asp.scheduler.estimators import HistoryEstimator
from mindspeed_asp.scheduler.history import LengthHistory
from mindspeed_asp.core.problem import LengthEstimate, PlanningProblem, PromptSet, ResidualPool
from mindspeed_asp.workloads.synthetic import SyntheticRLWorkload

from factories import planning_problem


def _problem(prompts: PromptSet, est: LengthEstimate, cap: int) -> PlanningProblem:
    return planning_problem(prompts, est, instances=4, slots=32, minibatch=8, max_new_tokens=cap)


def test_pool_subset_keeps_each_rows_samples_and_weights():
    pool = ResidualPool(offsets=np.array([0, 2, 2, 5]), resid=np.arange(5.0),
                        capped=np.array([False, True, False, False, True]), weight=np.array([1, 2, 1, 1, 4.0]))
    sub = pool.subset(np.array([2, 0, 1]))
    assert sub.counts.tolist() == [3, 2, 0]
    assert sub.resid.tolist() == [2.0, 3.0, 4.0, 0.0, 1.0]
    assert sub.capped.tolist() == [False, False, True, False, True]
    assert sub.weight.tolist() == [1, 1, 4, 1, 2]
    assert sub.capped_share() == pytest.approx([4 / 6, 2 / 3, 0.0])


def test_pool_draws_follow_the_recency_weights_and_stay_in_their_group():
    pool = ResidualPool(offsets=np.array([0, 2, 5]), resid=np.arange(5.0), capped=np.zeros(5, bool),
                        weight=np.array([1.0, 3.0, 1.0, 1.0, 2.0]))
    idx = pool.draw(np.array([0, 1]), np.random.default_rng(0).random((20000, 2, 1)))
    assert set(np.unique(idx[:, 0])) == {0, 1} and set(np.unique(idx[:, 1])) == {2, 3, 4}
    assert np.mean(idx[:, 0] == 1) == pytest.approx(0.75, abs=0.02)
    assert np.mean(idx[:, 1] == 4) == pytest.approx(0.5, abs=0.02)


def test_estimate_subset_carries_the_pool():
    wl = SyntheticRLWorkload(64, n=8, epochs=3, seed=0)
    est = HistoryEstimator().estimate(wl.prompts, wl.history(2), wl.max_new_tokens)
    rows = np.array([5, 1, 9])
    sub = est.subset(rows)
    assert sub.median.tolist() == est.median[rows].tolist()
    assert sub.pool.counts.tolist() == est.pool.counts[rows].tolist() == [16, 16, 16]


def _bimodal_history(epochs: int, cap: int):
    """Every prompt answers either short (~100 tokens) or long (~2000) in equal shares, never in between."""
    rng = np.random.default_rng(1)
    ids = np.array([f"p{i}" for i in range(60)], dtype=object)
    hist = LengthHistory()
    for e in range(epochs):
        long = rng.random((60, 8)) < 0.5
        lengths = np.where(long, rng.normal(2000, 50, (60, 8)), rng.normal(100, 5, (60, 8)))
        hist.add_epoch(ids, e, np.clip(np.rint(lengths), 1, cap).astype(np.int64))
    return PromptSet(ids, np.full(60, 20), n=8), hist


def test_bimodal_history_gives_bimodal_scenarios_and_the_right_mean():
    cap = 4096
    prompts, hist = _bimodal_history(3, cap)
    est = HistoryEstimator().estimate(prompts, hist, cap)
    sc = scenarios.sample_scenarios(_problem(prompts, est, cap), 16, np.random.default_rng(0))
    between = np.mean((sc > 300) & (sc < 1500))
    assert between < 0.02, between  # a log-normal around the median would put many samples there
    assert sc.mean() == pytest.approx(1050, rel=0.08)
    # without the pool (the log-normal fallback) the middle fills up: the pool is what keeps the modes
    from dataclasses import replace
    plain = scenarios.sample_scenarios(_problem(prompts, replace(est, pool=None), cap), 16,
                                       np.random.default_rng(0))
    assert np.mean((plain > 300) & (plain < 1500)) > 5 * between + 0.05


@pytest.mark.parametrize("seed", [0, 1])
def test_long_cot_scenarios_match_the_next_epochs_lengths(seed):
    """Mean, group max and cap share of the scenarios against the epoch that follows the history."""
    wl = SyntheticRLWorkload(400, n=8, epochs=4, seed=seed, mode="long_cot")
    cap = wl.max_new_tokens
    est = HistoryEstimator().estimate(wl.prompts, wl.history(3), cap)
    truth = np.minimum(wl.lengths(3), cap)
    sc = scenarios.sample_scenarios(_problem(wl.prompts, est, cap), 8, np.random.default_rng(seed))
    assert sc.mean() == pytest.approx(truth.mean(), rel=0.08)
    assert sc.max(axis=2).mean() == pytest.approx(truth.max(axis=1).mean(), rel=0.08)
    assert np.mean(sc >= cap) == pytest.approx(np.mean(truth >= cap), abs=0.02)
    assert np.mean(sc >= cap) == pytest.approx(est.p_trunc.mean(), abs=0.01)  # the drifted truncation odds


def test_groups_without_enough_history_fall_back_to_the_lognormal():
    wl = SyntheticRLWorkload(32, n=2, epochs=2, seed=0)
    est = HistoryEstimator().estimate(wl.prompts, wl.history(1), wl.max_new_tokens)
    assert (est.pool.counts < scenarios.POOL_MIN_SAMPLES).all()
    problem = _problem(wl.prompts, est, wl.max_new_tokens)
    a = scenarios.sample_scenarios(problem, 4, np.random.default_rng(3))
    from dataclasses import replace
    b = scenarios.sample_scenarios(replace(problem, estimate=replace(est, pool=None)), 4, np.random.default_rng(3))
    assert np.array_equal(a, b)
