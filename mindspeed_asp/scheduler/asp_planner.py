"""The ASP offline planner, "BLT" (Balance - Laxity - Token curve), scheduling_theory.md 8.1.

Pipeline for one window: fluid group moments -> tail placement (LPT of the groups whose solo time exceeds
theta * R_LB, one per instance while possible) -> Karmarkar-Karp of the rest seeded with the tail loads ->
move/swap local search on the fluid instance time -> per-instance order by the laxity rule and the
token-weighted completion curve -> length-stratified minibatch tags -> choice of (theta, eps) by the mean
end-to-end time over K sampled length scenarios. docs/scheduler.md gives the reasoning and complexity.
"""
from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindspeed_asp.scheduler import partition, scenarios
from mindspeed_asp.scheduler.fluid import GroupMoments, group_moments, instance_times, rollout_lower_bound
from mindspeed_asp.scheduler.tagging import stratified_minibatches
from mindspeed_asp.scheduler.types import Assignment, PlanningProblem

THETA_GRID = (0.35, 0.5, 0.7)
EPS_GRID = (0.0, 0.1, 0.2, 0.4)
DEFAULT_THETA = 0.5
DEFAULT_EPS = 0.1
SCENARIOS = 6
SELECT_MAX_SAMPLES = 40_000  # groups*n above which (theta, eps) keep their defaults (speed target)


def effective_eps(eps_base: float, rho: float) -> float:
    """Laxity slack used for ordering: grows as rho (trainer work / rollout time) falls.

    rho << 1: the trainer is never the bottleneck, so the order should minimise the makespan (eps -> 1 is
    LPT long-first); rho >= 1: smooth arrivals matter more and eps stays near its base value.
    """
    rho = max(float(rho), 1e-3)
    return float(min(1.0, eps_base * max(1.0, 1.0 / rho)))


def place_tails(gm: GroupMoments, problem: PlanningProblem, theta: float) -> Tuple[np.ndarray, np.ndarray]:
    """Indices of predicted tail groups and their LPT instances (by predicted solo time)."""
    m = problem.instances
    r_lb = rollout_lower_bound(gm, m, problem.cost)
    solo = problem.cost.solo_time(gm.gmax, gm.prompt_len)
    tail = np.flatnonzero(solo > theta * r_lb) if r_lb > 0 else np.zeros(0, dtype=np.int64)
    if len(tail) == 0:
        return tail, np.zeros(0, dtype=np.int64)
    # LPT on the tail's work: the first m tail groups land on distinct instances (all loads start at 0).
    owner = partition.lpt_assign(gm.work[tail], m)
    return tail, owner


def balance(gm: GroupMoments, problem: PlanningProblem, theta: float) -> Tuple[np.ndarray, Dict[str, float]]:
    """Instance of every group: tails by LPT, the rest by KK seeded with the tail loads, then local search."""
    m = problem.instances
    G = len(gm.work)
    owner = np.full(G, -1, dtype=np.int64)
    tail, tail_owner = place_tails(gm, problem, theta)
    owner[tail] = tail_owner
    base = np.bincount(tail_owner, weights=gm.work[tail], minlength=m) if len(tail) else None
    rest = np.flatnonzero(owner < 0)
    if len(rest):
        owner[rest] = partition.karmarkar_karp(gm.work[rest], m, base_loads=base)
    B = problem.spec.slots
    cost = problem.cost

    def part_time(members: np.ndarray) -> float:
        if len(members) == 0:
            return 0.0
        steps = max(gm.area[members].sum() / B, gm.gmax[members].max())
        return float(cost.a * steps + cost.b * gm.area[members].sum() + cost.c * gm.kv[members].sum()
                     + cost.p * gm.prefill[members].sum())

    owner, moves = partition.improve_by_moves(owner, part_time, gm.work, m)
    return owner, {"n_tail": float(len(tail)), "local_moves": float(moves)}


def order_instance(members: np.ndarray, gm: GroupMoments, slots: int, eps: float) -> Tuple[np.ndarray, np.ndarray]:
    """Admission order of one instance's groups and their predicted completion step.

    Fluid model in decode steps: the instance drains its total predicted area W at B slot-steps per step, so
    it ends near R = max(W/B, longest group). Completion slots are laid out along the token-weighted curve:
    the q-th completion is due at t_q = R * (area completed so far) / W, which makes finished tokens reach the
    trainer at a constant rate. Slot q takes the *longest* remaining group that can still be done by
    t_q + eps*R if started at once (laxity rule: a long group is placed at the first completion slot it can
    meet, so it starts early and the instance does not end with a lone tail); when none fits, the shortest.
    The admission order is then by latest start time t_q - gmax. eps = 0 keeps the curve exact; eps -> 1
    degenerates to long-first (LPT), which only pays off when the trainer is not the bottleneck (rho << 1).
    O(g log g) with a disjoint-set "largest available index" structure.
    """
    if len(members) == 0:
        return members.astype(np.int64), np.zeros(0)
    srt = members[np.argsort(gm.gmax[members], kind="stable")]
    g = gm.gmax[srt]
    a = gm.area[srt]
    W = float(a.sum())
    R = max(W / slots, float(g.max()))
    N = len(srt)
    parent = list(range(N + 1))  # node i+1 <-> item i; node 0 = "none"; removed item i points to node i

    def find(x: int) -> int:
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    gl, al = g.tolist(), a.tolist()
    removed = [False] * N
    shortest = 0
    cum = 0.0
    picked: List[int] = []
    due: List[float] = []
    for _ in range(N):
        while removed[shortest]:
            shortest += 1
        limit = R * cum / W + eps * R
        k = find(bisect.bisect_right(gl, limit)) - 1
        if k < 0:
            k = shortest
        removed[k] = True
        parent[k + 1] = k
        cum += al[k]
        picked.append(k)
        due.append(max(R * cum / W, gl[k]))
    idx = np.asarray(picked, dtype=np.int64)
    fin = np.asarray(due)
    start = fin - g[idx]
    o = np.lexsort((-g[idx], start))  # by latest start; among equal starts (e.g. "now") the longest first
    return srt[idx[o]], fin[o]


ORDER_RULES = {"curve": 0.0, "random": 1.0, "long_first": 2.0}  # params["order_rule"] codes


def fixed_choice(params: Dict[str, float]) -> Dict[str, object]:
    """plan_asp keyword arguments that repeat the (theta, order rule, eps) an earlier selection chose."""
    rule = {v: k for k, v in ORDER_RULES.items()}[float(params["order_rule"])]
    return {"theta_grid": (float(params["theta"]),), "eps_grid": (float(params["eps_base"]),), "rules": (rule,)}


def predicted_completion(orders: Sequence[np.ndarray], gm: GroupMoments, problem: PlanningProblem) -> np.ndarray:
    """Predicted completion time (seconds) of every group under the fluid model with predicted lengths."""
    G = len(gm.area)
    lengths = np.repeat(gm.mean_len[:, None], problem.prompts.n, axis=1)
    lengths[:, 0] = np.maximum(gm.gmax, gm.mean_len)  # the group's longest sample sets its end
    done, _ = scenarios.fluid_completions(problem, orders, lengths[None])
    return done[0] if G else np.zeros(0)


def order_all(owner: np.ndarray, gm: GroupMoments, problem: PlanningProblem, rule: str, eps: float,
              rng: np.random.Generator) -> List[np.ndarray]:
    """Per-instance queues of an instance assignment under one ordering rule."""
    m = problem.instances
    by_inst = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[by_inst], np.arange(m + 1))
    orders: List[np.ndarray] = []
    for j in range(m):
        members = by_inst[bounds[j]:bounds[j + 1]]
        if rule == "curve":
            o, _ = order_instance(members, gm, problem.spec.slots, eps)
        elif rule == "random":
            o = rng.permutation(members)
        else:
            o = members[np.argsort(-gm.gmax[members], kind="stable")]
        orders.append(o.astype(np.int64))
    return orders


def build_candidate(problem: PlanningProblem, gm: GroupMoments, owner: np.ndarray, info: Dict[str, float],
                    theta: float, rule: str, eps_base: float, name: str, rng: np.random.Generator) -> Assignment:
    eps = effective_eps(eps_base, problem.rho)
    orders = order_all(owner, gm, problem, rule, eps, rng)
    tags = stratified_minibatches(gm.area, predicted_completion(orders, gm, problem), problem.minibatch)
    params = {"theta": theta, "order_rule": ORDER_RULES[rule], "eps_base": eps_base, "eps": eps,
              "rho": float(problem.rho)}
    params.update(info)
    return Assignment(orders=orders, minibatch=tags, planner=name, params=params)


def plan_asp(problem: PlanningProblem, rng: np.random.Generator, name: str = "asp",
             theta_grid: Optional[Sequence[float]] = None, eps_grid: Optional[Sequence[float]] = None,
             scenarios_k: int = SCENARIOS, rules: Optional[Sequence[str]] = None) -> Assignment:
    """Plan one window with BLT.

    Candidates: every (theta, eps) of the grid with the laxity/curve order, plus the two reference orders
    (random, long-first) on the same balanced assignment; the winner has the least mean end-to-end time
    over `scenarios_k` length scenarios. Windows above SELECT_MAX_SAMPLES samples keep the defaults. Giving
    `eps_grid` restricts the search to the curve order with those eps values; `rules` names the order rules
    to try ("curve", "random", "long_first"; eps applies to "curve" only).
    """
    gm = group_moments(problem)
    G = len(gm.work)
    n = problem.prompts.n
    select = G * n <= SELECT_MAX_SAMPLES and G > problem.instances
    thetas = tuple(theta_grid) if theta_grid is not None else (THETA_GRID if select else (DEFAULT_THETA,))
    epss = tuple(eps_grid) if eps_grid is not None else (EPS_GRID if select else (DEFAULT_EPS,))
    balanced: Dict[bytes, Tuple[np.ndarray, Dict[str, float]]] = {}
    candidates: List[Assignment] = []
    for theta in thetas:
        tail, _ = place_tails(gm, problem, theta)
        key = tail.tobytes()
        if key in balanced:  # thetas that select the same tail set give the same balance
            continue
        balanced[key] = balance(gm, problem, theta)
        owner, info = balanced[key]
        use = tuple(rules) if rules is not None else (("curve", "random", "long_first") if select and
                                                      eps_grid is None else ("curve",))
        for rule in use:
            for eps_base in (epss if rule == "curve" else (0.0,)):
                candidates.append(build_candidate(problem, gm, owner, info, theta, rule, eps_base, name, rng))
    if len(candidates) == 1:
        best = candidates[0]
        best.params["scenarios"] = 0.0  # defaults kept: no selection on this window
    else:
        lengths = scenarios.sample_scenarios(problem, scenarios_k, rng)
        r_hat = rollout_lower_bound(gm, problem.instances, problem.cost)
        train_total = float(problem.rho) * r_hat
        scores = []
        for cand in candidates:
            res = scenarios.evaluate(problem, cand.orders, lengths, train_total)
            scores.append((res.objective(), float(np.percentile(res.e2e, 90)), float(res.rollout.mean())))
        k = int(np.argmin([sc[0] for sc in scores]))
        best = candidates[k]
        best.params.update({"scenarios": float(lengths.shape[0]), "candidates": float(len(candidates)),
                            "pred_e2e_mean": scores[k][0], "pred_e2e_p90": scores[k][1],
                            "pred_rollout_mean": scores[k][2]})
    best.validate(G)
    return best
