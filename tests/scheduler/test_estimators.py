"""Estimators: oracle exactness, alpaca accuracy, coverage calibration, drift, cold start, clipping."""
import numpy as np
import pytest

from mindspeed_asp.config import EstimatorSection
from mindspeed_asp.errors import ConfigError
from mindspeed_asp.scheduler.estimators import (ColdStartEstimator, HistoryEstimator, OracleEstimator,
                                                _weighted_median, group_max_quantile, make_estimator)
from mindspeed_asp.scheduler.history import LengthHistory
from mindspeed_asp.scheduler.length_metrics import evaluate
from mindspeed_asp.workloads.synthetic import SyntheticRLWorkload

from factories import prompt_set, shared_data

ALPACA = shared_data() / "alpaca-train-10k-length.json"


def test_oracle_is_exact():
    wl = SyntheticRLWorkload(300, n=8, epochs=2, seed=3)
    truth = wl.lengths(1)
    est = OracleEstimator(truth).estimate(wl.prompts, wl.history(1), wl.max_new_tokens)
    assert np.array_equal(est.group_max, truth.max(axis=1))
    assert np.array_equal(est.median, np.median(truth, axis=1))
    assert np.array_equal(est.sample_lengths(8), truth)
    m = evaluate(est, truth)
    assert m["group_max_coverage"] == 1.0 and m["kendall_tau_max"] == pytest.approx(1.0) and m["group_max_mae"] == 0


@pytest.mark.skipif(not ALPACA.is_file(), reason=f"{ALPACA} not present")
def test_history_estimator_alpaca_kendall_tau():
    from mindspeed_asp.workloads.traces import load_alpaca

    prompts, hist, truth = load_alpaca(ALPACA, target="t0.7")
    est = HistoryEstimator().estimate(prompts, hist, 512)
    m = evaluate(est, truth)
    assert m["kendall_tau"] >= 0.6
    assert m["mae"] < 45  # global mean is ~82 tokens MAE on this file
    assert abs(m["group_max_coverage"] - 0.8) < 0.05
    assert est.has_history.all()


@pytest.mark.parametrize("q", [0.5, 0.8, 0.95])
def test_group_max_coverage_near_quantile(q):
    wl = SyntheticRLWorkload(3000, n=8, epochs=4, seed=11)
    est = HistoryEstimator(group_max_quantile=q).estimate(wl.prompts, wl.history(3), wl.max_new_tokens)
    cov = evaluate(est, wl.lengths(3))["group_max_coverage"]
    assert abs(cov - q) < 0.06, cov


def test_group_max_quantile_matches_monte_carlo():
    rng = np.random.default_rng(0)
    med, sigma, n, q = 1000.0, 0.6, 8, 0.8
    draws = med * np.exp(sigma * rng.normal(size=(200_000, n))).max(axis=1)
    assert group_max_quantile(np.array([med]), np.array([sigma]), n, q)[0] == \
        pytest.approx(np.quantile(draws, q), rel=0.01)


def test_drift_factor_tracks_global_trend():
    trend = 0.2
    wl = SyntheticRLWorkload(2000, n=8, epochs=5, seed=5, trend=trend, rho=0.95)
    hist, truth = wl.history(4), wl.lengths(4)
    with_drift = HistoryEstimator(drift=True).estimate(wl.prompts, hist, wl.max_new_tokens)
    no_drift = HistoryEstimator(drift=False).estimate(wl.prompts, hist, wl.max_new_tokens)
    assert with_drift.params["drift_factor"] == pytest.approx(np.exp(trend), rel=0.05)
    bias_with = evaluate(with_drift, truth)["log_bias"]
    bias_without = evaluate(no_drift, truth)["log_bias"]
    assert abs(bias_with) < 0.06
    assert bias_without < -0.15  # without drift the estimate lags the growing lengths


def test_cold_start_used_exactly_for_prompts_without_history():
    wl = SyntheticRLWorkload(400, n=4, epochs=3, seed=2, sources=["math", "code"])
    full = wl.history(2)
    known = np.arange(400) % 3 != 0
    hist = LengthHistory()
    for e in range(2):
        hist.add_epoch(wl.prompts.prompt_ids[known], e, wl.lengths(e)[known])
    est = HistoryEstimator().estimate(wl.prompts, hist, wl.max_new_tokens)
    assert np.array_equal(est.has_history, known)
    assert est.params["cold_start_frac"] == pytest.approx(np.mean(~known))
    # prompts with history get the same prediction whether or not others lack it
    ref = HistoryEstimator().estimate(wl.prompts.subset(np.flatnonzero(known)), hist, wl.max_new_tokens)
    assert np.allclose(est.median[known], ref.median)
    assert np.allclose(est.group_max[known], ref.group_max)
    # and the same prompts predicted from the full history are not cold
    assert HistoryEstimator().estimate(wl.prompts, full, wl.max_new_tokens).has_history.all()
    # cold prompts: a wide group max (their center is uncertain across the whole dataset)
    ratio = est.group_max / est.median
    assert np.median(ratio[~known]) > 1.5 * np.median(ratio[known])


def test_cold_start_uses_prompt_length_and_source():
    G = 600
    rng = np.random.default_rng(4)
    plen = rng.integers(10, 2000, G)
    src = np.array(["short", "long"], dtype=object)[np.arange(G) % 2]
    prompts = prompt_set(plen, 4, prefix="c", sources=src)
    ids = prompts.prompt_ids
    base = 50 * plen ** 0.5 * np.where(src == "long", 3.0, 1.0)
    hist = LengthHistory()
    hist.add_epoch(ids, 0, np.rint(base[:, None] * np.exp(0.2 * rng.normal(size=(G, 4)))))
    est = ColdStartEstimator().estimate(prompts, hist, 1_000_000)
    assert not est.has_history.any()
    assert est.params["slope_log_prompt_len"] > 0.3
    assert np.median(est.median[src == "long"]) > 2 * np.median(est.median[src == "short"])
    assert evaluate(est, np.rint(base[:, None]))["kendall_tau"] > 0.6


def test_no_history_at_all_uses_prior():
    prompts = prompt_set(np.array([5, 9]), 8, ids=["a", "b"])
    for est in (HistoryEstimator().estimate(prompts, None, 1024),
                HistoryEstimator().estimate(prompts, LengthHistory(), 1024)):
        assert not est.has_history.any()
        assert np.allclose(est.median, 256.0)
        assert (est.group_max <= 1024).all() and (est.group_max >= est.median).all()


def test_clipping_and_truncation_probability():
    prompts = prompt_set(np.array([10, 10]), 8, ids=["capped", "short"])
    ids = prompts.prompt_ids
    hist = LengthHistory()
    hist.add_epoch(ids, 0, np.array([[1000] * 8, [10, 12, 9, 11, 10, 13, 8, 10]]))
    hist.add_epoch(ids, 1, np.array([[1000] * 7 + [900], [10, 11, 9, 12, 10, 10, 9, 11]]))
    est = HistoryEstimator().estimate(prompts, hist, 1000)
    assert est.median[0] <= 1000 and est.group_max[0] == 1000
    assert est.p_trunc[0] > 0.5 and est.p_trunc[1] < 0.01
    assert 8 <= est.median[1] <= 13


def test_recency_weighting_prefers_recent_epochs():
    prompts = prompt_set(np.array([1]), 4, ids=["x"])
    ids = prompts.prompt_ids
    hist = LengthHistory()
    for e, v in enumerate([100, 100, 100, 400]):
        hist.add_epoch(ids, e, np.full((1, 4), v))
    flat = HistoryEstimator(recency_decay=1.0, drift=False).estimate(prompts, hist, 10_000).median[0]
    recent = HistoryEstimator(recency_decay=0.2, drift=False).estimate(prompts, hist, 10_000).median[0]
    assert flat == pytest.approx(100.0)
    assert recent > 300


def test_weighted_median():
    rng = np.random.default_rng(0)
    g = np.repeat(np.arange(50), 7)
    v = rng.normal(size=len(g))
    got = _weighted_median(g, v, np.ones(len(g)), 52)
    assert np.allclose(got[:50], np.median(v.reshape(50, 7), axis=1))
    assert np.isnan(got[50:]).all()
    # one heavy sample pulls the median toward it but older samples still count
    vals = np.array([1.0, 2.0, 10.0])
    med = _weighted_median(np.zeros(3, dtype=np.int64), vals, np.array([0.25, 0.5, 1.0]), 1)[0]
    assert 2.0 < med < 10.0


def test_make_estimator_kinds():
    assert isinstance(make_estimator(EstimatorSection()), HistoryEstimator)
    est = make_estimator(EstimatorSection(kind="history", recency_decay=0.7, group_max_quantile=0.9))
    assert est.recency_decay == 0.7 and est.q == 0.9
    assert isinstance(make_estimator(EstimatorSection(kind="cold_start")), ColdStartEstimator)
    assert isinstance(make_estimator(EstimatorSection(kind="oracle"), true_lengths=np.ones((3, 2))),
                      OracleEstimator)
    with pytest.raises(ConfigError, match="oracle"):
        make_estimator(EstimatorSection(kind="oracle"))


def test_new_prompts_use_the_histories_global_lengths_not_the_prior():
    """A window of prompts never seen before is predicted from what the other prompts showed."""
    wl = SyntheticRLWorkload.small(400, n=8, epochs=2, seed=9)
    old = np.arange(400) < 200
    hist = LengthHistory()
    hist.add_epoch(wl.prompts.prompt_ids[old], 0, wl.lengths(0)[old])
    new = wl.prompts.subset(np.flatnonzero(~old))
    for est in (HistoryEstimator().estimate(new, hist, wl.max_new_tokens),
                ColdStartEstimator().estimate(new, hist, wl.max_new_tokens)):
        assert not est.has_history.any()
        observed = np.median(wl.lengths(0)[old])
        assert 0.6 * observed < est.median[0] < 1.6 * observed  # prior would be 0.25 * 384 = 96
        cov = evaluate(est, wl.lengths(1)[~old])["group_max_coverage"]
        assert 0.6 < cov < 0.97
