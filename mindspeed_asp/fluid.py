"""Fluid (expected-value) work model of prompt groups and instances, shared by all planners.

Why a fluid model: under continuous batching an instance's time is `a*S_j + b*sum L + c*sum KV + p*sum P`
(docs/design.md section 11.2), and only the step count S_j depends on the order. Planners therefore balance the
order-independent work and approximate S_j by `max(sum L / B, max group length)`. Everything here is
vectorised numpy over groups so a 10^5-group window costs milliseconds.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mindspeed_asp.types import CostModel, PlanningProblem


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


def rollout_lower_bound(gm: GroupMoments, m: int, cost: CostModel) -> float:
    """R_LB of docs/design.md section 5 under the predictions: max(work/m, longest solo, w_(m) + w_(m+1))."""
    if len(gm.work) == 0:
        return 0.0
    total = float(gm.work.sum()) / m
    solo = float(cost.solo_time(gm.gmax, gm.prompt_len).max())
    pair = 0.0
    if len(gm.work) > m:
        top = np.partition(gm.work, len(gm.work) - m - 1)[len(gm.work) - m - 1:]
        top = np.sort(top)[::-1]
        pair = float(top[m - 1] + top[m])
    return max(total, solo, pair)
