"""Response-length estimators: history-based, cold start, and an oracle for experiments.

All three return a `LengthEstimate` (median, group-max quantile, within-group sigma, truncation probability
per prompt group). The planners balance and order by these numbers, so what matters most is the rank of the
medians and a calibrated upper quantile of the group max (a group finishes with its longest sample).
The formulas are documented in docs/estimation.md; everything is vectorised over groups.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
from scipy.special import ndtr, ndtri

from mindspeed_asp.config import EstimatorSection
from mindspeed_asp.errors import ConfigError
from mindspeed_asp.scheduler.history import HistorySamples, LengthHistory
from mindspeed_asp.scheduler.types import LengthEstimate, PromptSet


def group_max_quantile(median: np.ndarray, sigma: np.ndarray, n: int, q: float) -> np.ndarray:
    """Quantile q of the max of n i.i.d. lognormal(log median, sigma) samples: median*exp(sigma*Phi^-1(q^(1/n)))."""
    z = float(ndtri(q ** (1.0 / max(int(n), 1))))
    return np.asarray(median, dtype=np.float64) * np.exp(np.asarray(sigma, dtype=np.float64) * z)


def truncation_probability(log_median: np.ndarray, sigma: np.ndarray, max_new_tokens: int) -> np.ndarray:
    """P(a lognormal sample reaches the cap): the mass the engine truncates into the spike at max_new_tokens."""
    sigma = np.maximum(np.asarray(sigma, dtype=np.float64), 1e-6)
    return 1.0 - ndtr((np.log(max_new_tokens) - log_median) / sigma)


def _weighted_median(group: np.ndarray, value: np.ndarray, weight: np.ndarray, num_groups: int) -> np.ndarray:
    """Interpolated weighted median per group (NaN for empty groups).

    Each sample sits at the midpoint of its cumulative-weight interval; the median is interpolated at 1/2.
    Unlike the plain weighted median this never collapses onto one heavy (recent) sample, so older epochs
    still vote: with weights 0.25/0.5/1 the latest sample alone would otherwise always win.
    """
    out = np.full(num_groups, np.nan)
    if len(value) == 0:
        return out
    order = np.lexsort((value, group))
    g, v, w = group[order], value[order], weight[order]
    total = np.bincount(g, weights=w, minlength=num_groups)
    csum = np.cumsum(w)
    start = np.concatenate(([0], np.flatnonzero(g[1:] != g[:-1]) + 1))
    before = np.repeat(csum[start] - w[start], np.diff(np.concatenate((start, [len(g)]))))
    pos = (csum - before - w / 2.0) / total[g]  # midpoint position in [0, 1] within the group
    # first sample whose midpoint is >= 1/2, per group
    ge = pos >= 0.5
    key = np.where(ge, np.arange(len(g)), len(g))
    first_ge = np.full(num_groups, len(g))
    np.minimum.at(first_ge, g, key)
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
    order = np.lexsort((logs, view.record))
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

    def offset(self, epoch: np.ndarray) -> np.ndarray:
        if len(self.epochs) == 0:
            return np.zeros(len(epoch))
        after = np.concatenate((np.cumsum(self.step[::-1])[::-1], [0.0]))  # drift from epoch k to latest
        k = np.searchsorted(self.epochs, epoch)
        return after[k] + self.next_step

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
        order = np.lexsort((logs, rec))
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


class ColdStartEstimator:
    """Lengths of prompts without history, from prompt length, data source and the dataset's lengths.

    Fitted on the prompts of the same PromptSet that do have history: a global median (drift-adjusted),
    a shrunk per-source offset and a least-squares slope on log prompt length. Its sigma is the spread of
    lengths across such prompts (it knows nothing specific about the prompt), so its group max is wide.
    Without any history it falls back to a prior: median = `prior_median_frac * max_new_tokens`,
    sigma = `prior_sigma`.
    """

    name = "cold_start"

    def __init__(self, group_max_quantile: float = 0.8, source_shrinkage: float = 20.0,
                 prior_median_frac: float = 0.25, prior_sigma: float = 1.0, recency_decay: float = 0.5,
                 max_epochs: int = 4, drift: bool = True) -> None:
        self.q = group_max_quantile
        self.source_shrinkage = source_shrinkage
        self.prior_median_frac = prior_median_frac
        self.prior_sigma = prior_sigma
        self.recency_decay = recency_decay
        self.max_epochs = max_epochs
        self.drift = drift

    def fit_predict(self, prompts: PromptSet, ref_index: np.ndarray, ref_center: np.ndarray,
                    within_sigma: float, max_new_tokens: int) -> Dict[str, np.ndarray]:
        """Predict (log center, sigma) for every prompt from reference prompts with known log centers."""
        G = len(prompts)
        if len(ref_index) == 0:
            center = np.full(G, np.log(max(self.prior_median_frac * max_new_tokens, 1.0)))
            return {"center": center, "sigma": np.full(G, self.prior_sigma), "slope": 0.0}
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
        sigma = float(np.sqrt(between + within_sigma ** 2))
        return {"center": pred, "sigma": np.full(G, sigma), "slope": slope}

    def estimate(self, prompts: PromptSet, history: Optional[LengthHistory], max_new_tokens: int) -> LengthEstimate:
        stats = _HistoryStats.build(prompts, history, self.recency_decay, self.max_epochs, self.drift)
        ref = np.flatnonzero(stats.has)
        pred = self.fit_predict(prompts, ref, stats.center[ref], stats.pooled_sigma, max_new_tokens)
        return _finish(prompts, pred["center"], pred["sigma"], np.zeros(len(prompts), dtype=bool), self.q,
                       max_new_tokens, self.name,
                       {"group_max_quantile": self.q, "slope_log_prompt_len": pred["slope"],
                        "drift_factor": stats.drift.factor})


@dataclass
class _HistoryStats:
    """Per-prompt drift-adjusted summaries of the history, shared by the history and cold-start estimators."""

    center: np.ndarray  # log median per prompt (NaN without history)
    resid_ss: np.ndarray  # sum of squared residuals around the center
    dof: np.ndarray  # samples - 1 (0 without history)
    count: np.ndarray  # samples
    at_cap_count: np.ndarray  # samples observed at or above max_new_tokens (filled later)
    has: np.ndarray  # bool
    pooled_sigma: float
    drift: DriftModel
    view: Optional[HistorySamples]

    @staticmethod
    def build(prompts: PromptSet, history: Optional[LengthHistory], decay: float, max_epochs: int,
              drift: bool) -> "_HistoryStats":
        G = len(prompts)
        if history is None or len(history) == 0:
            z = np.zeros(G)
            return _HistoryStats(np.full(G, np.nan), z, z.copy(), z.copy(), z.copy(), np.zeros(G, dtype=bool),
                                 0.0, DriftModel.none(np.zeros(0, dtype=np.int64)), None)
        model = DriftModel.fit(history, decay, max_epochs) if drift else \
            DriftModel.none(np.asarray(history.epochs(), dtype=np.int64))
        view = history.gather(prompts.prompt_ids, max_epochs=max_epochs)
        logs = np.log(np.maximum(view.length, 1).astype(np.float64)) + model.offset(view.epoch)
        latest = history.latest_epoch()
        weight = decay ** (latest - view.epoch).astype(np.float64)
        center = _weighted_median(view.group, logs, weight, G)
        count = view.counts().astype(np.float64)
        has = count > 0
        resid = logs - center[view.group]
        resid_ss = np.bincount(view.group, weights=resid ** 2, minlength=G)
        dof = np.maximum(count - 1, 0)
        pooled = float(np.sqrt(resid_ss.sum() / dof.sum())) if dof.sum() > 0 else 0.0
        return _HistoryStats(center, resid_ss, dof, count, np.zeros(G), has, pooled, model, view)


def _finish(prompts: PromptSet, center: np.ndarray, sigma: np.ndarray, has: np.ndarray, q: float,
            max_new_tokens: int, name: str, params: Dict[str, float],
            p_trunc: Optional[np.ndarray] = None) -> LengthEstimate:
    """Turn log centers and sigmas into a clipped LengthEstimate."""
    cap = float(max_new_tokens)
    median = np.clip(np.exp(center), 1.0, cap)
    gmax = np.clip(group_max_quantile(np.exp(center), sigma, prompts.n, q), median, cap)
    if p_trunc is None:
        p_trunc = truncation_probability(center, sigma, max_new_tokens)
    return LengthEstimate(median=median, group_max=gmax, sigma=np.asarray(sigma, dtype=np.float64),
                          p_trunc=np.clip(p_trunc, 0.0, 1.0), has_history=has, estimator=name,
                          params=dict(params))


class HistoryEstimator:
    """Per-prompt prediction from the prompt's own earlier lengths (the recommended primary signal).

    center_i = recency-weighted (decay**age) interpolated median of drift-adjusted log-lengths over the
    prompt's last `max_epochs` epochs; sigma_i = within-prompt spread around that center, shrunk toward the
    dataset's pooled spread with `sigma_shrinkage` pseudo-samples; group_max_i = the q-quantile of the max of
    n lognormal samples; everything clipped at max_new_tokens. Prompts without history use ColdStartEstimator.
    """

    name = "history"

    def __init__(self, recency_decay: float = 0.5, max_epochs: int = 4, group_max_quantile: float = 0.8,
                 sigma_shrinkage: float = 4.0, drift: bool = True, min_sigma: float = 0.05) -> None:
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
        self.cold_start = ColdStartEstimator(group_max_quantile=group_max_quantile, recency_decay=recency_decay,
                                             max_epochs=max_epochs, drift=drift)

    def params(self) -> Dict[str, float]:
        return {"recency_decay": self.recency_decay, "max_epochs": float(self.max_epochs),
                "group_max_quantile": self.q, "sigma_shrinkage": self.sigma_shrinkage,
                "drift": float(self.drift)}

    def estimate(self, prompts: PromptSet, history: Optional[LengthHistory], max_new_tokens: int) -> LengthEstimate:
        stats = _HistoryStats.build(prompts, history, self.recency_decay, self.max_epochs, self.drift)
        has = stats.has
        ref = np.flatnonzero(has)
        cold = self.cold_start.fit_predict(prompts, ref, stats.center[ref], stats.pooled_sigma, max_new_tokens)
        k = self.sigma_shrinkage
        global_var = stats.pooled_sigma ** 2
        denom = stats.dof + k
        var = np.where(denom > 0, (stats.resid_ss + k * global_var) / np.where(denom > 0, denom, 1.0), global_var)
        sigma = np.maximum(np.sqrt(var), self.min_sigma)
        center = np.where(has, stats.center, cold["center"])
        sigma = np.where(has, sigma, cold["sigma"])
        # truncation: the lognormal tail mass, blended with the observed share of samples at the cap
        model_p = truncation_probability(center, sigma, max_new_tokens)
        p_trunc = model_p
        if stats.view is not None and len(stats.view.length):
            at_cap = np.bincount(stats.view.group, weights=(stats.view.length >= max_new_tokens).astype(float),
                                 minlength=len(prompts))
            p_trunc = np.where(has, (at_cap + k * model_p) / (stats.count + k if k > 0 else
                                                              np.maximum(stats.count, 1)), model_p)
        params = self.params()
        params.update({"drift_factor": stats.drift.factor, "pooled_sigma": stats.pooled_sigma,
                       "cold_start_frac": float(1.0 - has.mean()) if len(has) else 0.0})
        return _finish(prompts, center, sigma, has, self.q, max_new_tokens, self.name, params, p_trunc)


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
