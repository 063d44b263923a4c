"""The simulator's lower bounds and the bubbles only a simulation sees, as docs/design.md#metrics defines them.

Why here: a bound that is wrong by a little makes every "% above bound" meaningless, so the bounds live in one
place with tests that no simulated plan ever beats them. The metrics a measured run reports too (lag
statistics, skewness, tail share, padding) are `mindspeed_asp.core.metrics`'s, shared with the run recorder.

Notation: T_j busy time of instance j, R = max_j T_j, S_j decode steps, L true lengths, B slots, m instances.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import numpy as np

from mindspeed_asp.core.fluid import bound_terms
from mindspeed_asp.core.metrics import micro_batch_padding, padding_share
from mindspeed_asp.core.problem import CostModel, InstanceSpec

METRIC_NAMES = (
    "bubble/padding", "bubble/padding_train", "bubble/dp_imbalance",
    "bubble/skewness", "bubble/skew_gap", "bubble/tail_share",
    "bubble/sorting", "bubble/startup", "bubble/queue_cv", "bubble/arrival_gap_cv", "bubble/queue_starved",
    "lag/mean", "lag/p99", "lag/max", "lag/frac_over_bound", "lag/stale_dropped",
    "throughput/e2e_tps", "throughput/rollout_tps",
    "time/iteration", "time/rollout", "time/train", "time/weight_sync",
)


def percent_above(value: float, bound: float) -> float:
    """How far a value is above its lower bound, in percent: 100 * (value / bound - 1)."""
    if bound is None or not np.isfinite(bound) or bound <= 0:
        return float("nan")
    return 100.0 * (float(value) / float(bound) - 1.0)


# ------------------------------------------------------------------------------------------ lower bounds
def _solo_times(lengths: np.ndarray, prompt_lens: np.ndarray, cost, scale: float = 1.0) -> np.ndarray:
    """Time of each sequence run alone [G, n] (every one of its steps costs at least this)."""
    L = np.asarray(lengths, dtype=np.float64)
    P = np.broadcast_to(np.asarray(prompt_lens, dtype=np.float64)[:, None], L.shape)
    if isinstance(cost, CostModel):
        return scale * cost.solo_time(L, P)
    from mindspeed_asp.sim.step_cost import make_intervals

    iv = make_intervals(cost, scale)
    out = np.empty(L.shape)
    for idx in np.ndindex(L.shape):
        out[idx] = iv.interval(1, P[idx], int(L[idx]), P[idx])
    return out


def group_work(lengths: np.ndarray, prompt_lens: np.ndarray, cost: CostModel, slots: int,
               scale: float = 1.0) -> np.ndarray:
    """Cross-instance work w_g of each group (docs/design.md#cost-model): a lower bound on the time it adds."""
    L = np.asarray(lengths, dtype=np.float64)
    P = np.broadcast_to(np.asarray(prompt_lens, dtype=np.float64)[:, None], L.shape)
    return scale * cost.sequence_work(L, P, slots).sum(axis=1)


def rollout_lower_bound(lengths: np.ndarray, prompt_lens: np.ndarray, instances: int, spec: InstanceSpec,
                        cost, scale: float = 1.0) -> Dict[str, float]:
    """R_LB = max of the terms of `mindspeed_asp.core.fluid.bound_terms` on the true lengths: total work / m (and,
    with a KV budget, the work with the a-term over the budget), the longest group run alone (its samples
    share one instance; at least the longest sequence's solo time), w_(m) + w_(m+1), and the anchor term (the
    instance holding a long group also runs its share of the rest).

    The work, pair and anchor terms need the linear CostModel (its a-term split is what makes work additive);
    for a tabulated cost only the single-sequence solo term is reported.
    """
    solo = float(_solo_times(lengths, prompt_lens, cost, scale).max()) if np.size(lengths) else 0.0
    out = {"rollout/solo_bound": solo, "rollout/work_bound": float("nan"), "rollout/pair_bound": float("nan"),
           "rollout/anchor_bound": float("nan"), "rollout/kv_work_bound": float("nan")}
    if isinstance(cost, CostModel) and np.size(lengths):
        L = np.asarray(lengths, dtype=np.float64)
        P = np.broadcast_to(np.asarray(prompt_lens, dtype=np.float64)[:, None], L.shape)
        kv = (P * L + L * (L - 1) / 2.0).sum(axis=1)
        fixed = scale * (cost.b * L.sum(axis=1) + cost.c * kv + cost.p * P.sum(axis=1))
        w = group_work(lengths, prompt_lens, cost, spec.slots, scale)
        kv_work = scale * cost.a * kv / float(spec.kv_budget) + fixed if spec.kv_budget else None
        terms = bound_terms(w, fixed, scale * cost.a * L.max(axis=1) + fixed, instances, kv_work=kv_work)
        for key in ("work_bound", "pair_bound", "anchor_bound", "kv_work_bound"):
            out["rollout/" + key] = terms[key]
        out["rollout/solo_bound"] = max(solo, terms["solo_bound"])
        if len(w) <= instances:
            out["rollout/pair_bound"] = float("nan")
        if not spec.kv_budget:
            out["rollout/kv_work_bound"] = float("nan")
    out["rollout/R_LB"] = float(np.nanmax([out[k] for k in ("rollout/solo_bound", "rollout/work_bound",
                                                            "rollout/pair_bound", "rollout/anchor_bound",
                                                            "rollout/kv_work_bound")]))
    return out


def instance_step_bounds(orders: Sequence[np.ndarray], lengths: np.ndarray, prompt_lens: np.ndarray,
                         spec: InstanceSpec) -> np.ndarray:
    """S_j >= max(ceil(sum L_j / B), max L_j, ceil(sum KV_j / K_max)) for each instance's groups."""
    L = np.asarray(lengths, dtype=np.int64)
    P = np.asarray(prompt_lens, dtype=np.int64)
    out = np.zeros(len(orders), dtype=np.int64)
    for j, o in enumerate(orders):
        o = np.asarray(o, dtype=np.int64)
        if len(o) == 0:
            continue
        Lj = L[o]
        b = max(-(-int(Lj.sum()) // spec.slots), int(Lj.max()))
        if spec.kv_budget is not None:
            kv = (P[o][:, None] * Lj + Lj * (Lj - 1) // 2).sum()
            b = max(b, -(-int(kv) // int(spec.kv_budget)))
        out[j] = b
    return out


def lower_bounds(lengths: np.ndarray, prompt_lens: np.ndarray, instances: int, spec: InstanceSpec, cost,
                 trainer=None, sync_time: float = 0.0, orders: Optional[Sequence[np.ndarray]] = None,
                 scale: float = 1.0, syncs: Optional[int] = None) -> Dict[str, float]:
    """Every lower bound of docs/design.md#lower-bounds that the inputs allow.

    Keys: rollout/{R_LB, work_bound, solo_bound, pair_bound, anchor_bound, kv_work_bound};
    steps/LB (sum over instances, needs `orders`);
    train/total (sum of tau_k); e2e/stream_LB = max(R_LB + tau_min + sync, A1_LB + sum tau + K*sync) and
    e2e/barrier_LB = R_LB + sum tau + syncs*sync (needs `trainer`). `syncs` is the number of weight syncs of the
    barrier run (default 1: one sync per iteration).
    """
    out = rollout_lower_bound(lengths, prompt_lens, instances, spec, cost, scale)
    if orders is not None:
        out["steps/LB"] = float(instance_step_bounds(orders, lengths, prompt_lens, spec).sum())
    if trainer is not None:
        from mindspeed_asp.sim.train_time import group_tokens

        tok = group_tokens(lengths, prompt_lens)
        G = len(tok)
        K = trainer.num_minibatches(G)
        total = trainer.alpha * float(tok.sum()) + K * trainer.overhead
        tau_min = trainer.alpha * float(tok.min()) + trainer.overhead if G else 0.0
        gsolo = _solo_times(lengths, prompt_lens, cost, scale).max(axis=1)
        a1 = float(np.sort(gsolo)[min(trainer.minibatch, G) - 1]) if G else 0.0
        out["train/total"] = total
        out["e2e/first_minibatch_LB"] = a1
        out["e2e/stream_LB"] = max(out["rollout/R_LB"] + tau_min + sync_time, a1 + total + K * sync_time)
        out["e2e/barrier_LB"] = out["rollout/R_LB"] + total + (1 if syncs is None else syncs) * sync_time
    return out


# ------------------------------------------------------------------------------------------ training side
def training_padding(sample_tokens: List[np.ndarray], micro_batch: Optional[int], dp: int) -> Dict[str, float]:
    """bubble/padding_train and bubble/dp_imbalance over the trained minibatches.

    Each minibatch's samples go to `dp` ranks by LPT on tokens (verl-style balance); each rank cuts its
    samples into micro-batches of `micro_batch` (None = one) padded to their longest sample. Padding is padded
    tokens over padded+real tokens; imbalance is the token-weighted mean of max/mean rank load.
    """
    pad = real = 0.0
    imb_w = imb = 0.0
    for toks in sample_tokens:
        toks = np.asarray(toks, dtype=np.float64)
        if len(toks) == 0:
            continue
        if dp == 1:
            ranks = [toks]
        else:
            loads = np.zeros(dp)
            parts: List[list] = [[] for _ in range(dp)]
            for t in np.sort(toks)[::-1]:
                r = int(np.argmin(loads))
                loads[r] += t
                parts[r].append(t)
            ranks = [np.asarray(p) for p in parts]
        rank_loads = np.array([r.sum() for r in ranks])
        if rank_loads.mean() > 0:
            imb += toks.sum() * rank_loads.max() / rank_loads.mean()
            imb_w += toks.sum()
        for r in ranks:
            if len(r) == 0:
                continue
            mb = len(r) if micro_batch is None else micro_batch
            for s in range(0, len(r), mb):
                p, t = micro_batch_padding(r[s:s + mb])
                pad, real = pad + p, real + t
    return {"bubble/padding_train": padding_share(pad, real),
            "bubble/dp_imbalance": imb / imb_w if imb_w > 0 else 1.0}


# ------------------------------------------------------------------------------------------ sorting bubble
def queue_series(arrivals: np.ndarray, consume_times: np.ndarray, consume_counts: np.ndarray):
    """Ready-queue occupancy as a step function: (times, occupancy after each time)."""
    t = np.concatenate([np.asarray(arrivals, dtype=np.float64), np.asarray(consume_times, dtype=np.float64)])
    d = np.concatenate([np.ones(len(arrivals)), -np.asarray(consume_counts, dtype=np.float64)])
    # at equal times arrivals (+) come before consumption (-)
    order = np.lexsort((-d, t))
    t, d = t[order], d[order]
    q = np.cumsum(d)
    return np.concatenate([[0.0], t]), np.concatenate([[0.0], q])


def _measure_where(times: np.ndarray, values_mask: np.ndarray, end: float) -> float:
    """Total length of the segments [times[i], times[i+1]) (clipped to end) where values_mask[i] is True."""
    seg_end = np.minimum(np.append(times[1:], end), end)
    seg_start = np.minimum(times, end)
    return float(np.sum(np.maximum(seg_end - seg_start, 0.0)[values_mask]))


def sorting_metrics(arrivals: np.ndarray, mb_ready: np.ndarray, mb_start: np.ndarray, mb_busy_end: np.ndarray,
                    mb_groups: np.ndarray, minibatch: int, rollout_end: float, total_time: float) -> Dict[str, float]:
    """bubble/sorting and its diagnostics from the group arrivals and the trainer's busy intervals.

    bubble/sorting = time the trainer is idle while rollout is still active and the queue holds fewer than M
    finished groups, over the run time (docs/design.md#bubbles). Also: bubble/startup (wait for the first minibatch /
    run time), bubble/queue_cv (time-weighted CV of queue occupancy), bubble/arrival_gap_cv (CV of the gaps
    between minibatch ready times), bubble/queue_starved (share of rollout time the queue holds < M groups).
    """
    qt, qv = queue_series(arrivals, mb_start, mb_groups)
    bt = np.concatenate([np.asarray(mb_start, dtype=np.float64), np.asarray(mb_busy_end, dtype=np.float64)])
    bd = np.concatenate([np.ones(len(mb_start)), -np.ones(len(mb_busy_end))])
    order = np.lexsort((bd, bt))
    bt, bd = bt[order], bd[order]
    busy_level = np.cumsum(bd)
    times = np.unique(np.concatenate([qt, bt, [0.0]]))
    qi = np.searchsorted(qt, times, side="right") - 1
    q_at = qv[qi]
    bi = np.searchsorted(bt, times, side="right") - 1
    busy_at = np.where(bi >= 0, busy_level[np.maximum(bi, 0)], 0.0) > 0.5
    idle_starved = (~busy_at) & (q_at < minibatch)
    sorting = _measure_where(times, idle_starved, rollout_end)
    starved = _measure_where(times, q_at < minibatch, rollout_end)
    seg = np.maximum(np.minimum(np.append(times[1:], total_time), total_time) - np.minimum(times, total_time), 0.0)
    if seg.sum() > 0:
        mean_q = float(np.sum(seg * q_at) / seg.sum())
        var_q = float(np.sum(seg * (q_at - mean_q) ** 2) / seg.sum())
        queue_cv = math.sqrt(var_q) / mean_q if mean_q > 0 else 0.0
    else:
        queue_cv = 0.0
    ready = np.sort(np.asarray(mb_ready, dtype=np.float64))
    gaps = np.diff(ready)
    gap_cv = float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else 0.0
    T = total_time if total_time > 0 else 1.0
    return {"bubble/sorting": sorting / T,
            "bubble/startup": (float(np.min(mb_start)) if len(mb_start) else 0.0) / T,
            "bubble/queue_cv": queue_cv,
            "bubble/arrival_gap_cv": gap_cv,
            "bubble/queue_starved": starved / rollout_end if rollout_end > 0 else 0.0}
