"""Fluid (expected-value) work model of prompt groups and instances, shared by all planners.

Why a fluid model: under continuous batching an instance's time is `a*S_j + b*sum L + c*sum KV + p*sum P`
(docs/design.md#cost-model), and only the step count S_j depends on the order. Planners therefore balance the
order-independent work and approximate S_j by `max(sum L / B, max group length)`. Everything here is
vectorised numpy over groups so a 10^5-group window costs milliseconds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np

from mindspeed_asp.core.problem import CostModel, PlanningProblem


@dataclass(frozen=True)
class GroupMoments:
    """Per-group expected quantities (arrays of length G) derived from a LengthEstimate.

    `mean_len`/`mean_sq` are E[L] and E[L^2] of one sample (lognormal around the median, clipped at
    max_new_tokens), `area` = n*E[L] the slot-steps the group occupies, `gmax` the predicted group max (steps
    until the group is complete once admitted), `work` the cross-instance seconds of the group's n samples.
    """

    mean_len: np.ndarray
    mean_sq: np.ndarray
    area: np.ndarray
    gmax: np.ndarray
    kv: np.ndarray
    prompt_len: np.ndarray
    prefill: np.ndarray
    work: np.ndarray


def group_moments(problem: PlanningProblem) -> GroupMoments:
    """Expected per-group load of `problem` under its estimate and cost model."""
    est = problem.estimate
    n = problem.prompts.n
    cap = float(problem.max_new_tokens)
    plen = np.asarray(problem.prompts.prompt_lens, dtype=np.float64)
    if est.samples is not None:
        s = np.minimum(np.asarray(est.samples, dtype=np.float64), cap)
        mean_len = s.mean(axis=1)
        mean_sq = (s * s).mean(axis=1)
        gmax = s.max(axis=1)
    else:
        med = np.asarray(est.median, dtype=np.float64)
        sig = np.nan_to_num(np.asarray(est.sigma, dtype=np.float64), nan=0.0)
        mean_len = np.minimum(med * np.exp(0.5 * sig * sig), cap)
        mean_sq = np.minimum(med * med * np.exp(2.0 * sig * sig), cap * cap)
        mean_sq = np.maximum(mean_sq, mean_len * mean_len)
        gmax = np.minimum(np.maximum(np.asarray(est.group_max, dtype=np.float64), mean_len), cap)
    mean_len = np.maximum(mean_len, 1.0)
    mean_sq = np.maximum(mean_sq, 1.0)
    gmax = np.maximum(gmax, 1.0)
    c = problem.cost
    kv = n * (plen * mean_len + 0.5 * (mean_sq - mean_len))
    area = n * mean_len
    prefill = n * plen
    work = c.a * area / problem.spec.slots + c.b * area + c.c * kv + c.p * prefill
    return GroupMoments(mean_len=mean_len, mean_sq=mean_sq, area=area, gmax=gmax, kv=kv,
                        prompt_len=plen, prefill=prefill, work=work)


def instance_times(inst: np.ndarray, gm: GroupMoments, m: int, cost: CostModel, slots: int) -> np.ndarray:
    """Fluid busy time of each instance: a*max(sum area/B, max gmax) + b*sum area + c*sum KV + p*prefill."""
    area = np.bincount(inst, weights=gm.area, minlength=m)
    kv = np.bincount(inst, weights=gm.kv, minlength=m)
    pre = np.bincount(inst, weights=gm.prefill, minlength=m)
    longest = np.zeros(m)
    np.maximum.at(longest, inst, gm.gmax)
    steps = np.maximum(area / slots, longest)
    return cost.a * steps + cost.b * area + cost.c * kv + cost.p * pre


def bound_terms(work: np.ndarray, fixed: np.ndarray, solo: np.ndarray, m: int,
                kv_work: Optional[np.ndarray] = None) -> Dict[str, float]:
    """Every term of R_LB (docs/design.md#lower-bounds) from per-group figures; R_LB is their maximum.

    `work` w_g: the group's cross-instance work (a-term shared over the B slots); `fixed` f_g: its
    order-independent part (b, c, p terms: paid whatever runs beside it); `solo` s_g = a * (longest sample) +
    f_g: the group run alone (its samples share one instance, so its longest sample sets a*steps);
    `kv_work`: the work with the a-term shared over the KV budget instead (a*KV_g/K_max + f_g), when one binds.
    Terms (each a valid lower bound on the makespan of any plan, stealing and preemption included):
    work = sum w / m (and sum kv_work / m); solo = max s_g; pair = w_(m) + w_(m+1) (two of the m+1 largest
    share an instance); anchor = for every group g, the instance holding g runs at least s_g + f(X) where X
    is the rest of its load, and the other m-1 instances carry the rest: min over x of
    max(s_g + phi x, (W - w_g - x)/(m - 1)) with phi = min_h f_h/w_h (the cheapest marginal cost of work
    added beside a long group; 1 instance: s_g + sum of the other groups' f).
    """
    w = np.asarray(work, dtype=np.float64)
    out = {"work_bound": 0.0, "solo_bound": 0.0, "pair_bound": 0.0, "anchor_bound": 0.0, "kv_work_bound": 0.0,
           "R_LB": 0.0}
    G = len(w)
    if G == 0:
        return out
    f = np.asarray(fixed, dtype=np.float64)
    s = np.asarray(solo, dtype=np.float64)
    out["work_bound"] = float(w.sum()) / m
    out["solo_bound"] = float(s.max())
    if G > m:
        top = np.sort(np.partition(w, G - m - 1)[G - m - 1:])[::-1]
        out["pair_bound"] = float(top[m - 1] + top[m])
    works = [w]
    if kv_work is not None:
        kw = np.asarray(kv_work, dtype=np.float64)
        out["kv_work_bound"] = float(kw.sum()) / m
        works.append(kw)
    anchor = 0.0
    for wv in works:
        if m == 1:
            anchor = max(anchor, float((s + (f.sum() - f)).max()))
            continue
        pos = wv > 0
        phi = float(np.min(f[pos] / wv[pos])) if pos.any() else 1.0
        rest = float(wv.sum()) - wv  # W - w_g
        x = np.maximum(rest - (m - 1) * s, 0.0) / (1.0 + (m - 1) * phi)
        anchor = max(anchor, float((s + phi * x).max()))
    out["anchor_bound"] = anchor
    out["R_LB"] = max(out["work_bound"], out["solo_bound"], out["pair_bound"], out["anchor_bound"],
                      out["kv_work_bound"])
    return out


def group_bound_inputs(gm: GroupMoments, cost: CostModel, kv_budget: Optional[float] = None):
    """(work, fixed, solo, kv_work) of `bound_terms` under the predictions of `gm`."""
    fixed = cost.b * gm.area + cost.c * gm.kv + cost.p * gm.prefill
    solo = cost.a * gm.gmax + fixed
    kv_work = None if not kv_budget else cost.a * gm.kv / float(kv_budget) + fixed
    return gm.work, fixed, solo, kv_work


def rollout_lower_bound(gm: GroupMoments, m: int, cost: CostModel, kv_budget: Optional[float] = None) -> float:
    """R_LB of docs/design.md#lower-bounds under the predictions (`bound_terms`: work, solo, pair, anchor and,
    with a KV budget, the KV work term)."""
    work, fixed, solo, kv_work = group_bound_inputs(gm, cost, kv_budget)
    return bound_terms(work, fixed, solo, m, kv_work=kv_work)["R_LB"]
