"""Response-length estimators: history-based, cold start, and an oracle for experiments.

All three return a `LengthEstimate` (median, group-max quantile, within-group sigma, truncation probability
per prompt group). The planners balance and order by these numbers, so what matters most is the rank of the
medians and a calibrated upper quantile of the group max (a group finishes with its longest sample).
The formulas are documented in docs/estimation.md; everything is vectorised over groups.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, Optional

import numpy as np
from numpy.polynomial.hermite_e import hermegauss
from scipy.special import log_ndtr, ndtr, ndtri

from mindspeed_asp.config import EstimatorSection
from mindspeed_asp.errors import ConfigError
from mindspeed_asp.scheduler.history import HistorySamples, LengthHistory
from mindspeed_asp.core.problem import LengthEstimate, PromptSet, ResidualPool


def group_max_quantile(median: np.ndarray, sigma: np.ndarray, n: int, q: float,
                       center_sigma: Optional[np.ndarray] = None) -> np.ndarray:
    """Quantile q of the max of n lognormal samples around `median` with log-spread `sigma`.

    With a known median this is the closed form median*exp(sigma*Phi^-1(q^(1/n))). `center_sigma` (the
    uncertainty of log median itself, shared by the n samples) widens it: the quantile of
    log median + tau*Z + sigma*max(Z_1..Z_n), integrated over Z by Gauss-Hermite quadrature.
    """
    median = np.asarray(median, dtype=np.float64)
    sigma = np.broadcast_to(np.asarray(sigma, dtype=np.float64), median.shape)
    n = max(int(n), 1)
    if center_sigma is None or not np.any(np.asarray(center_sigma) > 0):
        return median * np.exp(sigma * float(ndtri(q ** (1.0 / n))))
    tau = np.broadcast_to(np.asarray(center_sigma, dtype=np.float64), median.shape)
    safe = np.maximum(sigma, 1e-6)
    ratio = tau / safe
    return median * np.exp(safe * _standard_max_quantile(ratio, n, q))


def _standard_max_quantile(ratio: np.ndarray, n: int, q: float) -> np.ndarray:
    """y with P(r*Z + max(Z_1..Z_n) <= y) = q, per ratio r (solved on a grid of r, then interpolated)."""
    nodes, weights = hermegauss(32)
    weights = weights / weights.sum()
    rmax = float(np.max(ratio)) if ratio.size else 0.0
    grid = np.linspace(0.0, max(rmax, 1e-9), 257)
    lo = np.full(len(grid), -12.0) - 12.0 * grid
    hi = np.full(len(grid), 12.0) + 12.0 * grid
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        cdf = (ndtr(mid[:, None] - grid[:, None] * nodes[None, :]) ** n) @ weights
        below = cdf < q
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    return np.interp(ratio, grid, 0.5 * (lo + hi))


def truncation_probability(log_median: np.ndarray, sigma: np.ndarray, max_new_tokens: int) -> np.ndarray:
    """P(a lognormal sample reaches the cap): the mass the engine truncates into the spike at max_new_tokens."""
    sigma = np.maximum(np.asarray(sigma, dtype=np.float64), 1e-6)
    return 1.0 - ndtr((np.log(max_new_tokens) - log_median) / sigma)


def drifted_cap_count(stats: "_PromptStats", center: np.ndarray, sigma: np.ndarray,
                      max_new_tokens: int) -> np.ndarray:
    """How many of each prompt's history samples would reach the cap at the predicted epoch, given the drift.

    A sample below the cap counts when its drift-shifted length reaches the cap (lengths growing). A sample
    observed at the cap was censored there (its untruncated length is unknown), so when lengths shrink it
    counts with the probability that it still reaches the cap: the prompt's lognormal tail mass beyond the cap
    at the predicted epoch over that mass at the sample's own epoch, whose center lies `shift` lower. Without
    drift this is the observed number of samples at the cap.
    """
    g, d = stats.capped_group, stats.capped_shift
    s = np.maximum(np.asarray(sigma, dtype=np.float64), 1e-6)[g]
    c = np.asarray(center, dtype=np.float64)[g]
    logcap = np.log(max_new_tokens)
    ratio = np.exp(np.minimum(log_ndtr((c - logcap) / s) - log_ndtr((c - d - logcap) / s), 0.0))
    keep = np.where((d >= 0) | ~np.isfinite(ratio), 1.0, ratio)
    return stats.over_cap + np.bincount(g, weights=keep, minlength=len(stats.over_cap))


def _grouped_order(group: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Order sorting by (group, value): one float argsort on group + scaled value (faster than lexsort)."""
    if len(value) == 0:
        return np.zeros(0, dtype=np.int64)
    lo, hi = float(value.min()), float(value.max())
    scaled = (value - lo) / (hi - lo) * 0.999 if hi > lo else np.zeros(len(value))
    return np.argsort(group.astype(np.float64) + scaled, kind="stable")


def _weighted_median(group: np.ndarray, value: np.ndarray, weight: np.ndarray, num_groups: int) -> np.ndarray:
    """Interpolated weighted median per group (NaN for empty groups).

    Each sample sits at the midpoint of its cumulative-weight interval; the median is interpolated at 1/2.
    Unlike the plain weighted median this never collapses onto one heavy (recent) sample, so older epochs
    still vote: with weights 0.25/0.5/1 the latest sample alone would otherwise always win.
    """
    out = np.full(num_groups, np.nan)
    if len(value) == 0:
        return out
    order = _grouped_order(group, value)
    g, v, w = group[order], value[order], weight[order]
    total = np.bincount(g, weights=w, minlength=num_groups)
    csum = np.cumsum(w)
    start = np.concatenate(([0], np.flatnonzero(g[1:] != g[:-1]) + 1))
    before = np.repeat(csum[start] - w[start], np.diff(np.concatenate((start, [len(g)]))))
    pos = (csum - before - w / 2.0) / total[g]  # midpoint position in [0, 1] within the group
    # first sample whose midpoint is >= 1/2, per group
    ge = pos >= 0.5
    # samples are sorted by group, so the first flagged index of a group is found by a reverse scatter
    first_ge = np.full(num_groups, len(g))
    flagged = np.flatnonzero(ge)[::-1]
    first_ge[g[flagged]] = flagged
    grp_start = np.full(num_groups, -1)
    grp_start[g[start]] = start
    grp_end = np.full(num_groups, -1)
    grp_end[g[start]] = np.concatenate((start[1:], [len(g)])) - 1
    present = grp_start >= 0
    hi = np.where(first_ge < len(g), first_ge, grp_end)
    hi = np.where(present, hi, 0)
    lo = np.where(hi > grp_start, hi - 1, hi)
    p_lo, p_hi = pos[lo], pos[hi]
    frac = np.where(p_hi > p_lo, (0.5 - p_lo) / np.where(p_hi > p_lo, p_hi - p_lo, 1.0), 0.0)
    frac = np.clip(frac, 0.0, 1.0)
    med = v[lo] + frac * (v[hi] - v[lo])
    out[present] = med[present]
    return out


def _record_medians(view: HistorySamples, logs: np.ndarray) -> np.ndarray:
    """Median log-length of every (prompt, epoch) record of a view."""
    R = len(view.record_group)
    if R == 0:
        return np.zeros(0)
    order = _grouped_order(view.record, logs)
    v = logs[order]
    counts = np.bincount(view.record, minlength=R)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return 0.5 * (v[starts + (counts - 1) // 2] + v[starts + counts // 2])


@dataclass(frozen=True)
class DriftModel:
    """Global epoch-to-epoch shift of log-lengths, from prompts observed in consecutive epochs.

    `step[e]` is the median over prompts of (median log-length at the next observed epoch - at e);
    `next_step` extrapolates one more epoch as the recency-weighted mean of the steps. `offset(e)` moves a
    sample observed at epoch e to the epoch being predicted (latest + 1).
    """

    epochs: np.ndarray  # int64 sorted distinct epochs
    step: np.ndarray  # float [len(epochs) - 1]
    next_step: float

    def offset(self, epoch: np.ndarray, extrapolate: bool = True) -> np.ndarray:
        """Log shift from `epoch` to latest + 1 (or to the latest epoch with extrapolate=False)."""
        if len(self.epochs) == 0:
            return np.zeros(len(epoch))
        after = np.concatenate((np.cumsum(self.step[::-1])[::-1], [0.0]))  # drift from epoch k to latest
        k = np.searchsorted(self.epochs, epoch)
        return after[k] + (self.next_step if extrapolate else 0.0)

    @property
    def factor(self) -> float:
        """Multiplicative drift of lengths predicted for the next epoch relative to the latest."""
        return float(np.exp(self.next_step))

    @staticmethod
    def none(epochs: np.ndarray) -> "DriftModel":
        return DriftModel(epochs=epochs, step=np.zeros(max(len(epochs) - 1, 0)), next_step=0.0)

    @staticmethod
    def fit(history: LengthHistory, decay: float, max_epochs: int) -> "DriftModel":
        pid, epoch, offsets, values = history.records()
        epochs = np.unique(epoch)
        if len(epochs) < 2:
            return DriftModel.none(epochs)
        counts = np.diff(offsets)
        rec = np.repeat(np.arange(len(pid)), counts)
        logs = np.log(np.maximum(values, 1).astype(np.float64))
        order = _grouped_order(rec, logs)
        v = logs[order]
        starts = offsets[:-1]
        med = 0.5 * (v[starts + (counts - 1) // 2] + v[starts + counts // 2])
        same = pid[1:] == pid[:-1]
        k0 = np.searchsorted(epochs, epoch[:-1])
        consecutive = same & (k0 + 1 < len(epochs)) & (epoch[1:] == epochs[np.minimum(k0 + 1, len(epochs) - 1)])
        diff = med[1:] - med[:-1]
        step = np.zeros(len(epochs) - 1)
        for k in range(len(epochs) - 1):
            sel = consecutive & (k0 == k)
            if sel.any():
                step[k] = float(np.median(diff[sel]))
        recent = step[-max_epochs:] if max_epochs > 0 else step
        w = decay ** np.arange(len(recent))[::-1]
        return DriftModel(epochs=epochs, step=step, next_step=float(np.sum(w * recent) / np.sum(w)))


@dataclass
class _PromptStats:
    """Per-prompt summaries of drift-adjusted log-lengths over a history window (one row per prompt)."""

    center: np.ndarray  # recency-weighted interpolated median (NaN without history)
    count: np.ndarray  # samples
    neff: np.ndarray  # Kish effective number of samples under the recency weights
    within_ss: np.ndarray  # squared residuals around each (prompt, epoch) record's own median
    within_dof: np.ndarray  # samples - records
    total_ss: np.ndarray  # squared residuals around the center
    at_cap: np.ndarray  # samples that reached max_new_tokens
    over_cap: np.ndarray  # samples below the cap whose drift-shifted length reaches it (lengths growing)
    capped_group: np.ndarray  # int64 [C]: the prompt of each sample observed at the cap
    capped_shift: np.ndarray  # float [C]: its log drift shift to the predicted epoch
    has: np.ndarray  # bool: any history
    last_median: np.ndarray  # median log-length of the prompt's record at the window's reference epoch
    last_count: np.ndarray  # samples in that record (0 when the prompt has no record there)
    sample_group: np.ndarray  # int64 [S], non-decreasing: the prompt of every sample in the window
    sample_log: np.ndarray  # float [S]: its drift-adjusted log-length
    sample_at_cap: np.ndarray  # bool [S]: it reached max_new_tokens
    sample_weight: np.ndarray  # float [S]: its recency weight (decay ** age)


def _prompt_stats(prompt_ids: np.ndarray, history: LengthHistory, drift: "DriftModel", decay: float,
                  max_epochs: int, max_new_tokens: int, before_epoch: Optional[int] = None) -> _PromptStats:
    """Summaries for predicting epoch latest+1 (or, with `before_epoch=latest`, for back-testing `latest`)."""
    G = len(prompt_ids)
    view = history.gather(prompt_ids, max_epochs=max_epochs, before_epoch=before_epoch)
    logs = np.log(np.maximum(view.length, 1).astype(np.float64)) + \
        drift.offset(view.epoch, extrapolate=before_epoch is None)
    ref_epoch = int(view.epoch.max()) if len(view.epoch) else 0
    weight = decay ** (ref_epoch - view.epoch).astype(np.float64)
    center = _weighted_median(view.group, logs, weight, G)
    count = np.bincount(view.group, minlength=G).astype(np.float64)
    wsum = np.bincount(view.group, weights=weight, minlength=G)
    w2 = np.bincount(view.group, weights=weight ** 2, minlength=G)
    neff = np.where(w2 > 0, wsum ** 2 / np.where(w2 > 0, w2, 1.0), 0.0)
    recmed = _record_medians(view, logs)
    within_ss = np.bincount(view.group, weights=(logs - recmed[view.record]) ** 2, minlength=G) \
        if len(logs) else np.zeros(G)
    within_dof = count - np.bincount(view.record_group, minlength=G)
    total_ss = np.bincount(view.group, weights=(logs - center[view.group]) ** 2, minlength=G) \
        if len(logs) else np.zeros(G)
    capped = view.length >= max_new_tokens
    at_cap = np.bincount(view.group, weights=capped.astype(np.float64), minlength=G)
    over_cap = np.bincount(view.group, weights=(~capped & (logs >= np.log(max_new_tokens))).astype(np.float64),
                           minlength=G)
    shift = logs - np.log(np.maximum(view.length, 1).astype(np.float64))
    last_median = np.full(G, np.nan)
    last_count = np.zeros(G)
    if len(view.record_group):
        at_ref = view.record_epoch == ref_epoch
        last_median[view.record_group[at_ref]] = recmed[at_ref]
        last_count[view.record_group[at_ref]] = np.bincount(view.record, minlength=len(recmed))[at_ref]
    return _PromptStats(center, count, neff, within_ss, within_dof, total_ss, at_cap, over_cap,
                        view.group[capped].astype(np.int64), shift[capped], count > 0,
                        last_median, last_count, view.group.astype(np.int64), logs, capped, weight)


@dataclass
class _Spread:
    """Within-group log-spread per prompt, and the uncertainty of each prompt's log median (center)."""

    within: np.ndarray
    center_sd: np.ndarray
    pooled_within: float
    drift_sd: float
    mode: str  # "within" (groups of n >= 2) or "total" (one sample per epoch: spread around the center)


_MEDIAN_VAR = np.pi / 2.0  # variance of a sample median is about (pi/2) sigma^2 / N


def _fit_spread(stats: _PromptStats, backtest: Optional[_PromptStats], shrinkage: float, min_sigma: float,
                prior_within: float) -> _Spread:
    """Shrunk within-group sigma, plus the center's uncertainty measured by back-testing the latest epoch."""
    k = shrinkage
    if stats.within_dof.sum() > 0:
        pooled_var = float(stats.within_ss.sum() / stats.within_dof.sum())
        var = (stats.within_ss + k * pooled_var) / np.maximum(stats.within_dof + k, 1e-12)
        var = np.where(stats.within_dof + k > 0, var, pooled_var)
        within = np.maximum(np.sqrt(var), min_sigma)
        est_var = np.where(stats.neff > 0, _MEDIAN_VAR * within ** 2 / np.maximum(stats.neff, 1e-12), 0.0)
        drift_var = 0.0
        if backtest is not None:
            both = backtest.has & (stats.last_count > 0)
            if both.any():
                err2 = (backtest.center[both] - stats.last_median[both]) ** 2
                noise = _MEDIAN_VAR * within[both] ** 2 * (1.0 / stats.last_count[both] +
                                                           1.0 / np.maximum(backtest.neff[both], 1e-12))
                drift_var = max(float(np.mean(err2 - noise)), 0.0)
        return _Spread(within, np.sqrt(drift_var + est_var), float(np.sqrt(pooled_var)), float(np.sqrt(drift_var)),
                       "within")
    dof = np.maximum(stats.count - 1, 0)
    pooled_var = float(stats.total_ss.sum() / dof.sum()) if dof.sum() > 0 else prior_within ** 2
    var = (stats.total_ss + k * pooled_var) / np.maximum(dof + k, 1e-12)
    var = np.where(dof + k > 0, var, pooled_var)
    within = np.maximum(np.sqrt(var), min_sigma)
    return _Spread(within, np.zeros(len(within)), float(np.sqrt(pooled_var)), 0.0, "total")


def _analyse(prompts: PromptSet, history: Optional[LengthHistory], decay: float, max_epochs: int, drift: bool,
             shrinkage: float, min_sigma: float, prior_within: float, max_new_tokens: int):
    """Drift model, per-prompt stats, spread and cold-start reference for a history (None without history).

    The cold-start reference is the centers of the asked prompts that have history; when none has any
    (a window of new prompts), it is the centers of every prompt in the history instead, so the dataset's
    observed lengths still beat the prior.
    """
    if history is None or len(history) == 0:
        return None
    epochs = np.asarray(history.epochs(), dtype=np.int64)
    model = DriftModel.fit(history, decay, max_epochs) if drift else DriftModel.none(epochs)
    stats = _prompt_stats(prompts.prompt_ids, history, model, decay, max_epochs, max_new_tokens)
    ref_ids, ref_stats, fallback = prompts.prompt_ids, stats, None
    if not stats.has.any():
        ref_ids = history.prompt_ids()
        ref_stats = _prompt_stats(ref_ids, history, model, decay, max_epochs, max_new_tokens)
        fallback = ref_stats.center[ref_stats.has]
    backtest = None
    if len(epochs) >= 2:
        backtest = _prompt_stats(ref_ids, history, model, decay, max_epochs, max_new_tokens,
                                 before_epoch=int(epochs[-1]))
    spread = _fit_spread(ref_stats, backtest, shrinkage, min_sigma, prior_within)
    if fallback is not None:  # per-prompt arrays must describe the asked prompts (none has history)
        G = len(prompts)
        spread = _Spread(np.full(G, spread.pooled_within), np.zeros(G), spread.pooled_within, spread.drift_sd,
                         spread.mode)
    return model, stats, spread, fallback


class ColdStartEstimator:
    """Lengths of prompts without history, from prompt length, data source and the dataset's lengths.

    Fitted on the prompts of the same PromptSet that do have history: a global median (drift-adjusted),
    a shrunk per-source offset and a least-squares slope on log prompt length. The center's uncertainty is
    the residual spread of that fit across prompts (it knows nothing specific about the prompt), so its
    group max is wide. Without any history it falls back to a prior: median = `prior_median_frac *
    max_new_tokens`, center uncertainty `prior_sigma`, within-group spread `prior_within`.
    """

    name = "cold_start"

    def __init__(self, group_max_quantile: float = 0.8, source_shrinkage: float = 20.0,
                 prior_median_frac: float = 0.25, prior_sigma: float = 1.0, prior_within: float = 0.5,
                 recency_decay: float = 0.5, max_epochs: int = 4, drift: bool = True,
                 sigma_shrinkage: float = 4.0) -> None:
        self.q = group_max_quantile
        self.source_shrinkage = source_shrinkage
        self.prior_median_frac = prior_median_frac
        self.prior_sigma = prior_sigma
        self.prior_within = prior_within
        self.recency_decay = recency_decay
        self.max_epochs = max_epochs
        self.drift = drift
        self.sigma_shrinkage = sigma_shrinkage

    def fit_predict(self, prompts: PromptSet, ref_index: np.ndarray, ref_center: np.ndarray,
                    within_sigma: float, max_new_tokens: int,
                    fallback_center: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
        """Predict log center, within sigma and center uncertainty for every prompt from reference prompts.

        `ref_index` rows of `prompts` have history with log centers `ref_center`; without any, the centers
        of other prompts (`fallback_center`) give a global median, and without those the prior is used.
        """
        G = len(prompts)
        if len(ref_index) == 0 and fallback_center is not None and len(fallback_center):
            between = float(np.var(fallback_center)) if len(fallback_center) > 1 else self.prior_sigma ** 2
            return {"center": np.full(G, float(np.median(fallback_center))), "within": np.full(G, within_sigma),
                    "center_sd": np.full(G, np.sqrt(between)), "slope": 0.0}
        if len(ref_index) == 0:
            center = np.full(G, np.log(max(self.prior_median_frac * max_new_tokens, 1.0)))
            return {"center": center, "within": np.full(G, self.prior_within),
                    "center_sd": np.full(G, self.prior_sigma), "slope": 0.0}
        base = float(np.median(ref_center))
        resid = ref_center - base
        pred = np.full(G, base)
        slope = 0.0
        x_all = np.log1p(np.asarray(prompts.prompt_lens, dtype=np.float64))
        x = x_all[ref_index]
        if len(ref_index) >= 20 and np.var(x) > 1e-9:
            slope = float(np.cov(x, resid)[0, 1] / np.var(x, ddof=1))
            pred = pred + slope * (x_all - x.mean())
            resid = resid - slope * (x - x.mean())
        if prompts.sources is not None:
            src = np.asarray(prompts.sources).astype(str)
            names, code = np.unique(src, return_inverse=True)
            code = code.reshape(-1)
            sums = np.bincount(code[ref_index], weights=resid, minlength=len(names))
            cnt = np.bincount(code[ref_index], minlength=len(names))
            offset = sums / (cnt + self.source_shrinkage)
            pred = pred + offset[code]
            resid = resid - offset[code[ref_index]]
        between = float(np.var(resid)) if len(resid) > 1 else self.prior_sigma ** 2
        return {"center": pred, "within": np.full(G, within_sigma), "center_sd": np.full(G, np.sqrt(between)),
                "slope": slope}

    def estimate(self, prompts: PromptSet, history: Optional[LengthHistory], max_new_tokens: int) -> LengthEstimate:
        found = _analyse(prompts, history, self.recency_decay, self.max_epochs, self.drift, self.sigma_shrinkage,
                         0.05, self.prior_within, max_new_tokens)
        if found is None:
            pred = self.fit_predict(prompts, np.zeros(0, dtype=np.int64), np.zeros(0), self.prior_within,
                                    max_new_tokens)
            drift_factor = 1.0
        else:
            model, stats, spread, fallback = found
            ref = np.flatnonzero(stats.has)
            pred = self.fit_predict(prompts, ref, stats.center[ref], spread.pooled_within, max_new_tokens,
                                    fallback)
            drift_factor = model.factor
        return _finish(prompts, pred["center"], pred["within"], pred["center_sd"],
                       np.zeros(len(prompts), dtype=bool), self.q, max_new_tokens, self.name,
                       {"group_max_quantile": self.q, "slope_log_prompt_len": pred["slope"],
                        "drift_factor": drift_factor})


def residual_pool(stats: _PromptStats, center: np.ndarray) -> ResidualPool:
    """The window's drift-adjusted history samples as log residuals around each prompt's predicted center:
    scenario sampling resamples them (`scenarios.sample_scenarios`), keeping the shape of each prompt's
    own lengths (bimodal, cap spike) that a log-normal around the median loses."""
    G = len(center)
    offsets = np.concatenate(([0], np.cumsum(np.bincount(stats.sample_group, minlength=G)))).astype(np.int64)
    return ResidualPool(offsets=offsets, resid=stats.sample_log - center[stats.sample_group],
                        capped=stats.sample_at_cap.copy(), weight=stats.sample_weight.copy())


def _finish(prompts: PromptSet, center: np.ndarray, within: np.ndarray, center_sd: np.ndarray, has: np.ndarray,
            q: float, max_new_tokens: int, name: str, params: Dict[str, float],
            p_trunc: Optional[np.ndarray] = None) -> LengthEstimate:
    """Turn log centers and spreads into a clipped LengthEstimate."""
    cap = float(max_new_tokens)
    median = np.clip(np.exp(center), 1.0, cap)
    gmax = np.clip(group_max_quantile(np.exp(center), within, prompts.n, q, center_sd), median, cap)
    if p_trunc is None:
        p_trunc = truncation_probability(center, np.sqrt(within ** 2 + center_sd ** 2), max_new_tokens)
    return LengthEstimate(median=median, group_max=gmax, sigma=np.asarray(within, dtype=np.float64),
                          p_trunc=np.clip(p_trunc, 0.0, 1.0), has_history=has, estimator=name,
                          params=dict(params))


class HistoryEstimator:
    """Per-prompt prediction from the prompt's own earlier lengths (the recommended primary signal).

    center_i = recency-weighted (decay**age) interpolated median of drift-adjusted log-lengths over the
    prompt's last `max_epochs` epochs; sigma_i = within-group log-spread, shrunk toward the dataset's pooled
    spread with `sigma_shrinkage` pseudo-samples; group_max_i = the q-quantile of the max of n lognormal
    samples (widened by the center's back-tested uncertainty); everything clipped at max_new_tokens.
    Prompts without history use ColdStartEstimator. Formulas: docs/estimation.md.
    """

    name = "history"

    def __init__(self, recency_decay: float = 0.5, max_epochs: int = 4, group_max_quantile: float = 0.8,
                 sigma_shrinkage: float = 4.0, drift: bool = True, min_sigma: float = 0.05,
                 prior_within: float = 0.5) -> None:
        if not 0.0 < recency_decay <= 1.0:
            raise ConfigError(f"recency_decay must be in (0, 1], got {recency_decay}", key="recency_decay")
        if not 0.0 < group_max_quantile < 1.0:
            raise ConfigError(f"group_max_quantile must be in (0, 1), got {group_max_quantile}",
                              key="group_max_quantile")
        if max_epochs < 1:
            raise ConfigError("max_epochs must be >= 1", key="max_epochs")
        if sigma_shrinkage < 0:
            raise ConfigError("sigma_shrinkage must be >= 0", key="sigma_shrinkage")
        self.recency_decay = recency_decay
        self.max_epochs = max_epochs
        self.q = group_max_quantile
        self.sigma_shrinkage = sigma_shrinkage
        self.drift = drift
        self.min_sigma = min_sigma
        self.prior_within = prior_within
        self.cold_start = ColdStartEstimator(group_max_quantile=group_max_quantile, recency_decay=recency_decay,
                                             max_epochs=max_epochs, drift=drift, prior_within=prior_within,
                                             sigma_shrinkage=sigma_shrinkage)

    def params(self) -> Dict[str, float]:
        return {"recency_decay": self.recency_decay, "max_epochs": float(self.max_epochs),
                "group_max_quantile": self.q, "sigma_shrinkage": self.sigma_shrinkage,
                "drift": float(self.drift)}

    def estimate(self, prompts: PromptSet, history: Optional[LengthHistory], max_new_tokens: int) -> LengthEstimate:
        found = _analyse(prompts, history, self.recency_decay, self.max_epochs, self.drift, self.sigma_shrinkage,
                         self.min_sigma, self.prior_within, max_new_tokens)
        params = self.params()
        if found is None:
            pred = self.cold_start.fit_predict(prompts, np.zeros(0, dtype=np.int64), np.zeros(0),
                                               self.prior_within, max_new_tokens)
            params.update({"drift_factor": 1.0, "cold_start_frac": 1.0})
            return _finish(prompts, pred["center"], pred["within"], pred["center_sd"],
                           np.zeros(len(prompts), dtype=bool), self.q, max_new_tokens, self.name, params)
        model, stats, spread, fallback = found
        has = stats.has
        ref = np.flatnonzero(has)
        cold = self.cold_start.fit_predict(prompts, ref, stats.center[ref], spread.pooled_within, max_new_tokens,
                                           fallback)
        center = np.where(has, stats.center, cold["center"])
        within = np.where(has, spread.within, cold["within"])
        center_sd = np.where(has, spread.center_sd, cold["center_sd"])
        # truncation: the lognormal tail mass, blended with the observed share of samples at the cap
        model_p = truncation_probability(center, np.sqrt(within ** 2 + center_sd ** 2), max_new_tokens)
        k = self.sigma_shrinkage
        at_cap = drifted_cap_count(stats, center, np.sqrt(within ** 2 + center_sd ** 2), max_new_tokens)
        p_trunc = np.where(has, (at_cap + k * model_p) / np.maximum(stats.count + k, 1.0), model_p)
        params.update({"drift_factor": model.factor, "pooled_sigma": spread.pooled_within,
                       "center_drift_sd": spread.drift_sd, "spread_mode_within": float(spread.mode == "within"),
                       "cold_start_frac": float(1.0 - has.mean()) if len(has) else 0.0})
        est = _finish(prompts, center, within, center_sd, has, self.q, max_new_tokens, self.name, params, p_trunc)
        return replace(est, pool=residual_pool(stats, center))


class OracleEstimator:
    """The true lengths [G, n] of the epoch being planned: for experiments and oracle baselines only."""

    name = "oracle"

    def __init__(self, true_lengths: np.ndarray) -> None:
        arr = np.asarray(true_lengths, dtype=np.float64)
        if arr.ndim != 2 or arr.shape[1] < 1:
            raise ValueError(f"true_lengths must be [G, n], got shape {arr.shape}")
        self.true_lengths = arr

    def estimate(self, prompts: PromptSet, history: Optional[LengthHistory], max_new_tokens: int) -> LengthEstimate:
        truth = np.minimum(self.true_lengths, float(max_new_tokens))
        if truth.shape[0] != len(prompts):
            raise ValueError(f"oracle has {truth.shape[0]} groups, prompt set has {len(prompts)}")
        logs = np.log(np.maximum(truth, 1.0))
        sigma = logs.std(axis=1, ddof=1) if truth.shape[1] > 1 else np.zeros(len(truth))
        return LengthEstimate(median=np.median(truth, axis=1), group_max=truth.max(axis=1), sigma=sigma,
                              p_trunc=(truth >= max_new_tokens).mean(axis=1),
                              has_history=np.ones(len(truth), dtype=bool), estimator=self.name,
                              params={}, samples=truth.copy())


def make_estimator(section: EstimatorSection, true_lengths: Optional[np.ndarray] = None):
    """The estimator an `asp:` config asks for; `oracle` needs the true lengths of the epoch."""
    if section.kind == "history":
        return HistoryEstimator(recency_decay=section.recency_decay, max_epochs=section.max_epochs,
                                group_max_quantile=section.group_max_quantile,
                                sigma_shrinkage=section.sigma_shrinkage, drift=section.drift)
    if section.kind == "cold_start":
        return ColdStartEstimator(group_max_quantile=section.group_max_quantile,
                                  recency_decay=section.recency_decay, max_epochs=section.max_epochs,
                                  drift=section.drift)
    if section.kind == "oracle":
        if true_lengths is None:
            raise ConfigError("the oracle estimator needs the true lengths of the epoch (a trace or a "
                              "synthetic workload); use kind 'history' for real runs", key="asp.estimator.kind")
        return OracleEstimator(true_lengths)
    raise ConfigError(f"unknown estimator kind {section.kind!r}", key="asp.estimator.kind")
