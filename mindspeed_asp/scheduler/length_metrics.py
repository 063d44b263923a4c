"""How good is a length estimate? MAE, rank correlation and group-max quantile coverage.

Definitions (also in docs/estimation.md):

- `mae`: mean over every true sample of |predicted median - true length| (tokens).
- `bias`: mean over every true sample of (predicted median - true length); `log_bias`: mean of
  log(predicted median) - log(true group median).
- `kendall_tau` / `spearman`: rank correlation between the predicted median and the true group mean
  (for n = 1 that is the sample itself). Kendall tau-b, which handles the many ties of capped lengths.
- `kendall_tau_max`: Kendall tau-b between the predicted group max and the true group max.
- `group_max_coverage`: fraction of groups whose true max <= predicted group_max; for a calibrated
  estimator it is near the group-max quantile q (reported as `quantile`).
- `group_max_mae`: mean |predicted group max - true group max|.
"""
from __future__ import annotations

from typing import Dict

import numpy as np
from scipy import stats

from mindspeed_asp.core.problem import LengthEstimate


def evaluate(estimate: LengthEstimate, truth: np.ndarray) -> Dict[str, float]:
    """Score `estimate` against the true lengths [G, n] of the same groups (in the same order)."""
    truth = np.asarray(truth, dtype=np.float64)
    if truth.ndim == 1:
        truth = truth[:, None]
    if truth.shape[0] != len(estimate):
        raise ValueError(f"truth has {truth.shape[0]} groups, estimate has {len(estimate)}")
    med = np.asarray(estimate.median, dtype=np.float64)
    gmax = np.asarray(estimate.group_max, dtype=np.float64)
    true_mean = truth.mean(axis=1)
    true_max = truth.max(axis=1)
    err = med[:, None] - truth
    out: Dict[str, float] = {
        "groups": float(truth.shape[0]),
        "n": float(truth.shape[1]),
        "mae": float(np.abs(err).mean()),
        "bias": float(err.mean()),
        "log_bias": float(np.mean(np.log(np.maximum(med, 1.0)) - np.log(np.maximum(np.median(truth, axis=1), 1.0)))),
        "kendall_tau": _tau(med, true_mean),
        "spearman": _spearman(med, true_mean),
        "kendall_tau_max": _tau(gmax, true_max),
        "group_max_coverage": float(np.mean(true_max <= gmax + 1e-9)),
        "group_max_mae": float(np.abs(gmax - true_max).mean()),
        "cold_start_frac": float(1.0 - np.mean(estimate.has_history)) if len(estimate) else 0.0,
    }
    q = estimate.params.get("group_max_quantile")
    if q is not None:
        out["quantile"] = float(q)
    return out


def _tau(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(stats.kendalltau(a, b)[0])


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(stats.spearmanr(a, b)[0])
