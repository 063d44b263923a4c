"""Sampled length scenarios and a fast fluid evaluation of a plan under them (BLT step 6).

Why a fluid evaluator of our own: choosing the planner's free parameters needs tens of plan evaluations per
window, and the speed target (10^5 groups in seconds) rules out an event simulation of every decode step.
The fluid model admits a group when the slot area before it has drained, finishes it with its longest sample,
converts steps to seconds with the instance's own step-cost sum, and feeds the streaming trainer recursion
of docs/design.md#arrival-smoothing (F_k = max(A_k, F_{k-1}) + tau_k). The event simulator in `mindspeed_asp.sim`
is the reference; this is the cheap proxy used inside the planner.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mindspeed_asp.core.problem import PlanningProblem


# Log-scale error of a predicted median when the estimate does not carry a measured one in `params["pred_log_error"]`
# (build.estimate_lengths measures it from the history's last two epochs): between the Alpaca trace's ~0.35
# (docs/estimation.md, "Measured figures") and drifting RL lengths (~0.55 on the synthetic workload); cold-start
# predictions are far looser.
PRED_LOG_ERROR_HISTORY = 0.5
PRED_LOG_ERROR_COLD = 0.8


# A group resamples its own history (the estimate's residual pool) when it has at least this many samples
# there; with fewer the pool says little about the shape and the log-normal with the shrunk sigma is used.
POOL_MIN_SAMPLES = 4


def sample_scenarios(problem: PlanningProblem, k: int, rng: np.random.Generator) -> np.ndarray:
    """K length scenarios [K, G, n] drawn from the estimate, clipped at max_new_tokens.

    Per group a log-normal error of the predicted median (PRED_LOG_ERROR_*, shared by its samples); per
    sample a residual drawn from the group's own drift-adjusted history by recency (`estimate.pool`, when it holds
    POOL_MIN_SAMPLES or more), else the log-normal within-group spread sigma. Resampling the history keeps
    bimodal lengths and the spike at the cap, which decide group maxima and KV pressure (docs/scheduler.md);
    truncated samples are kept at the cap as often as the estimate's drifted p_trunc says.
    An estimate that carries per-sample lengths (the oracle) gives that one scenario only."""
    est = problem.estimate
    n = problem.prompts.n
    cap = float(problem.max_new_tokens)
    if est.samples is not None:
        return np.minimum(np.asarray(est.samples, dtype=np.float64), cap)[None]
    G = len(est.median)
    med = np.maximum(np.asarray(est.median, dtype=np.float64), 1.0)
    sig = np.nan_to_num(np.asarray(est.sigma, dtype=np.float64), nan=0.0)
    has = np.asarray(est.has_history, dtype=bool)
    # The median itself is uncertain (prediction error, drift): a per-group log offset shared by its samples.
    tau_hist = float(est.params.get("pred_log_error", PRED_LOG_ERROR_HISTORY))
    tau = np.where(has, tau_hist, max(tau_hist, PRED_LOG_ERROR_COLD))
    z_center = rng.standard_normal((k, G, 1))
    noise = sig[None, :, None] * rng.standard_normal((k, G, n))
    pool = est.pool
    use = np.flatnonzero(pool.counts >= POOL_MIN_SAMPLES) if pool is not None else np.zeros(0, np.int64)
    if len(use):
        pick = pool.draw(use, rng.random((k, len(use), n)))
        resid = pool.resid[pick]
        # A truncated sample drawn again stays truncated with the odds that make the group's truncation
        # share the estimate's p_trunc (which applies the length drift to it); otherwise it keeps its
        # drift-shifted value.
        share = pool.capped_share()[use]
        keep = np.minimum(1.0, np.asarray(est.p_trunc, dtype=np.float64)[use] / np.maximum(share, 1e-12))
        capped = pool.capped[pick] & (rng.random(pick.shape) < keep[None, :, None])
        noise[:, use, :] = np.where(capped, np.inf, resid)
        # No extra shift of a resampled group's center: drawing n of the prompt's past samples already moves
        # its median as much as sampling does (the measured pred_log_error is mostly that noise), and the
        # back-tested center uncertainty is meaningless for bimodal prompts, whose median jumps between modes.
        tau[use] = 0.0
    shift = tau[None, :, None] * z_center
    return np.clip(np.rint(med[None, :, None] * np.exp(shift + noise)), 1.0, cap)


@dataclass
class ScenarioResult:
    """Per-scenario figures of one plan: rollout makespan R, end-to-end streaming time, trainer idle."""

    rollout: np.ndarray  # [K]
    e2e: np.ndarray  # [K]
    first_ready: np.ndarray  # [K]

    def objective(self) -> float:
        return float(self.e2e.mean())


def fluid_completions(problem: PlanningProblem, orders: Sequence[np.ndarray], lengths: np.ndarray):
    """Group completion times [K, G] (seconds) and instance busy times [K, m] under `lengths` [K, G, n].

    Vectorised over scenarios and instances: the queues are concatenated and every per-instance running sum
    is a global cumulative sum minus the value at the start of the instance's segment.
    """
    c = problem.cost
    B = problem.spec.slots
    K, G, n = lengths.shape
    m = len(orders)
    flat = np.concatenate([np.asarray(o, dtype=np.int64) for o in orders]) if m else np.zeros(0, np.int64)
    inst = np.repeat(np.arange(m), [len(o) for o in orders])
    seg_start = np.concatenate([[0], np.cumsum([len(o) for o in orders])])[:-1]
    counts = np.bincount(inst, minlength=m)
    area = lengths.sum(axis=2)[:, flat]  # [K, G] in queue order
    gmax = lengths.max(axis=2)[:, flat]
    plen = np.asarray(problem.prompts.prompt_lens, dtype=np.float64)[flat]
    kv = (plen[None, :, None] * lengths[:, flat] + 0.5 * lengths[:, flat] * (lengths[:, flat] - 1)).sum(axis=2)
    csum = np.cumsum(area, axis=1)
    before = csum - area  # area admitted before each group, globally
    base = np.where(counts > 0, before[:, np.minimum(seg_start, max(G - 1, 0))], 0.0) if G else np.zeros((K, m))
    cum = before - base[:, inst]
    tot_area = np.stack([np.bincount(inst, weights=area[k], minlength=m) for k in range(K)]) if G else \
        np.zeros((K, m))
    tot_kv = np.stack([np.bincount(inst, weights=kv[k], minlength=m) for k in range(K)]) if G else np.zeros((K, m))
    pre = np.bincount(inst, weights=plen, minlength=m) * n
    fill = B * tot_area / np.maximum(n * counts, 1)[None, :]  # B slots of mean-length sequences
    start = np.maximum(0.0, (cum - fill[:, inst]) / B)
    finish = start + gmax
    last = np.zeros((K, m))
    for k in range(K):
        np.maximum.at(last[k], inst, finish[k])
    steps = np.maximum(tot_area / B, last)
    busy = c.a * steps + c.b * tot_area + c.c * tot_kv + c.p * pre[None, :]
    busy = np.where(counts[None, :] > 0, busy, 0.0)
    rate = busy / np.maximum(steps, 1e-12)
    done = np.zeros((K, G))
    done[:, flat] = finish * rate[:, inst]
    return done, busy


def evaluate(problem: PlanningProblem, orders: Sequence[np.ndarray], lengths: np.ndarray,
             train_total: float) -> ScenarioResult:
    """Streaming end-to-end time of a plan under each scenario.

    The trainer needs `train_total` seconds in all, split over minibatches by their tokens, and cuts a
    minibatch as soon as M finished groups wait (the runtime's sample queue: plan minibatch tags only choose
    *which* ready groups go first, they never make the trainer wait), so minibatch k is ready at the
    (k*M)-th completion. End time: F_last = max_k (A_k + sum_{i>=k} tau_i).
    """
    done, busy = fluid_completions(problem, orders, lengths)
    K, G = done.shape
    M = max(1, problem.minibatch)
    n = problem.prompts.n
    plen = np.asarray(problem.prompts.prompt_lens, dtype=np.float64)
    tokens = lengths.sum(axis=2) + n * plen[None, :]
    alpha = train_total / max(float(tokens.mean(axis=0).sum()), 1e-12)
    order = np.argsort(done, axis=1, kind="stable")
    done_sorted = np.take_along_axis(done, order, axis=1)
    tok_sorted = np.take_along_axis(tokens, order, axis=1)
    nb = -(-G // M)
    last = np.minimum(np.arange(1, nb + 1) * M, G) - 1
    ready = done_sorted[:, last]  # [K, nb]
    cum = np.concatenate([np.zeros((K, 1)), np.cumsum(tok_sorted, axis=1)], axis=1)
    tau = alpha * (cum[:, last + 1] - cum[:, np.concatenate([[0], last[:-1] + 1])])
    tail = np.cumsum(tau[:, ::-1], axis=1)[:, ::-1]
    e2e = (ready + tail).max(axis=1) if nb else np.zeros(K)
    first = ready[:, 0] if nb else np.zeros(K)
    return ScenarioResult(rollout=busy.max(axis=1), e2e=e2e, first_ready=first)
