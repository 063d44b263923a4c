"""The history estimator moves the truncation probability with the length drift (docs/estimation.md, step 6)."""
import numpy as np
import pytest

from mindspeed_asp.scheduler.estimators import HistoryEstimator
from mindspeed_asp.scheduler.history import LengthHistory
from mindspeed_asp.core.problem import PromptSet
from mindspeed_asp.workloads.synthetic import SyntheticRLWorkload


def _shares(wl: SyntheticRLWorkload, history_epochs: int, **est_kw):
    """(mean predicted p_trunc, the history's raw cap share, the realised cap share of the next epoch)."""
    cap = wl.max_new_tokens
    est = HistoryEstimator(**est_kw).estimate(wl.prompts, wl.history(history_epochs), cap)
    raw = float(np.mean([np.mean(wl.lengths(e) >= cap) for e in range(history_epochs)]))
    real = float(np.mean(wl.lengths(history_epochs) >= cap))
    return float(est.p_trunc.mean()), raw, real


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_long_cot_shrinking_lengths_lower_p_trunc_toward_the_next_epoch(seed):
    wl = SyntheticRLWorkload(1000, n=8, epochs=4, seed=seed, mode="long_cot")
    pred, raw, real = _shares(wl, 3)
    assert real < raw  # the workload's cap share does fall
    assert pred < raw
    assert abs(pred - real) < 0.6 * abs(raw - real), (pred, raw, real)
    # the drift is what moves it: without the drift model p_trunc stays near the history's share
    still, _, _ = _shares(wl, 3, drift=False)
    assert abs(pred - real) < abs(still - real), (pred, still, real)


@pytest.mark.parametrize("seed", [0, 1])
def test_growing_lengths_raise_p_trunc(seed):
    wl = SyntheticRLWorkload(1000, n=8, epochs=4, seed=seed, trend=0.15)
    pred, raw, real = _shares(wl, 3)
    still, _, _ = _shares(wl, 3, drift=False)
    assert raw < real and pred > still
    assert abs(pred - real) < abs(raw - real), (pred, raw, real)


def _drifting_history(factor: float, cap: int, special: list):
    """40 prompts whose lengths scale by `factor` per epoch, plus prompt 'p' with `special` lengths per epoch."""
    rng = np.random.default_rng(0)
    ids = np.array([f"q{i}" for i in range(40)] + ["p"], dtype=object)
    base = np.exp(rng.normal(np.log(300), 0.5, (40, 1)) + rng.normal(0, 0.2, (40, 8)))
    hist = LengthHistory()
    for e, row in enumerate(special):
        lengths = np.vstack([np.clip(np.rint(base * factor ** e), 1, cap), np.asarray(row)[None, :]])
        hist.add_epoch(ids, e, lengths.astype(np.int64))
    return PromptSet(ids, np.full(len(ids), 10), n=8), hist


def test_capped_samples_count_less_when_lengths_shrink_and_near_cap_ones_count_when_they_grow():
    cap = 1000
    shrinking = [[1000, 1000, 1000, 1000, 600, 500, 400, 300], [1000, 1000, 1000, 560, 480, 400, 320, 240]]
    prompts, hist = _drifting_history(0.8, cap, shrinking)
    with_drift = HistoryEstimator().estimate(prompts, hist, cap)
    without = HistoryEstimator(drift=False).estimate(prompts, hist, cap)
    assert with_drift.params["drift_factor"] == pytest.approx(0.8, rel=0.02)
    assert with_drift.p_trunc[-1] < without.p_trunc[-1] - 0.05
    # every prompt far below the cap keeps a negligible probability either way
    assert with_drift.p_trunc[:-1].max() < 0.01
    growing = [[900, 880, 850, 800, 500, 400, 300, 200], [950, 940, 920, 900, 600, 500, 350, 250]]
    prompts, hist = _drifting_history(1.25, cap, growing)
    up = HistoryEstimator().estimate(prompts, hist, cap)
    flat = HistoryEstimator(drift=False).estimate(prompts, hist, cap)
    assert up.params["drift_factor"] == pytest.approx(1.25, rel=0.02)
    # shifted by two steps of +22%, 900..950 pass the cap: four samples of eight at the cap
    assert up.p_trunc[-1] > flat.p_trunc[-1] + 0.2


def test_without_drift_the_observed_cap_share_is_kept():
    cap = 1000
    flat = [[1000, 1000, 700, 600, 500, 400, 300, 200], [1000, 1000, 700, 600, 500, 400, 300, 200]]
    prompts, hist = _drifting_history(1.0, cap, flat)
    a = HistoryEstimator().estimate(prompts, hist, cap)
    b = HistoryEstimator(drift=False).estimate(prompts, hist, cap)
    assert a.params["drift_factor"] == pytest.approx(1.0, abs=1e-9)
    assert np.allclose(a.p_trunc, b.p_trunc)
    # 4 of 16 samples at the cap, blended with the lognormal tail by 4 pseudo-samples
    assert 4 / 20 <= a.p_trunc[-1] <= 8 / 20
