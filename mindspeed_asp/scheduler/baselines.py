"""Baseline planners of docs/design.md#baselines; they produce the same Assignment as ASP, so every comparison
runs through the same plan file, dispatcher and simulator.

Baselines leave minibatch tags at -1: their trainers take finished groups in arrival order.
"""
from __future__ import annotations

import heapq
from typing import List

import numpy as np

from mindspeed_asp.scheduler import partition
from mindspeed_asp.core.fluid import group_moments
from mindspeed_asp.core.problem import Assignment, PlanningProblem


def _untagged(orders: List[np.ndarray], G: int, name: str, shared: bool = False, **params: float) -> Assignment:
    a = Assignment(orders=[np.asarray(o, dtype=np.int64) for o in orders],
                   minibatch=np.full(G, -1, dtype=np.int64), planner=name, params=dict(params), shared=shared)
    a.validate(G)
    return a


def _contiguous(seq: np.ndarray, m: int) -> List[np.ndarray]:
    return [np.asarray(s, dtype=np.int64) for s in np.array_split(seq, m)]


def _deal(seq: np.ndarray, m: int) -> List[np.ndarray]:
    return [np.asarray(seq[j::m], dtype=np.int64) for j in range(m)]


def _pred_tokens(problem: PlanningProblem) -> np.ndarray:
    return group_moments(problem).area


def plan_stock(problem: PlanningProblem, rng: np.random.Generator) -> Assignment:
    """MindSpeed-RL default: instance j gets the j-th contiguous share of the window in dataset order."""
    G = len(problem.prompts)
    return _untagged(_contiguous(np.arange(G), problem.instances), G, "stock")


def plan_random(problem: PlanningProblem, rng: np.random.Generator) -> Assignment:
    """A random permutation cut into equal contiguous shares."""
    G = len(problem.prompts)
    return _untagged(_contiguous(rng.permutation(G), problem.instances), G, "random")


def plan_sorted_asc(problem: PlanningProblem, rng: np.random.Generator) -> Assignment:
    """Short-first: groups sorted by predicted tokens, dealt round-robin (each queue ascending)."""
    G = len(problem.prompts)
    seq = np.argsort(_pred_tokens(problem), kind="stable")
    return _untagged(_deal(seq, problem.instances), G, "sorted_asc")


def plan_sorted_desc(problem: PlanningProblem, rng: np.random.Generator) -> Assignment:
    """Long-first: groups sorted by predicted tokens descending, dealt round-robin."""
    G = len(problem.prompts)
    seq = np.argsort(-_pred_tokens(problem), kind="stable")
    return _untagged(_deal(seq, problem.instances), G, "sorted_desc")


def plan_round_robin(problem: PlanningProblem, rng: np.random.Generator) -> Assignment:
    """Dataset order dealt round-robin: group g to instance g mod m."""
    G = len(problem.prompts)
    return _untagged(_deal(np.arange(G), problem.instances), G, "round_robin")


def plan_least_loaded(problem: PlanningProblem, rng: np.random.Generator) -> Assignment:
    """OpenRLHF-like: in dataset order, each group goes to the instance with the fewest requests in flight.

    Offline the in-flight counts follow a list-scheduling replay with predicted group lengths: each instance
    holds max(1, B // n) groups at once, the start fills instances round-robin, then the next group goes to
    the instance whose running group is predicted to finish first.
    """
    G = len(problem.prompts)
    m = problem.instances
    gmax = group_moments(problem).gmax.tolist()
    cap = max(1, problem.spec.slots // problem.prompts.n)
    heap = [(0.0, s * m + j, j) for s in range(cap) for j in range(m)]
    heapq.heapify(heap)
    owner = np.empty(G, dtype=np.int64)
    tick = cap * m
    for g in range(G):
        t, _, j = heapq.heappop(heap)
        owner[g] = j
        heapq.heappush(heap, (t + gmax[g], tick, j))
        tick += 1
    orders = [np.flatnonzero(owner == j) for j in range(m)]
    return _untagged(orders, G, "least_loaded", group_slots=float(cap))


def plan_shared_fifo(problem: PlanningProblem, rng: np.random.Generator) -> Assignment:
    """The runtime's async mode as a plan: dataset order from one shared queue, least-loaded dispatch."""
    G = len(problem.prompts)
    return _untagged(_deal(np.arange(G), problem.instances), G, "shared_fifo", shared=True)


def plan_shared_desc(problem: PlanningProblem, rng: np.random.Generator) -> Assignment:
    """Online LPT: predicted-longest first from one shared queue, each to the least-loaded instance. Pinning
    nothing, it adapts to lengths that come out other than predicted and to KV preemptions slowing one
    instance, where a pinned plan can only rebalance by stealing."""
    G = len(problem.prompts)
    seq = np.argsort(-_pred_tokens(problem), kind="stable")
    return _untagged(_deal(seq, problem.instances), G, "shared_desc", shared=True)


def plan_verl_kk(problem: PlanningProblem, rng: np.random.Generator) -> Assignment:
    """verl-like: Karmarkar-Karp with equal counts on predicted tokens, random order inside each instance."""
    G = len(problem.prompts)
    m = problem.instances
    owner = partition.karmarkar_karp(_pred_tokens(problem), m, equal_size=True)
    orders = [rng.permutation(np.flatnonzero(owner == j)) for j in range(m)]
    return _untagged(orders, G, "verl_kk")


def plan_lpt(problem: PlanningProblem, rng: np.random.Generator) -> Assignment:
    """LPT on predicted work (cost model), each instance's queue long-first by predicted group max."""
    G = len(problem.prompts)
    m = problem.instances
    gm = group_moments(problem)
    owner = partition.lpt_assign(gm.work, m)
    orders = []
    for j in range(m):
        members = np.flatnonzero(owner == j)
        orders.append(members[np.argsort(-gm.gmax[members], kind="stable")])
    return _untagged(orders, G, "lpt")
