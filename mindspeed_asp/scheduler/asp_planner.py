"""The ASP offline planner, "BLT" (Balance - Laxity - Token curve), docs/design.md#planning.

Pipeline for one window: fluid group moments -> tail placement (LPT of the groups whose solo time exceeds
theta * R_LB, one per instance while possible) or isolation of dominant groups (a group whose solo time is a
large share of an instance's horizon gets an instance of its own, filled only as far as its solo time leaves
room) -> Karmarkar-Karp of the rest seeded with the tail loads -> move/swap local search on the fluid instance
time -> per-instance order by the laxity rule and the token-weighted completion curve -> length-stratified
minibatch tags -> choice among the candidates by the mean end-to-end time over sampled length scenarios.
The candidates hold every simple baseline's own plan (sorted_desc, lpt, verl_kk, round_robin = fifo,
sorted_asc, least_loaded) and two plans that pin nothing (one shared queue, least-loaded dispatch, in dataset
order = the async mode, or longest first), so the selection never picks something worse than them on its own
scenarios.
Candidates are event-simulated in the regime the plan will run in (the problem's max_lag, work stealing,
rho, KV budget) on the whole window when the simulated-sequence budget allows, else on a stratified
subsample with slots and KV budget in proportion, whose best few are then re-scored on the whole window
when that is affordable.
docs/scheduler.md gives the reasoning and complexity.
"""
from __future__ import annotations

import bisect
from dataclasses import replace
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindspeed_asp.core.fluid import GroupMoments, group_moments
from mindspeed_asp.scheduler import partition, scenarios
from mindspeed_asp.scheduler.tagging import stratified_minibatches
from mindspeed_asp.sim.bounds import rollout_lower_bound as scenario_lower_bound
from mindspeed_asp.sim.pipeline import simulate_pipeline
from mindspeed_asp.sim.train_time import TrainerModel
from mindspeed_asp.core.problem import Assignment, InstanceSpec, PlanningProblem

LPT_BALANCE = -1.0  # theta value meaning "LPT over all groups" instead of tails + KK
DEAL_BALANCE = -2.0  # theta value meaning "longest first, dealt round-robin" (equal counts, even tails)
BASELINE_THETA = -3.0  # theta value recorded when a baseline order (its own placement) won the selection
ISOLATE_BALANCE = -4.0  # theta value meaning "dominant groups each on an instance of their own" (isolate)
BASELINE_OWN_THETA = -5.0  # theta value recorded when a baseline's own plan (its order, untagged) won
THETA_GRID = (0.5, 0.7, LPT_BALANCE, DEAL_BALANCE, ISOLATE_BALANCE)
ISOLATE_SHARE = 0.5  # a group is dominant when its solo time exceeds this share of the mean instance work
EPS_GRID = (0.0, 0.3)
RULES = ("curve", "long_first")  # "random" stays a valid rule; verl_kk (random order) is a candidate instead
DEFAULT_THETA = 0.5
DEFAULT_RULE = "curve"
DEFAULT_EPS = 0.2
SIM_SCENARIOS = 2  # event simulator: each scenario is one full simulation per candidate
SIM_SEQ_BUDGET = 3200  # small windows get more scenarios: up to this many simulated sequences per candidate
SIM_MAX_SCENARIOS = 6
SELECT_GROUPS = 200  # windows over the full-scoring budget are scored on a subsample of this many groups
SELECT_MIN_INSTANCES = 4  # ... on at least this many instances (or all of them when fewer)
# Event-simulated sequences one selection may spend on the whole window (the simulator costs about 10 us per
# simulated sequence on one core, docs/scheduler.md section 2): every candidate x scenario on the whole window
# when it fits, else the subsample, then the FULL_TOP best of the subsample (and the baselines' own plans
# when they fit too) on the whole window.
SIM_SEQ_FULL = 200_000
FULL_TOP = 3
# The best REFINE_TOP candidates get REFINE_SCENARIOS more scenarios before the final pick: with 2 scenarios
# the minimum over ~13 candidates is often a lucky draw (a long-CoT window lost 2.7% that way; with 6 it
# picked the truly best), and only the front runners need the extra precision.
REFINE_TOP = 4
REFINE_SCENARIOS = 4
# Every simple baseline's own plan is a candidate (placement, order, no tags): with exact lengths and the
# whole window scored, ASP is then never behind any of them in the regime it scores.
# shared_fifo and shared_desc pin nothing: the groups wait in one queue (dataset order, i.e. the runtime's async
# mode; predicted-longest first, i.e. online LPT) and the least-loaded instance takes the next, so the selection
# can also choose not to pin groups where adapting at run time wins (weak predictions, KV preemptions).
BASELINE_ORDERS = ("sorted_desc", "lpt", "verl_kk", "round_robin", "sorted_asc", "least_loaded", "shared_fifo",
                   "shared_desc")


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
    if theta == ISOLATE_BALANCE:
        return isolate_balance(gm, problem)
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


def dominant_groups(gm: GroupMoments, problem: PlanningProblem) -> np.ndarray:
    """Groups whose solo time (a * longest sample + their b, c, p terms) exceeds ISOLATE_SHARE of the mean
    instance work, longest first, at most one per instance (the m with the longest solo time).

    Why at most m: isolation means an instance of its own. With more candidates (estimates spread the
    predicted tail over dozens of groups), several would share an instance, and every instance would run an
    isolated group and stop stealing (`policy.may_steal`); the rest are placed as ordinary groups. Measured on
    the synthetic tiny_decode kind with exact lengths (8 x 64, seeds 0-5, rollout only): 14.1% above R_LB
    without the cap, 6.0% with it.
    """
    c = problem.cost
    m = problem.instances
    fixed = c.b * gm.area + c.c * gm.kv + c.p * gm.prefill
    solo = c.a * gm.gmax + fixed
    dom = np.flatnonzero(solo > ISOLATE_SHARE * float(gm.work.sum()) / m)
    return dom[np.argsort(-solo[dom], kind="stable")][:m]


def isolate_balance(gm: GroupMoments, problem: PlanningProblem) -> Tuple[np.ndarray, Dict[str, float]]:
    """Dominant groups by LPT on their solo time (the first m on instances of their own), the rest by LPT on
    work seeded with those loads.

    Why: when the longest group's solo time sets the makespan (tiny decodes with one long outlier), its
    instance pays the step overhead for that many steps whatever else it runs, so it should take only what
    fits beside it; the tail placement (theta >= 0) loads it with the group's work, far below its solo time,
    and then fills it to the mean. The local search then moves work onto it while that lowers the maximum.
    """
    m = problem.instances
    c = problem.cost
    dom = dominant_groups(gm, problem)
    owner = np.full(len(gm.work), -1, dtype=np.int64)
    solo = c.a * gm.gmax[dom] + c.b * gm.area[dom] + c.c * gm.kv[dom] + c.p * gm.prefill[dom]
    owner[dom] = partition.lpt_assign(solo, m)
    base = np.bincount(owner[dom], weights=solo, minlength=m)
    rest = np.flatnonzero(owner < 0)
    if len(rest):
        owner[rest] = partition.lpt_assign(gm.work[rest], m, base_loads=base)
    return _improve(owner, gm, problem, {"n_tail": float(len(dom))})


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
               "sorted_desc": 3.0, "sorted_asc": 4.0, "verl_kk": 5.0, "lpt": 6.0, "round_robin": 7.0,
               "least_loaded": 8.0, "shared_fifo": 9.0, "shared_desc": 10.0}
SCOPES = {"none": -1.0, "subsample": 0.0, "full": 1.0, "subsample+full_top": 2.0}  # params["selection_scope"]


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
    # an isolation balance keeps its dominant groups' instances free of stolen work (policy.may_steal)
    isolated = dominant_groups(gm, problem) if theta == ISOLATE_BALANCE else np.zeros(0, dtype=np.int64)
    return Assignment(orders=orders, minibatch=tags, planner=name, params=params, isolated=isolated)


def _selection_rows(gm: GroupMoments, k: int, rng: np.random.Generator) -> np.ndarray:
    """k groups stratified by predicted work: one random group from each of k equal strata of the work order,
    the heaviest group always in (the tail the makespan hangs on is never left out of the proxy)."""
    G = len(gm.work)
    order = np.argsort(gm.work, kind="stable")
    edges = np.linspace(0, G, k + 1).astype(np.int64)
    picks = edges[:-1] + (rng.random(k) * np.diff(edges)).astype(np.int64)
    picks[-1] = G - 1
    return np.sort(order[picks])


def _selection_problem(problem: PlanningProblem, rng: np.random.Generator,
                       gm: Optional[GroupMoments] = None) -> PlanningProblem:
    """The window itself, or a stratified subsample of SELECT_GROUPS groups on proportionally fewer instances.

    The subsample keeps the number of minibatches per window and the queue depth of an instance (groups per
    instance over slots: how many waves of admissions an instance runs), so the ranking of the candidates
    carries over while the search costs the same for any window size. It keeps up to SELECT_MIN_INSTANCES
    instances (a one-instance proxy cannot tell balances apart): when that raises the instance count, the
    slots shrink in proportion instead, but not below 4 groups in flight per instance (fewer instances are
    used then). The KV budget shrinks with the slots (KV tokens per slot stay), so the proxy meets the KV
    pressure the engine will meet; it never goes below one sequence's prompt + cap (the engine's minimum).
    """
    G = len(problem.prompts)
    if G <= SELECT_GROUPS:
        return problem
    gm = gm if gm is not None else group_moments(problem)
    rows = _selection_rows(gm, SELECT_GROUPS, rng)
    frac = SELECT_GROUPS / G
    est = problem.estimate
    sub_est = est.subset(rows)
    m = problem.instances
    spec = problem.spec
    base = max(1, int(round(m * frac)))
    min_slots = min(spec.slots, 4 * problem.prompts.n)  # a proxy needs a few groups in flight per instance
    for m_sub in range(max(base, min(m, SELECT_MIN_INSTANCES)), base - 1, -1):
        B_sub = int(min(spec.slots, max(1, round(spec.slots * (SELECT_GROUPS / m_sub) / (G / m)))))
        if B_sub >= min_slots or m_sub == base:
            break
    prompts = problem.prompts.subset(rows)
    if B_sub != spec.slots:
        kv = spec.kv_budget
        if kv is not None:
            floor = int(np.max(prompts.prompt_lens)) + int(problem.max_new_tokens) + 1
            kv = max(int(round(kv * B_sub / spec.slots)), min(floor, int(kv)))
        spec = InstanceSpec(slots=B_sub, kv_budget=kv)
    return PlanningProblem(prompts=prompts, estimate=sub_est, instances=m_sub, spec=spec,
                           minibatch=max(1, int(round(problem.minibatch * frac))), cost=problem.cost,
                           max_new_tokens=problem.max_new_tokens, rho=problem.rho, seed=problem.seed,
                           max_lag=problem.max_lag, work_stealing=problem.work_stealing)


def scenario_count(problem: PlanningProblem) -> int:
    """Event-simulated scenarios per candidate: SIM_SCENARIOS, more for small windows (same cost budget);
    one for an estimate that carries the exact lengths (the oracle)."""
    if problem.estimate.samples is not None:
        return 1
    seqs = max(1, len(problem.prompts) * problem.prompts.n)
    return int(min(SIM_MAX_SCENARIOS, max(SIM_SCENARIOS, SIM_SEQ_BUDGET // seqs)))


def baseline_candidate(problem: PlanningProblem, rule: str, rng: np.random.Generator, name: str,
                       gm: Optional[GroupMoments] = None, tagged: bool = False) -> Assignment:
    """A baseline's own plan as an ASP candidate: its placement and order, untagged like the baseline (so it
    simulates exactly as the baseline does), or with ASP's length-stratified minibatch tags (`tagged`).

    A random baseline (verl_kk) draws from a generator seeded with the problem's seed, as a comparison that
    gives every planner `np.random.default_rng(seed)` does, so the candidate is that very plan.
    """
    from mindspeed_asp.scheduler import baselines

    base = getattr(baselines, f"plan_{rule}")(problem, np.random.default_rng(problem.seed))
    orders = base.orders
    tags = base.minibatch
    if tagged:
        gm = gm if gm is not None else group_moments(problem)
        tags = stratified_minibatches(gm.area, predicted_completion(orders, gm, problem), problem.minibatch)
    return Assignment(orders=orders, minibatch=tags, planner=name, shared=base.shared,
                      params={"theta": BASELINE_THETA if tagged else BASELINE_OWN_THETA,
                              "order_rule": ORDER_RULES[rule], "eps_base": 0.0, "eps": 0.0,
                              "rho": float(problem.rho), "n_tail": 0.0, "local_moves": 0.0})


def _scoring_spec(problem: PlanningProblem, lengths: np.ndarray) -> PlanningProblem:
    """The problem, with its KV budget raised to the engine's minimum (one prompt + the longest sampled
    length) when a scenario drew a sequence that could never run under it."""
    kv = problem.spec.kv_budget
    if kv is None or not len(problem.prompts):
        return problem
    worst = int((np.asarray(problem.prompts.prompt_lens)[None, :, None] + lengths).max()) + 1
    if worst <= kv:
        return problem
    return replace(problem, spec=InstanceSpec(slots=problem.spec.slots, kv_budget=worst))


def _score(problem: PlanningProblem, cands: List[Assignment], rng: np.random.Generator,
           lengths: Optional[np.ndarray] = None,
           train_orders: Optional[List[np.ndarray]] = None
           ) -> Tuple[List[Tuple[float, float, float, float]], float, int, np.ndarray]:
    """(mean e2e, p90 e2e, mean rollout, mean KV preemptions) of every candidate over sampled scenarios.

    Scored with the event simulator (the planner sits above it, docs/design.md#layering) at the problem's
    size: its slots and KV budget (preemptions cost recompute time there, as in the engine), streaming
    trainer with the problem's max_lag and work stealing (the regime the plan runs in), alpha set so that
    training the window takes rho times the mean rollout bound R_LB of the scenarios (as `trainer_for_rho`
    does with the true lengths); every candidate sees the same scenarios (common random numbers). Small windows get more
    scenarios (`scenario_count`); an oracle estimate gives its one exact scenario.
    Returns the scores, the evaluator code (2 = simulator), the number of scenarios and the scenarios (pass
    them back to score more candidates on the same draws). `train_orders`, when given, receives each
    candidate's training order (groups in update order) in the first scenario.
    """
    if lengths is None:
        lengths = scenarios.sample_scenarios(problem, scenario_count(problem), rng)
    sim_problem = _scoring_spec(problem, lengths)
    plen = np.asarray(problem.prompts.prompt_lens, dtype=np.float64)
    # rho is trainer time over R_LB of the lengths actually generated (the runtime's RhoMeter, the
    # benchmarks' trainer_for_rho), so the scored trainer takes rho x the scenarios' own mean R_LB, not the
    # bound of the predicted group-max quantiles (an upper quantile of every group's max overstates it)
    r_hat = float(np.mean([scenario_lower_bound(scen, plen, problem.instances, sim_problem.spec,
                                                problem.cost)["rollout/R_LB"] for scen in lengths]))
    train_total = float(problem.rho) * r_hat
    tokens = float((lengths.sum(axis=2) + problem.prompts.n * plen[None, :]).sum(axis=1).mean())
    trainer = TrainerModel(alpha=train_total / max(tokens, 1e-12), overhead=0.0, minibatch=problem.minibatch)
    out = []
    for cand in cands:
        e2e, rollout, pre = [], [], []
        for scen in lengths:
            res = simulate_pipeline(sim_problem, cand, scen, mode="stream", max_lag=int(problem.max_lag),
                                    trainer=trainer, with_bounds=False,
                                    work_stealing=bool(problem.work_stealing))
            e2e.append(res.metrics["time/iteration"])
            rollout.append(res.metrics["time/rollout"])
            pre.append(res.metrics["rollout/preemptions"])
            if train_orders is not None and len(e2e) == 1:
                train_orders.append(res.mb_group_ids)
        out.append((float(np.mean(e2e)), float(np.percentile(e2e, 90)), float(np.mean(rollout)),
                    float(np.mean(pre))))
    return out, 2.0, lengths.shape[0], lengths


Key = Tuple[float, str, float]  # (theta, order rule, eps base) of one candidate


class _Search:
    """The candidates of one problem (the window or its proxy), built on demand and scored on shared
    scenarios."""

    def __init__(self, problem: PlanningProblem, name: str, rng: np.random.Generator,
                 blt_thetas: Sequence[float]) -> None:
        self.problem, self.name, self.rng = problem, name, rng
        self.gm = group_moments(problem)
        self.balanced: Dict[float, Tuple[np.ndarray, Dict[str, float]]] = {}
        seen: Dict[bytes, float] = {}
        for theta in blt_thetas:  # thetas that select the same tail set give the same balance
            if theta == ISOLATE_BALANCE:
                dom = dominant_groups(self.gm, problem)
                if len(dom) == 0:
                    continue  # nothing to isolate: the balance would be LPT's
                key = b"iso" + dom.tobytes()
            elif theta >= 0:
                key = place_tails(self.gm, problem, theta)[0].tobytes()
            else:
                key = str(theta).encode()
            if key not in seen:
                seen[key] = theta
                self.balanced[theta] = balance(self.gm, problem, theta)
        self.keys: List[Key] = []
        self.cands: List[Assignment] = []
        self.scores: List[Tuple[float, float, float, float]] = []
        self.lengths: Optional[np.ndarray] = None
        self.train_orders: List[np.ndarray] = []
        self.how, self.k = 0.0, 0

    def make(self, key: Key) -> Assignment:
        t, r, e = key
        if r in BASELINE_ORDERS:
            return baseline_candidate(self.problem, r, self.rng, self.name, self.gm, tagged=t == BASELINE_THETA)
        if t not in self.balanced:
            self.balanced[t] = balance(self.gm, self.problem, t)
        return build_candidate(self.problem, self.gm, self.balanced[t][0], self.balanced[t][1], t, r, e,
                               self.name, self.rng)

    def score(self, keys: Sequence[Key]) -> None:
        new_keys = [k for k in keys if k not in self.keys]
        if not new_keys:
            return
        new = [self.make(k) for k in new_keys]
        sc, self.how, self.k, self.lengths = _score(self.problem, new, self.rng, self.lengths,
                                                    train_orders=self.train_orders)
        self.cands.extend(new)
        self.keys.extend(new_keys)
        self.scores.extend(sc)

    def ranked(self) -> List[int]:
        return sorted(range(len(self.keys)), key=lambda i: self.scores[i][0])

    def refine(self, top: int, extra: int) -> None:
        """Score the `top` best candidates on `extra` fresh scenarios (shared among them) and replace their
        scores by the mean over all their scenarios; the others keep theirs (they are out of the race)."""
        if extra <= 0 or self.problem.estimate.samples is not None or self.lengths is None:
            return
        idx = self.ranked()[:top]
        fresh = scenarios.sample_scenarios(self.problem, extra, self.rng)
        sc, _, _, _ = _score(self.problem, [self.cands[i] for i in idx], self.rng, fresh)
        k0 = self.lengths.shape[0]
        for i, new in zip(idx, sc):
            old = self.scores[i]
            w0, w1 = k0 / (k0 + extra), extra / (k0 + extra)
            self.scores[i] = (w0 * old[0] + w1 * new[0], max(old[1], new[1]), w0 * old[2] + w1 * new[2],
                              w0 * old[3] + w1 * new[3])
        self.k = k0 + extra

    def winner(self, i: int) -> Assignment:
        """Candidate i as the plan: a baseline's own (untagged) plan gets tags that number its groups in the
        training order its first scenario simulated (update k trains the groups tagged k), so the plan keeps
        ASP's tagged format and, with exact lengths, trains exactly as the untagged baseline it was scored as."""
        a = self.cands[i]
        if a.params.get("theta") == BASELINE_OWN_THETA:
            order = np.asarray(self.train_orders[i], dtype=np.int64)
            G = len(self.problem.prompts)
            tags = np.full(G, -1, dtype=np.int64)
            tags[order] = np.arange(len(order)) // self.problem.minibatch
            tags[tags < 0] = (len(order) + self.problem.minibatch - 1) // self.problem.minibatch
            a.minibatch = tags
            a.params["tags_from_scored_order"] = 1.0
        return a

    def info(self, i: int) -> Dict[str, float]:
        sc = self.scores[i]
        return {"selection": self.how, "scenarios": float(self.k), "candidates": float(len(self.cands)),
                "selection_groups": float(len(self.problem.prompts)), "pred_e2e_mean": sc[0],
                "pred_e2e_p90": sc[1], "pred_rollout_mean": sc[2], "pred_preemptions": sc[3],
                "scored_max_lag": float(self.problem.max_lag),
                "scored_work_stealing": float(self.problem.work_stealing)}


def _n_candidates(thetas: Sequence[float], epss: Sequence[float], blt: Sequence[str], base: Sequence[str]) -> int:
    """Candidates one selection scores at most: stage 1 (balances x first rule, baselines) + stage 2."""
    stage2 = sum(len(epss) if r == "curve" else 1 for r in blt) - 1 if blt else 0
    return len(thetas) * bool(blt) + len(base) + max(stage2, 0)


def plan_asp(problem: PlanningProblem, rng: np.random.Generator, name: str = "asp",
             theta_grid: Optional[Sequence[float]] = None, eps_grid: Optional[Sequence[float]] = None,
             rules: Optional[Sequence[str]] = None) -> Assignment:
    """Plan one window with BLT.

    Candidates: the balances of the theta grid (tails + KK, LPT, deal, isolation of dominant groups), each
    with the first BLT rule, and every baseline's own plan (BASELINE_ORDERS); then the other BLT order rules
    ("curve" with each eps of the grid, "long_first") on the best balance. All are event-simulated on the
    same sampled length scenarios in the problem's regime (max_lag, work stealing, rho, KV budget;
    `_score`): on the whole window when candidates x scenarios x sequences <= SIM_SEQ_FULL (scope "full"),
    else on a stratified subsample (`_selection_problem`), whose FULL_TOP best, with the baselines' own plans
    when they fit too, are rebuilt and re-scored on the whole window when that fits the budget (scope
    "subsample+full_top"); otherwise the subsample's winner plans the window (scope "subsample").
    params record the scope (`selection_scope`, SCOPES) and the winner's predicted e2e time, rollout time
    and preemptions on it (`pred_*`), so a caller can set them against a simulation of the plan.
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
    n_cands = _n_candidates(thetas, epss, blt, base)
    if n_cands <= 1 or G <= problem.instances:
        theta = thetas[0] if theta_grid is not None else DEFAULT_THETA
        rule = use[0] if rules is not None else DEFAULT_RULE
        eps_base = epss[0] if eps_grid is not None else DEFAULT_EPS
        if rule in BASELINE_ORDERS and theta == BASELINE_OWN_THETA:
            # a baseline's own plan chosen before (a reused choice): tagged in the training order of one
            # scored scenario, as `_Search.winner` tags it when it wins a selection
            one = _Search(problem, name, rng, ())
            one.gm = gm
            one.score([(theta, rule, 0.0)])
            a = one.winner(0)
        elif rule in BASELINE_ORDERS:
            a = baseline_candidate(problem, rule, rng, name, gm, tagged=True)
        else:
            owner, info = balance(gm, problem, theta)
            a = build_candidate(problem, gm, owner, info, theta, rule, eps_base, name, rng)
        a.params.update({"selection": 0.0, "scenarios": 0.0, "selection_scope": SCOPES["none"]})
        a.validate(G)
        return a
    seqs = G * problem.prompts.n
    refine = 0 if problem.estimate.samples is not None else REFINE_SCENARIOS
    full = seqs * (scenario_count(problem) * n_cands + REFINE_TOP * refine) <= SIM_SEQ_FULL
    sel = problem if full else _selection_problem(problem, rng, gm)
    search = _Search(sel, name, rng, thetas if blt else ())
    # Stage 1: the balances, each with the first BLT rule, and the baselines' own plans; stage 2: the other
    # BLT rules on the best balance. Every candidate is scored on the same scenarios.
    first_rule = "long_first" if "long_first" in blt else (blt[0] if blt else "")
    stage1: List[Key] = [(t, first_rule, epss[0] if first_rule == "curve" else 0.0) for t in search.balanced]
    stage1 += [(BASELINE_OWN_THETA, r, 0.0) for r in base]
    search.score(stage1)
    blt_idx = [i for i, key in enumerate(search.keys) if key[1] not in BASELINE_ORDERS]
    if blt_idx:
        best_theta = search.keys[min(blt_idx, key=lambda i: search.scores[i][0])][0]
        search.score([(best_theta, r, e) for r in blt for e in (epss if r == "curve" else (0.0,))])
    search.refine(REFINE_TOP, refine)
    ranked = search.ranked()
    if sel is problem:
        a = search.winner(ranked[0])
        a.params.update(search.info(ranked[0]))
        a.params["selection_scope"] = SCOPES["full"]
        a.validate(G)
        return a
    # Subsample: its best few (and, when they fit, the baselines' own plans) on the whole window.
    top = [search.keys[i] for i in ranked[:FULL_TOP]]
    k_full = scenario_count(problem) + refine
    if seqs * k_full * len(top) <= SIM_SEQ_FULL:
        extra = [(BASELINE_OWN_THETA, r, 0.0) for r in base if (BASELINE_OWN_THETA, r, 0.0) not in top]
        if seqs * k_full * (len(top) + len(extra)) <= SIM_SEQ_FULL:
            top += extra
        whole = _Search(problem, name, rng, ())
        whole.gm = gm
        whole.score(top)
        whole.refine(len(top), refine)
        best = whole.ranked()[0]
        a = whole.winner(best)
        info = whole.info(best)
        info.update({"candidates": float(len(search.cands) + len(top)), "selection_groups": float(len(sel.prompts)),
                     "selection_scope": SCOPES["subsample+full_top"], "full_candidates": float(len(top))})
        a.params.update(info)
        a.validate(G)
        return a
    theta, rule, eps_base = search.keys[ranked[0]]
    info = search.info(ranked[0])
    info["selection_scope"] = SCOPES["subsample"]
    if rule in BASELINE_ORDERS:  # no simulation of the whole window to take a training order from
        a = baseline_candidate(problem, rule, rng, name, gm, tagged=True)
    else:
        owner, binfo = balance(gm, problem, theta)
        a = build_candidate(problem, gm, owner, binfo, theta, rule, eps_base, name, rng)
    a.params.update(info)
    a.validate(G)
    return a
