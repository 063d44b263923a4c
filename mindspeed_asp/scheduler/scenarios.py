"""Sampled length scenarios and a fast fluid evaluation of a plan under them (BLT step 6).

Why a fluid evaluator of our own: choosing the planner's free parameters needs tens of plan evaluations per
window, and the speed target (10^5 groups in seconds) rules out an event simulation of every decode step.
The fluid model admits a group when the slot area before it has drained, finishes it with its longest sample,
converts steps to seconds with the instance's own step-cost sum, and feeds the streaming trainer recursion
of scheduling_theory.md 5 (F_k = max(A_k, F_{k-1}) + tau_k). The event simulator in `mindspeed_asp.sim`
is the reference; this is the cheap proxy used inside the planner.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mindspeed_asp.scheduler.types import PlanningProblem


def sample_scenarios(problem: PlanningProblem, k: int, rng: np.random.Generator) -> np.ndarray:
    """K length scenarios [K, G, n] drawn from the estimate (lognormal around the median with sigma,
    clipped at max_new_tokens); an estimate that carries per-sample lengths (the oracle) gives that one
    scenario only."""
    est = problem.estimate
    n = problem.prompts.n
    cap = float(problem.max_new_tokens)
    if est.samples is not None:
        return np.minimum(np.asarray(est.samples, dtype=np.float64), cap)[None]
    med = np.maximum(np.asarray(est.median, dtype=np.float64), 1.0)
    sig = np.nan_to_num(np.asarray(est.sigma, dtype=np.float64), nan=0.0)
    z = rng.standard_normal((k, len(med), n))
    return np.clip(np.rint(med[None, :, None] * np.exp(sig[None, :, None] * z)), 1.0, cap)


@dataclass
class ScenarioResult:
    """Per-scenario figures of one plan: rollout makespan R, end-to-end streaming time, trainer idle."""

    rollout: np.ndarray  # [K]
    e2e: np.ndarray  # [K]
    first_ready: np.ndarray  # [K]

    def objective(self) -> float:
        return float(self.e2e.mean())


def fluid_completions(problem: PlanningProblem, orders: Sequence[np.ndarray], lengths: np.ndarray):
    """Group completion times [K, G] (seconds) and instance busy times [K, m] under `lengths` [K, G, n]."""
    c = problem.cost
    B = problem.spec.slots
    K, G, n = lengths.shape
    area = lengths.sum(axis=2)
    gmax = lengths.max(axis=2)
    plen = np.asarray(problem.prompts.prompt_lens, dtype=np.float64)
    kv = (plen[None, :, None] * lengths + 0.5 * lengths * (lengths - 1)).sum(axis=2)
    done = np.zeros((K, G))
    busy = np.zeros((K, len(orders)))
    for j, order in enumerate(orders):
        o = np.asarray(order, dtype=np.int64)
        if len(o) == 0:
            continue
        a_o = area[:, o]
        cum = np.cumsum(a_o, axis=1) - a_o
        fill = B * a_o.sum(axis=1, keepdims=True) / (n * len(o))  # B slots of mean-length sequences
        start = np.maximum(0.0, (cum - fill) / B)
        finish = start + gmax[:, o]
        steps = np.maximum(a_o.sum(axis=1) / B, finish.max(axis=1))
        t = c.a * steps + c.b * a_o.sum(axis=1) + c.c * kv[:, o].sum(axis=1) + c.p * n * plen[o].sum()
        busy[:, j] = t
        done[:, o] = finish * (t / steps)[:, None]
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
