"""Regime advice: what a lag bound costs on this workload, simulated before the run (`asp plan`, `asp simulate`).

Why: a tight max_lag is chosen for learning quality, but on short-response workloads a streaming run at
max_lag 1-2 can be slower than the stock pipeline, whose own staleness is K-1 (K = minibatches per window).
A user should see that price before paying it. The advice simulates one window (the plan's first) in the event
simulator at max_lag 0, 1, 2, K-1 and the chosen bound, against the stock pipeline (stock planner, synchronous
barrier mode, no stealing: MindSpeed-RL has none), with the estimate, cost model and rho the plan uses. The
lengths are one scenario drawn from the estimate (`scheduler.scenarios.sample_scenarios`), so the advice is a
prediction, not a measurement. It also gives the honest planning gap: the plan's event-simulated rollout on
those lengths against the rollout lower bound of `sim.bounds` computed from the same lengths (the fluid
figures of `build.summarize` share one model for both sides and can read +0.0% when a solo term binds).

Cost: a window larger than ADVICE_MAX_SEQS sequences is shrunk to its first groups on proportionally fewer
instances (same groups per instance, slots and KV budget per instance), then re-planned.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional

import numpy as np

from mindspeed_asp.core.policy import DEFAULT_STALE_POLICY
from mindspeed_asp.scheduler.planners import get_planner
from mindspeed_asp.scheduler.scenarios import sample_scenarios
from mindspeed_asp.sim.bounds import lower_bounds
from mindspeed_asp.sim.pipeline import simulate_pipeline
from mindspeed_asp.sim.train_time import trainer_for_rho
from mindspeed_asp.core.problem import Assignment, PlanningProblem

#: Sequences (groups x n) of the simulated window above which the advice shrinks it (keeps it a few seconds).
ADVICE_MAX_SEQS = 32_768
#: Seed of the length scenario (the advice must not change between two runs of the same command).
SCENARIO_SEED = 12345
#: How much slower than stock (a fraction) the chosen bound must be predicted before the advice warns. Why: the
#: two sides are simulated on one length scenario, and a gap under 1% is below what that prediction resolves
#: (a warning that reads "0% slower" only teaches users to ignore the line).
SLOWER_TOLERANCE = 0.01


def _seconds(v: float) -> str:
    """Three significant digits at least, so two close figures of a short window do not print alike."""
    return f"{v:.{2 if v < 10 else 1}f} s"


@dataclass
class LagPoint:
    """Simulated end-to-end figures of the window at one max_lag (streaming)."""

    max_lag: int
    e2e_s: float
    e2e_tps: float
    rollout_s: float

    def as_dict(self) -> Dict[str, float]:
        return {"max_lag": self.max_lag, "e2e_s": self.e2e_s, "e2e_tps": self.e2e_tps, "rollout_s": self.rollout_s}


@dataclass
class RegimeAdvice:
    """Simulated e2e of one window at several lag bounds against the stock pipeline, and the planning gap."""

    planner: str
    chosen_max_lag: int
    work_stealing: bool
    rho: float
    groups: int
    instances: int
    minibatches: int  # K
    shrunk: bool  # window reduced to its first groups on fewer instances (ADVICE_MAX_SEQS)
    stock_e2e_s: float
    stock_e2e_tps: float
    points: List[LagPoint] = field(default_factory=list)
    pred_rollout_s: float = float("nan")  # event-simulated rollout of the plan on the scenario (no trainer)
    rollout_lb_s: float = float("nan")  # sim.bounds R_LB of the same lengths
    seconds: float = 0.0

    def point(self, lag: int) -> LagPoint:
        return next(p for p in self.points if p.max_lag == lag)

    @property
    def chosen(self) -> LagPoint:
        return self.point(self.chosen_max_lag)

    def reaches_stock(self, p: LagPoint) -> bool:
        """`p` is predicted at most SLOWER_TOLERANCE slower than the stock pipeline (or faster)."""
        return p.e2e_s <= self.stock_e2e_s * (1.0 + SLOWER_TOLERANCE)

    @property
    def slower_than_stock(self) -> bool:
        """The chosen bound is predicted more than SLOWER_TOLERANCE slower than the stock pipeline."""
        return not self.reaches_stock(self.chosen)

    @property
    def gap_pct(self) -> float:
        return 100.0 * (self.pred_rollout_s / self.rollout_lb_s - 1.0) if self.rollout_lb_s > 0 else float("nan")

    def warning(self) -> Optional[str]:
        """One line for stderr when the chosen bound makes the run slower than the stock pipeline, else None."""
        if not self.slower_than_stock:
            return None
        c = self.chosen
        faster = [str(p.max_lag) for p in self.points if self.reaches_stock(p)]
        hint = (f"; within {100 * SLOWER_TOLERANCE:.0f}% of stock or faster: max_lag {', '.join(faster)}" if faster
                else "; no bound simulated here reaches it")
        pct = 100 * (c.e2e_s / self.stock_e2e_s - 1)
        return (f"WARNING: max_lag {c.max_lag} is predicted {pct:.{1 if pct < 10 else 0}f}% slower "
                f"end to end than the stock pipeline (simulated {_seconds(c.e2e_s)} vs {_seconds(self.stock_e2e_s)} "
                f"per window, whose own staleness is max_lag {self.minibatches - 1}){hint}")

    def as_dict(self) -> Dict[str, Any]:
        return {"planner": self.planner, "chosen_max_lag": self.chosen_max_lag, "work_stealing": self.work_stealing,
                "rho": self.rho, "groups": self.groups, "instances": self.instances,
                "minibatches": self.minibatches, "shrunk": self.shrunk,
                "stock_e2e_s": self.stock_e2e_s, "stock_e2e_tps": self.stock_e2e_tps,
                "lags": [dict(p.as_dict(), vs_stock=p.e2e_s / self.stock_e2e_s) for p in self.points],
                "slower_than_stock": self.slower_than_stock, "pred_rollout_s": self.pred_rollout_s,
                "rollout_lb_s": self.rollout_lb_s, "pred_above_lb_pct": self.gap_pct, "seconds": self.seconds,
                "lengths": "one scenario drawn from the estimate"}

    def format(self) -> str:
        """Indented lines for the CLI summaries."""
        where = (f"first window ({self.groups} groups on {self.instances} instance(s)"
                 + (", shrunk" if self.shrunk else "") + f", K = {self.minibatches})")
        lines = [f"  regime advice     simulated e2e per window, {where}, rho {self.rho:g}, "
                 f"stealing {'on' if self.work_stealing else 'off'}:",
                 f"    stock pipeline  {self.stock_e2e_s:9.1f} s  e2e_tps {self.stock_e2e_tps:9.0f}  "
                 f"(synchronous, no stealing, staleness K-1 = {self.minibatches - 1})"]
        for p in self.points:
            mark = "  <- chosen" if p.max_lag == self.chosen_max_lag else ""
            lines.append(f"    max_lag {p.max_lag:<6d}  {p.e2e_s:9.1f} s  e2e_tps {p.e2e_tps:9.0f}  "
                         f"{100 * (p.e2e_s / self.stock_e2e_s - 1):+6.1f}% vs stock{mark}")
        lines.append("    (e2e_tps divides by every device a run uses: a streaming run counts its trainer, the "
                     "colocated stock run does not)")
        return "\n".join(lines)


def lag_points(minibatches: int, chosen: int) -> List[int]:
    """0, 1, 2, K-1 and the chosen bound (distinct, sorted; K-1 at least 0)."""
    return sorted({0, 1, 2, max(0, minibatches - 1), int(chosen)})


def _shrink(problem: PlanningProblem, max_seqs: int) -> PlanningProblem:
    """The window's first groups on proportionally fewer instances, at most `max_seqs` sequences."""

    G, n = len(problem.prompts), problem.prompts.n
    per_inst = max(1, G // problem.instances)
    m = max(1, min(problem.instances, max_seqs // max(1, per_inst * n)))
    keep = np.arange(min(G, m * per_inst))
    return replace(problem, prompts=problem.prompts.subset(keep), estimate=problem.estimate.subset(keep),
                   instances=m)


def regime_advice(problem: PlanningProblem, assignment: Optional[Assignment] = None, *, planner: str = "asp",
                  sync_time: float = 0.0, overhead: float = 0.0, stale_policy: str = DEFAULT_STALE_POLICY,
                  max_seqs: int = ADVICE_MAX_SEQS, seed: int = SCENARIO_SEED) -> RegimeAdvice:
    """Simulate `problem`'s window at max_lag 0, 1, 2, K-1 and problem.max_lag, and the stock pipeline.

    `assignment` is the plan of this window (reused as is); None, or a window too large, re-plans it with
    `planner`. The regime (rho, max_lag, work_stealing, cost, KV budget) is the problem's.
    """
    t0 = time.perf_counter()
    shrunk = len(problem.prompts) * problem.prompts.n > max_seqs
    if shrunk:
        problem = _shrink(problem, max_seqs)
        assignment = None
    if assignment is None:
        assignment = get_planner(planner)(problem, np.random.default_rng(problem.seed))
    lengths = np.rint(sample_scenarios(problem, 1, np.random.default_rng(seed))[0]).astype(np.int64)
    plen = np.asarray(problem.prompts.prompt_lens, dtype=np.int64)
    r_lb = lower_bounds(lengths, plen, problem.instances, problem.spec, problem.cost)["rollout/R_LB"]
    trainer = trainer_for_rho(problem.rho, lengths, plen, r_lb, problem.minibatch, overhead)
    K = trainer.num_minibatches(len(plen))
    steal = bool(problem.work_stealing)
    kw = dict(trainer=trainer, sync_time=sync_time, stale_policy=stale_policy, with_bounds=False)
    stock_plan = get_planner("stock")(problem, np.random.default_rng(problem.seed))
    stock = simulate_pipeline(problem, stock_plan, lengths, mode="stock", work_stealing=False, **kw).metrics
    points = []
    for lag in lag_points(K, problem.max_lag):
        met = simulate_pipeline(problem, assignment, lengths, mode="stream", max_lag=lag, work_stealing=steal,
                                **kw).metrics
        points.append(LagPoint(lag, met["time/iteration"], met["throughput/e2e_tps"], met["time/rollout"]))
    # the planning gap: the plan's rollout alone (barrier mode, no lag gate) against the independent bound
    roll = simulate_pipeline(problem, assignment, lengths, mode="stock", work_stealing=steal, trainer=trainer,
                             sync_time=0.0, with_bounds=True)
    return RegimeAdvice(planner=assignment.planner, chosen_max_lag=int(problem.max_lag), work_stealing=steal,
                        rho=float(problem.rho), groups=len(plen), instances=problem.instances, minibatches=K,
                        shrunk=shrunk, stock_e2e_s=stock["time/iteration"],
                        stock_e2e_tps=stock["throughput/e2e_tps"], points=points,
                        pred_rollout_s=roll.metrics["time/rollout"], rollout_lb_s=roll.bounds["rollout/R_LB"],
                        seconds=time.perf_counter() - t0)

