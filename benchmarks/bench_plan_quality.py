"""How good are the plans? Every planner, side by side, in the event simulator (`mindspeed_asp.sim`).

    python benchmarks/bench_plan_quality.py [--groups 512] [--instances 8] [--slots 64] [--minibatch 32]
        [--rho 0.3,1.0] [--seeds 3] [--max-lag 1] [--json out.json]

Workload: the seeded synthetic RL generator (median 2048 tokens, cap 16384, within-group sigma 0.3-0.8,
epoch-to-epoch drift); the planners see the HistoryEstimator's prediction from epochs 0-2 (oracle_* see the
truth), the simulator runs epoch 3's true lengths. The trainer takes `alpha * tokens` per minibatch with
alpha set so that its total work is rho times the predicted rollout lower bound. Reported per planner: the
mean over seeds of rollout makespan and end-to-end time (streaming, bounded lag), both as ratios to
`stock` measured in the same run, and % above the simulator's rollout bound.
"""
from __future__ import annotations

import argparse

import numpy as np

from mindspeed_asp.config import EstimatorSection
from mindspeed_asp.scheduler.build import estimate_lengths
from mindspeed_asp.core.fluid import group_moments, rollout_lower_bound
from mindspeed_asp.scheduler.planners import PLANNERS, needs_oracle
from mindspeed_asp.core.problem import CostModel, InstanceSpec, PlanningProblem
from mindspeed_asp.sim.pipeline import simulate_pipeline
from mindspeed_asp.sim.train_time import TrainerModel
from mindspeed_asp.workloads.synthetic import SyntheticRLWorkload
from _results import write_results

ORDER = ["stock", "random", "round_robin", "least_loaded", "sorted_asc", "sorted_desc", "verl_kk", "lpt", "asp",
         "oracle_verl_kk", "oracle_lpt", "oracle_asp"]


def run(groups: int, m: int, slots: int, M: int, rho: float, seed: int, max_lag: int) -> dict:
    wl = SyntheticRLWorkload(groups, n=8, epochs=4, seed=seed)
    truth = wl.lengths(3).astype(float)
    hist = wl.history(3)
    cost = CostModel()
    out = {}
    for name in ORDER:
        est = estimate_lengths(wl.prompts, hist, wl.max_new_tokens, name, EstimatorSection(),
                               true_lengths=truth if needs_oracle(name) else None)
        problem = PlanningProblem(prompts=wl.prompts, estimate=est, instances=m, spec=InstanceSpec(slots=slots),
                                  minibatch=M, cost=cost, max_new_tokens=wl.max_new_tokens, rho=rho, seed=seed)
        if name == "stock":  # one trainer speed for every planner: from the predicted bound
            r_hat = rollout_lower_bound(group_moments(problem), m, cost)
            tokens = float((truth.sum(1) + 8 * wl.prompts.prompt_lens).sum())
            trainer = TrainerModel(alpha=rho * r_hat / tokens, overhead=0.0, minibatch=M)
        a = PLANNERS[name](problem, np.random.default_rng(seed))
        res = simulate_pipeline(problem, a, truth, mode="stream", max_lag=max_lag, trainer=trainer)
        out[name] = {"rollout": res.metrics["time/rollout"], "e2e": res.metrics["time/iteration"],
                     "rollout_above_pct": res.above.get("rollout/makespan_busy", float("nan")),
                     "skewness": res.metrics["bubble/skewness"],
                     "first_minibatch": res.metrics["time/first_minibatch"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=512)
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--minibatch", type=int, default=32)
    ap.add_argument("--rho", default="0.3,1.0")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--max-lag", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    report = {}
    for rho in [float(x) for x in args.rho.split(",")]:
        runs = [run(args.groups, args.instances, args.slots, args.minibatch, rho, s, args.max_lag)
                for s in range(args.seeds)]
        print(f"\nrho = {rho}: {args.groups} groups x 8 on {args.instances} instances x {args.slots} slots, "
              f"M = {args.minibatch}, max_lag = {args.max_lag}, mean of {args.seeds} seeds")
        print(f"{'planner':>15} {'rollout s':>10} {'vs stock':>8} {'+R_LB %':>8} {'skew':>6} {'first mb':>9} "
              f"{'e2e s':>9} {'vs stock':>8}")
        rows = {}
        for name in ORDER:
            vals = {k: float(np.mean([r[name][k] for r in runs])) for k in runs[0][name]}
            rel_r = float(np.mean([r[name]["rollout"] / r["stock"]["rollout"] for r in runs]))
            rel_e = float(np.mean([r[name]["e2e"] / r["stock"]["e2e"] for r in runs]))
            rows[name] = {**vals, "rollout_vs_stock": rel_r, "e2e_vs_stock": rel_e}
            print(f"{name:>15} {vals['rollout']:>10.1f} {rel_r:>8.3f} {vals['rollout_above_pct']:>8.1f} "
                  f"{vals['skewness']:>6.3f} {vals['first_minibatch']:>9.1f} {vals['e2e']:>9.1f} {rel_e:>8.3f}")
        asp_vs_lpt = float(np.mean([r["asp"]["e2e"] / r["lpt"]["e2e"] for r in runs]))
        oracle = float(np.mean([r["oracle_asp"]["e2e"] / r["oracle_lpt"]["e2e"] for r in runs]))
        print(f"  per-seed mean e2e ratio: asp/lpt {asp_vs_lpt:.3f}, oracle_asp/oracle_lpt {oracle:.3f}")
        rows["_ratios"] = {"asp_vs_lpt": asp_vs_lpt, "oracle_asp_vs_oracle_lpt": oracle}
        report[str(rho)] = rows
    if args.json:
        setup = {"groups": args.groups, "instances": args.instances, "slots": args.slots,
                 "minibatch": args.minibatch, "seeds": args.seeds, "max_lag": args.max_lag}
        write_results(args.json, {"setup": setup, "rho": report}, __file__)


if __name__ == "__main__":
    main()
