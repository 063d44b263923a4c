"""How fast is the simulator? CPU time of `simulate_pipeline` at the target size: 64 instances x 10^5 groups of 8.

    OMP_NUM_THREADS=1 python benchmarks/bench_sim_speed.py [--groups 100000] [--repeat 2] [--json out.json]

Why a separate benchmark: the planner scores candidates with the simulator, and the target (<= 30 s for
64 x 10^5 x 8) must hold whatever the policy rules cost in the event loop (docs/design.md#rules).
Cases: stock, and stream at max_lag 1 and 4, on a round-robin plan (64 slots, minibatch 512, rho 1, 1 s
sync), plus stream at max_lag 2 with plan minibatch tags and predicted-token steal loads (the asp path:
tagged minibatch order, work stealing by load). Best CPU time of `--repeat` runs is reported (single
threaded, so CPU time is time on one core whatever else the machine runs); wall time is kept alongside.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from mindspeed_asp.core.problem import (Assignment, CostModel, InstanceSpec, LengthEstimate,  # noqa: E402
                                 PlanningProblem)
from mindspeed_asp.sim.bounds import lower_bounds  # noqa: E402
from mindspeed_asp.sim.pipeline import simulate_pipeline  # noqa: E402
from mindspeed_asp.sim.train_time import trainer_for_rho  # noqa: E402
from mindspeed_asp.workloads.synthetic import SyntheticRLWorkload  # noqa: E402

M, SLOTS, INSTANCES, TARGET_S = 512, 64, 64, 30.0


def cases(groups: int):
    wl = SyntheticRLWorkload(groups, n=8, epochs=1, seed=0)
    truth = wl.lengths(0)
    P = wl.prompts.prompt_lens
    cost = CostModel()
    ref = lower_bounds(truth, P, INSTANCES, InstanceSpec(SLOTS), cost)["rollout/R_LB"]
    tr = trainer_for_rho(1.0, truth, P, ref, M)
    G = len(P)
    plain = PlanningProblem(prompts=wl.prompts, estimate=None, instances=INSTANCES, spec=InstanceSpec(SLOTS),
                            minibatch=M, cost=cost, max_new_tokens=int(wl.max_new_tokens))
    rr = Assignment(orders=[np.arange(j, G, INSTANCES) for j in range(INSTANCES)], minibatch=np.full(G, -1),
                    planner="round_robin")
    gmax = truth.max(1).astype(float)
    est = LengthEstimate(median=np.median(truth, 1).astype(float), group_max=gmax, sigma=np.full(G, 0.5),
                         p_trunc=np.zeros(G), has_history=np.ones(G, bool), estimator="oracle",
                         samples=truth.astype(float))
    tagged = PlanningProblem(prompts=wl.prompts, estimate=est, instances=INSTANCES, spec=InstanceSpec(SLOTS),
                             minibatch=M, cost=cost, max_new_tokens=int(wl.max_new_tokens))
    order = np.argsort(-gmax, kind="stable")  # longest first, tags in plan order
    tags = np.empty(G, dtype=np.int64)
    tags[order] = np.arange(G) // M
    lpt = Assignment(orders=[order[j::INSTANCES] for j in range(INSTANCES)], minibatch=tags, planner="lpt_tagged")
    return [("stock", 1, plain, rr), ("stream", 1, plain, rr), ("stream", 4, plain, rr),
            ("stream+tags+steal", 2, tagged, lpt)], truth, tr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    runs, truth, tr = cases(args.groups)
    out = {}
    for label, lag, prob, a in runs:
        mode = label.split("+")[0]
        best_cpu, wall, it = float("inf"), 0.0, 0.0
        for _ in range(args.repeat):
            c, w = time.process_time(), time.perf_counter()
            res = simulate_pipeline(prob, a, truth, mode=mode, max_lag=lag, trainer=tr, sync_time=1.0,
                                    with_bounds=False)
            cpu = time.process_time() - c
            if cpu < best_cpu:
                best_cpu, wall, it = cpu, time.perf_counter() - w, res.metrics["time/iteration"]
        key = f"{label}/max_lag={lag}"
        out[key] = {"cpu_s": best_cpu, "wall_s": wall, "simulated_iteration_s": it}
        verdict = "MET" if best_cpu <= TARGET_S else "MISSED"
        print(f"{key:28s} cpu {best_cpu:6.2f} s  wall {wall:6.2f} s  simulated iteration {it:10.1f} s  "
              f"(target <= {TARGET_S:.0f} s: {verdict})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"groups": args.groups, "instances": INSTANCES, "n": 8, "results": out}, f, indent=2)


if __name__ == "__main__":
    main()
