"""The ASP offline planner, "BLT" (Balance - Laxity - Token curve), docs/design.md section 11.5.

Pipeline for one window: fluid group moments -> tail placement (LPT of the groups whose solo time exceeds
theta * R_LB, one per instance while possible) -> Karmarkar-Karp of the rest seeded with the tail loads ->
move/swap local search on the fluid instance time -> per-instance order by the laxity rule and the
token-weighted completion curve -> length-stratified minibatch tags -> choice of (theta, eps) by the mean
end-to-end time over K sampled length scenarios. The scenarios are simulated in the regime the plan will run
in (the problem's max_lag and work stealing), and the candidate set also holds the orders of the strongest
simple baselines (sorted_asc and verl_kk; lpt and sorted_desc are BLT's own LPT and deal balances with the
long_first rule), scored on the same scenarios (common random
numbers), so the selection never picks something worse than them on its own scenarios.
docs/scheduler.md gives the reasoning and complexity.
"""
from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindspeed_asp.fluid import GroupMoments, group_moments, rollout_lower_bound
from mindspeed_asp.scheduler import partition, scenarios
from mindspeed_asp.scheduler.tagging import stratified_minibatches
from mindspeed_asp.sim.pipeline import simulate_pipeline
from mindspeed_asp.sim.train_time import TrainerModel
from mindspeed_asp.types import Assignment, InstanceSpec, LengthEstimate, PlanningProblem

LPT_BALANCE = -1.0  # theta value meaning "LPT over all groups" instead of tails + KK
DEAL_BALANCE = -2.0  # theta value meaning "longest first, dealt round-robin" (equal counts, even tails)
BASELINE_THETA = -3.0  # theta value recorded when a baseline order (its own placement) won the selection
THETA_GRID = (0.5, 0.7, LPT_BALANCE, DEAL_BALANCE)
EPS_GRID = (0.0, 0.3)
RULES = ("curve", "long_first")  # "random" stays a valid rule; verl_kk (random order) is a candidate instead
DEFAULT_THETA = 0.5
DEFAULT_RULE = "curve"
DEFAULT_EPS = 0.2
SIM_SCENARIOS = 2  # event simulator: each scenario is one full simulation per candidate
SIM_SEQ_BUDGET = 3200  # small windows get more scenarios: up to this many simulated sequences per candidate
SIM_MAX_SCENARIOS = 6
SELECT_GROUPS = 200  # windows above this are scored on a subsample of this many groups
SELECT_MIN_INSTANCES = 4  # ... on at least this many instances (or all of them when fewer)
# Baseline orders scored besides BLT's own (BLT's LPT and deal balances with the long_first rule already are
# lpt and sorted_desc, plus local search; adding them again would break the 0.2 s budget of 1000 x 8).
BASELINE_ORDERS = ("sorted_asc", "verl_kk")


def effective_eps(eps_base: float, rho: float) -> float:
    """Laxity slack used for ordering: grows as rho (trainer work / rollout time) falls.

    rho << 1: the trainer is never the bottleneck, so the order should minimise the makespan (eps -> 1 is
    LPT long-first); rho >= 1: smooth arrivals matter more and eps stays near its base value.
    """
    rho = max(float(rho), 1e-3)
    return float(min(1.0, eps_base * max(1.0, 1.0 / rho)))


def place_tails(gm: GroupMoments, problem: PlanningProblem, theta: float) -> Tuple[np.ndarray, np.ndarray]:
    """Indices of predicted tail groups and their LPT instances.

    A group is a tail when its predicted group max, run at the loaded instance's mean step time
    t_step = R_LB / S (S = predicted decode steps per instance, total area / (m B)), would take more than
    theta * R_LB, i.e. gmax > theta * S: such a group alone fills a large share of an instance's horizon, so
    two of them on one instance, or one started late, set the makespan. LPT on their work spreads them,
    the first m on distinct instances.
    """
    m = problem.instances
    steps = float(gm.area.sum()) / (m * problem.spec.slots)
    tail = np.flatnonzero(gm.gmax > theta * steps) if steps > 0 else np.zeros(0, dtype=np.int64)
    if len(tail) == 0:
        return tail, np.zeros(0, dtype=np.int64)
    owner = partition.lpt_assign(gm.work[tail], m)
    return tail, owner


def balance(gm: GroupMoments, problem: PlanningProblem, theta: float) -> Tuple[np.ndarray, Dict[str, float]]:
    """Instance of every group: tails by LPT, the rest by KK seeded with the tail loads, then local search."""
    m = problem.instances
    G = len(gm.work)
    owner = np.full(G, -1, dtype=np.int64)
    if theta == DEAL_BALANCE:  # groups by predicted group max, longest first, dealt round-robin
        owner = np.empty(G, dtype=np.int64)
        owner[np.argsort(-gm.gmax, kind="stable")] = np.arange(G) % m
        return _improve(owner, gm, problem, {"n_tail": 0.0})
    if theta < 0:  # LPT_BALANCE: every group by LPT on its work (spreads long groups evenly by count)
        owner = partition.lpt_assign(gm.work, m)
        return _improve(owner, gm, problem, {"n_tail": 0.0})
    tail, tail_owner = place_tails(gm, problem, theta)
    owner[tail] = tail_owner
    base = np.bincount(tail_owner, weights=gm.work[tail], minlength=m) if len(tail) else None
    rest = np.flatnonzero(owner < 0)
    if len(rest):
        owner[rest] = partition.karmarkar_karp(gm.work[rest], m, base_loads=base)
    return _improve(owner, gm, problem, {"n_tail": float(len(tail))})


def _improve(owner: np.ndarray, gm: GroupMoments, problem: PlanningProblem, info: Dict[str, float]
             ) -> Tuple[np.ndarray, Dict[str, float]]:
    """Move/swap local search on the fluid instance time."""
    B = problem.spec.slots
    cost = problem.cost

    def part_time(members: np.ndarray) -> float:
        if len(members) == 0:
            return 0.0
        steps = max(gm.area[members].sum() / B, gm.gmax[members].max())
        return float(cost.a * steps + cost.b * gm.area[members].sum() + cost.c * gm.kv[members].sum()
                     + cost.p * gm.prefill[members].sum())

    owner, moves = partition.improve_by_moves(owner, part_time, gm.work, problem.instances)
    info = dict(info)
    info["local_moves"] = float(moves)
    return owner, info


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


ORDER_RULES = {"curve": 0.0, "random": 1.0, "long_first": 2.0,  # params["order_rule"] codes
               "sorted_desc": 3.0, "sorted_asc": 4.0, "verl_kk": 5.0, "lpt": 6.0}


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


def _selection_problem(problem: PlanningProblem, rng: np.random.Generator) -> PlanningProblem:
    """The window itself, or a random subsample of SELECT_GROUPS groups on proportionally fewer instances.

    The subsample keeps the number of minibatches per window and the queue depth of an instance (groups per
    instance over slots: how many waves of admissions an instance runs), so the ranking of (theta, order
    rule, eps) carries over while the search costs the same for any window size. It keeps up to
    SELECT_MIN_INSTANCES instances (a one-instance proxy cannot tell balances apart): when that raises the
    instance count, the slots shrink in proportion instead, but not below 4 groups in flight per instance
    (fewer instances are used then).
    """
    G = len(problem.prompts)
    if G <= SELECT_GROUPS:
        return problem
    rows = np.sort(rng.choice(G, SELECT_GROUPS, replace=False))
    frac = SELECT_GROUPS / G
    est = problem.estimate
    sub_est = LengthEstimate(median=est.median[rows], group_max=est.group_max[rows], sigma=est.sigma[rows],
                             p_trunc=est.p_trunc[rows], has_history=est.has_history[rows],
                             estimator=est.estimator, params=est.params,
                             samples=None if est.samples is None else est.samples[rows])
    m = problem.instances
    spec = problem.spec
    base = max(1, int(round(m * frac)))
    min_slots = min(spec.slots, 4 * problem.prompts.n)  # a proxy needs a few groups in flight per instance
    for m_sub in range(max(base, min(m, SELECT_MIN_INSTANCES)), base - 1, -1):
        B_sub = int(min(spec.slots, max(1, round(spec.slots * (SELECT_GROUPS / m_sub) / (G / m)))))
        if B_sub >= min_slots or m_sub == base:
            break
    if B_sub != spec.slots:  # the KV budget stays: fewer slots only make it looser
        spec = InstanceSpec(slots=B_sub, kv_budget=spec.kv_budget)
    return PlanningProblem(prompts=problem.prompts.subset(rows), estimate=sub_est,
                           instances=m_sub, spec=spec,
                           minibatch=max(1, int(round(problem.minibatch * frac))), cost=problem.cost,
                           max_new_tokens=problem.max_new_tokens, rho=problem.rho, seed=problem.seed,
                           max_lag=problem.max_lag, work_stealing=problem.work_stealing)


def scenario_count(problem: PlanningProblem) -> int:
    """Event-simulated scenarios per candidate: SIM_SCENARIOS, more for small windows (same cost budget)."""
    seqs = max(1, len(problem.prompts) * problem.prompts.n)
    return int(min(SIM_MAX_SCENARIOS, max(SIM_SCENARIOS, SIM_SEQ_BUDGET // seqs)))


def baseline_candidate(problem: PlanningProblem, rule: str, rng: np.random.Generator, name: str,
                       gm: Optional[GroupMoments] = None) -> Assignment:
    """A baseline's placement and order as an ASP candidate, with ASP's length-stratified minibatch tags."""
    from mindspeed_asp.scheduler import baselines

    gm = gm if gm is not None else group_moments(problem)
    orders = getattr(baselines, f"plan_{rule}")(problem, rng).orders
    tags = stratified_minibatches(gm.area, predicted_completion(orders, gm, problem), problem.minibatch)
    return Assignment(orders=orders, minibatch=tags, planner=name,
                      params={"theta": BASELINE_THETA, "order_rule": ORDER_RULES[rule], "eps_base": 0.0, "eps": 0.0,
                              "rho": float(problem.rho), "n_tail": 0.0, "local_moves": 0.0})


def _score(problem: PlanningProblem, cands: List[Assignment], rng: np.random.Generator,
           lengths: Optional[np.ndarray] = None) -> Tuple[List[Tuple[float, float, float]], float, int, np.ndarray]:
    """(mean e2e, p90 e2e, mean rollout) of every candidate over sampled length scenarios.

    Scored with the event simulator (the planner sits above it, docs/design.md section 3): streaming trainer
    with the problem's max_lag and work stealing (the regime the plan runs in), alpha set so that training the
    window takes rho times its predicted rollout bound; every candidate sees the same scenarios (common random
    numbers). Small windows get more scenarios (`scenario_count`).
    Returns the scores, the evaluator code (2 = simulator), the number of scenarios and the scenarios (pass
    them back to score more candidates on the same draws).
    """
    gm = group_moments(problem)
    r_hat = rollout_lower_bound(gm, problem.instances, problem.cost)
    train_total = float(problem.rho) * r_hat
    if lengths is None:
        lengths = scenarios.sample_scenarios(problem, scenario_count(problem), rng)
    plen = np.asarray(problem.prompts.prompt_lens, dtype=np.float64)
    tokens = float((lengths.sum(axis=2) + problem.prompts.n * plen[None, :]).sum(axis=1).mean())
    trainer = TrainerModel(alpha=train_total / max(tokens, 1e-12), overhead=0.0, minibatch=problem.minibatch)
    out = []
    for cand in cands:
        e2e, rollout = [], []
        for scen in lengths:
            res = simulate_pipeline(problem, cand, scen, mode="stream", max_lag=int(problem.max_lag),
                                    trainer=trainer, with_bounds=False,
                                    work_stealing=bool(problem.work_stealing))
            e2e.append(res.metrics["time/iteration"])
            rollout.append(res.metrics["time/rollout"])
        out.append((float(np.mean(e2e)), float(np.percentile(e2e, 90)), float(np.mean(rollout))))
    return out, 2.0, lengths.shape[0], lengths


def plan_asp(problem: PlanningProblem, rng: np.random.Generator, name: str = "asp",
             theta_grid: Optional[Sequence[float]] = None, eps_grid: Optional[Sequence[float]] = None,
             rules: Optional[Sequence[str]] = None) -> Assignment:
    """Plan one window with BLT.

    Candidates: every theta of the grid x every BLT order rule ("curve" with each eps of the grid, "random",
    "long_first") on the balanced assignment of that theta, plus the baseline orders of BASELINE_ORDERS
    (rules named after them). They are scored on the window, or on a random subsample of SELECT_GROUPS
    groups when the window is larger (`_selection_problem`), by simulating sampled length scenarios in the
    problem's regime (max_lag, work stealing); the winner's (theta, rule, eps) then plans the whole window.
    Grids of one value each skip the search.
    """
    gm = group_moments(problem)
    G = len(gm.work)
    thetas = tuple(theta_grid) if theta_grid is not None else THETA_GRID
    epss = tuple(eps_grid) if eps_grid is not None else EPS_GRID
    use = tuple(rules) if rules is not None else RULES + BASELINE_ORDERS
    unknown = [r for r in use if r not in ORDER_RULES]
    if unknown:
        raise ValueError(f"unknown order rule(s) {unknown}; choose from {', '.join(ORDER_RULES)}")
    blt = tuple(r for r in use if r not in BASELINE_ORDERS)
    base = tuple(r for r in use if r in BASELINE_ORDERS)
    n_cands = len(thetas) * (len(epss) * ("curve" in blt) + sum(r != "curve" for r in blt)) + len(base)
    if n_cands <= 1 or G <= problem.instances:
        choice = (thetas[0] if theta_grid is not None else DEFAULT_THETA,
                  use[0] if rules is not None else DEFAULT_RULE,
                  epss[0] if eps_grid is not None else DEFAULT_EPS)
        info_sel = {"selection": 0.0, "scenarios": 0.0}
    else:
        sel = _selection_problem(problem, rng)
        sgm = group_moments(sel)
        lengths = None
        balanced: Dict[float, Tuple[np.ndarray, Dict[str, float]]] = {}
        tails_seen: Dict[bytes, float] = {}
        if blt:
            for theta in thetas:  # thetas that select the same tail set give the same balance
                key = place_tails(sgm, sel, theta)[0].tobytes() if theta >= 0 else str(theta).encode()
                if key not in tails_seen:
                    tails_seen[key] = theta
                    balanced[theta] = balance(sgm, sel, theta)
        # Stage 1: the balances, each with the first BLT rule, and the baseline orders; stage 2: the other BLT
        # rules on the best balance. Every candidate is scored on the same scenarios.
        first_rule = "long_first" if "long_first" in blt else (blt[0] if blt else "")
        stage1 = [(theta, first_rule, epss[0] if first_rule == "curve" else 0.0) for theta in balanced]
        stage1 += [(BASELINE_THETA, r, 0.0) for r in base]
        cands, keys, scores = [], [], []
        how, k = 0.0, 0

        def make(t: float, r: str, e: float) -> Assignment:
            if r in BASELINE_ORDERS:
                return baseline_candidate(sel, r, rng, name, sgm)
            return build_candidate(sel, sgm, balanced[t][0], balanced[t][1], t, r, e, name, rng)

        def score(new_keys):
            nonlocal lengths, how, k
            new = [make(*key) for key in new_keys]
            sc, how, k, lengths = _score(sel, new, rng, lengths)
            cands.extend(new)
            keys.extend(new_keys)
            scores.extend(sc)

        score(stage1)
        blt_idx = [i for i, key in enumerate(keys) if key[1] not in BASELINE_ORDERS]
        if blt_idx:
            best_theta = keys[min(blt_idx, key=lambda i: scores[i][0])][0]
            stage2 = [(best_theta, r, e) for r in blt for e in (epss if r == "curve" else (0.0,))
                      if (best_theta, r, e) not in keys]
            if stage2:
                score(stage2)
        best = int(np.argmin([sc[0] for sc in scores]))
        choice = keys[best]
        info_sel = {"selection": how, "scenarios": float(k), "candidates": float(len(cands)),
                    "selection_groups": float(len(sel.prompts)), "pred_e2e_mean": scores[best][0],
                    "pred_e2e_p90": scores[best][1], "pred_rollout_mean": scores[best][2],
                    "scored_max_lag": float(problem.max_lag), "scored_work_stealing": float(problem.work_stealing)}
        if sel is problem:
            a = cands[best]
            a.params.update(info_sel)
            a.validate(G)
            return a
    theta, rule, eps_base = choice
    if rule in BASELINE_ORDERS:
        a = baseline_candidate(problem, rule, rng, name, gm)
    else:
        owner, info = balance(gm, problem, theta)
        a = build_candidate(problem, gm, owner, info, theta, rule, eps_base, name, rng)
    a.params.update(info_sel)
    a.validate(G)
    return a
