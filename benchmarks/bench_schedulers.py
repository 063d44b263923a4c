"""Scheduler benchmark: planners side by side in the event-driven simulator (rollout, end to end, bubbles, scaling).

Run from the repository root:

    .venv/bin/python benchmarks/bench_schedulers.py --out benchmarks/results/schedulers

It prints tables and writes `results.json` (docs/benchmarks.md, "What does the simulator predict for each
schedule?", is generated from it by benchmarks/render_docs.py) and `results.md` into --out. Every number in
one table comes from the same workloads, estimates, trainer and seeds.

Sections:
1. rollout makespan vs its lower bound R_LB, rollout only (mode stock: no lag gate; the planners are told
   so: max_lag 10^6, rho 0.1), with oracle and with history-estimated lengths, without and with work stealing;
2. end-to-end iteration time for rho in {0.3, 1.0, 1.5} (trainer work = rho * R_LB), streaming pipeline with
   the max-lag bound (1, 2 and K-1), with and without work stealing (every streaming planner alike), against
   every non-oracle baseline and the stock synchronous pipeline, which never steals (MindSpeed-RL has no
   stealing), with "stock + stealing" as a separate row; the sorting-bubble floor no order can go below;
3. sorting bubble of ASP vs sorted-ascending dispatch;
4. the cost of a tight lag bound (max_lag sweep);
5. scaling: iteration time for 1..32 instances, ASP (stream) vs stock vs one big instance.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Dict, List

import numpy as np

from mindspeed_asp.experiments import sweep
from _results import public_arg, write_results
from mindspeed_asp.sim.train_time import trainer_for_rho

BASELINES = ["stock", "random", "round_robin", "sorted_asc", "sorted_desc", "least_loaded", "verl_kk", "lpt"]
ROLLOUT_PLANNERS = ["asp", "oracle_asp", "lpt", "oracle_lpt", "verl_kk", "oracle_verl_kk", "round_robin", "stock"]
RHOS = (0.3, 1.0, 1.5)
ROLLOUT_RHO, ROLLOUT_MAX_LAG = 0.1, 10 ** 6  # the first table's regime as the planners see it: rollout only
STOCK = "stock@stock"  # the stock pipeline: synchronous, never stealing (MindSpeed-RL)
STOCK_STEAL = "stock@stock+steal"  # the same pipeline with work stealing switched on (a separate row)


def shared_data() -> Path:
    env = os.environ.get("ASP_SHARED_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "shared" / "data"


def workloads(quick: bool) -> Dict[str, Dict[str, object]]:
    """name -> spec and minibatch (alpaca groups are single samples, so its minibatch counts 256 of them)."""
    out = {"synthetic": {"spec": f"synthetic:prompts={256 if quick else 512},n=8", "minibatch": 32}}
    data = shared_data()
    if (data / "alpaca-train-10k-length.json").is_file():
        out["alpaca"] = {"spec": f"alpaca:{data / 'alpaca-train-10k-length.json'}", "minibatch": 256}
    if (data / "splitwise_conv.csv").is_file():
        out["splitwise"] = {"spec": f"splitwise:{data / 'splitwise_conv.csv'}", "minibatch": 32}
    return out


def run_set(spec: str, planners: List[str], cfg: sweep.SweepConfig, seeds: List[int], mode: str,
            progress: bool) -> Dict[str, Dict[str, float]]:
    labels = [(p if "@" in p else f"{p}@{mode}") for p in planners]
    res = sweep.compare(spec, sweep.parse_planners(",".join(labels), mode), cfg, seeds, progress=progress)
    return {label.split("@")[0] if label.endswith("@" + mode) else label: sweep.mean_metrics(rs)
            for label, rs in res.items()}


def _commit() -> str:
    """The code version measured (planners change often; numbers belong to a commit)."""
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10, cwd=Path(__file__).resolve().parent).stdout.strip()
        return out.stdout.strip() + (" (working tree has uncommitted edits)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def md_table(header: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/schedulers")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--max-lag", type=int, default=None,
                    help="lag bound of the streaming runs (default: K-1, the worst-case lag of the stock "
                         "pipeline's own last minibatch)")
    ap.add_argument("--quick", action="store_true", help="smaller synthetic workload, one seed")
    ap.add_argument("--only", default=None,
                    help="comma list of workloads to run (synthetic, alpaca, splitwise; default: every one found)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    progress = not args.quiet
    wls = workloads(args.quick)
    if args.only:
        keep = [w.strip() for w in args.only.split(",") if w.strip()]
        unknown = [w for w in keep if w not in ("synthetic", "alpaca", "splitwise")]
        if unknown or "synthetic" not in keep:
            ap.error(f"--only: workloads are synthetic, alpaca, splitwise, and synthetic must be among them "
                     f"(sections 3-5 use it); got {args.only!r}")
        wls = {k: v for k, v in wls.items() if k in keep}
    t_start = time.time()
    report: Dict[str, object] = {"seeds": seeds,
                                 "workloads": {k: public_arg(str(v["spec"])) for k, v in wls.items()},
                                 "commit": _commit()}
    md: List[str] = [f"Code at commit {report['commit']}; seeds {seeds}; workloads: "
                     + ", ".join(f"{k} = `{Path(str(v['spec'])).name if ':/' in str(v['spec']) else v['spec']}`"
                                 for k, v in wls.items()) + ".\n"]
    checks: List[str] = []

    # ---------------------------------------------------------------- 1. rollout makespan vs R_LB
    md.append("### 1. Rollout makespan vs lower bound (rollout only, 8 instances x 64 slots; without and with "
              "work stealing, the runtime's asp.work_stealing)\n")
    rows, rep1 = [], {}
    for name, w in wls.items():
        rep1[name] = {}
        for steal in (False, True):
            # rollout only: every planner is told the run it is in (no lag gate, a negligible trainer)
            cfg = sweep.SweepConfig(instances=8, slots=64, minibatch=int(w["minibatch"]), rho=ROLLOUT_RHO,
                                    max_lag=ROLLOUT_MAX_LAG, work_stealing=steal)
            r = run_set(str(w["spec"]), ROLLOUT_PLANNERS, cfg, seeds, "stock", progress)
            rep1[name]["steal" if steal else "no_steal"] = r
        r0, r1 = rep1[name]["no_steal"], rep1[name]["steal"]
        for p in ROLLOUT_PLANNERS:
            rows.append([name, p, f"{r0[p]['time/rollout']:.1f}", f"{r0[p]['above:time/rollout']:.1f}%",
                         f"{r1[p]['time/rollout']:.1f}", f"{r1[p]['above:time/rollout']:.1f}%",
                         f"{r1[p]['rollout/steals']:.1f}", f"{r1[p]['bound:rollout/R_LB']:.1f}",
                         f"{100 * r1[p]['bubble/skewness']:.1f}%"])
        for label, r in (("no stealing", r0), ("with stealing", r1)):
            o, h = r["oracle_asp"]["above:time/rollout"], r["asp"]["above:time/rollout"]
            checks.append(f"{name} ({label}): oracle ASP rollout {o:.1f}% above R_LB (target <= 5%): "
                          f"{'MET' if o <= 5 else 'MISSED'}")
            checks.append(f"{name} ({label}): history ASP rollout {h:.1f}% above R_LB (target <= 15%): "
                          f"{'MET' if h <= 15 else 'MISSED'}")
    md.append(md_table(["workload", "planner", "R no steal (s)", "% above R_LB", "R steal (s)", "% above R_LB",
                        "steals", "R_LB (s)", "skewness (steal)"], rows))
    report["rollout"] = rep1

    # ---------------------------------------------------------------- 2-4. end to end
    md.append("\n### 2. End-to-end iteration time, streaming with bounded lag (8 x 64, history estimates; "
              "max_lag 1 = the asp: default, K-1 = the stock pipeline's own worst lag)\n")
    rows, rep2 = [], {}
    from mindspeed_asp.workloads.spec import workload_from_spec

    for name, w in wls.items():
        M = int(w["minibatch"])
        groups = len(workload_from_spec(sweep.seeded_spec(str(w["spec"]), seeds[0])).prompts)
        # the asp: section's default (1) and K-1, the stock pipeline's own worst lag (its last minibatch is
        # trained K-1 updates after the weights that generated it)
        lags = [args.max_lag] if args.max_lag is not None else sorted({1, 2, max(1, -(-groups // M) - 1)})
        for lag, rho, steal in [(lg, rh, st) for lg in lags for rh in RHOS for st in (True, False)]:
            cfg = sweep.SweepConfig(instances=8, slots=64, minibatch=M, rho=rho, max_lag=lag, work_stealing=steal)
            r = run_set(str(w["spec"]), ["asp", "oracle_asp"] + BASELINES, cfg, seeds, "stream", progress)
            # the stock pipeline never steals (MindSpeed-RL has no stealing), whatever the streaming rows do;
            # "stock + stealing" is the same pipeline with stealing switched on, shown beside it
            r[STOCK] = run_set(str(w["spec"]), [STOCK], replace(cfg, work_stealing=False), seeds, "stream",
                               progress)[STOCK]
            r[STOCK_STEAL] = run_set(str(w["spec"]), [STOCK], replace(cfg, work_stealing=True), seeds, "stream",
                                     progress)[STOCK]
            rep2[f"{name}/lag={lag}/rho={rho}/steal={int(steal)}"] = {"max_lag": lag, "work_stealing": steal,
                                                                      "results": r}
            best_name = min(BASELINES, key=lambda p: r[p]["time/iteration"])
            best = r[best_name]["time/iteration"]
            a = r["asp"]["time/iteration"]
            st = r[STOCK]["time/iteration"]
            sts = r[STOCK_STEAL]["time/iteration"]
            # no dispatch order can push bubble/sorting below this: the trainer is idle until the first
            # minibatch can be ready and for at least R_LB - (total train work) while rollout runs
            floor = max(r["asp"]["bound:e2e/first_minibatch_LB"],
                        r["asp"]["bound:rollout/R_LB"] - r["asp"]["bound:train/total"]) / a
            rows.append([name, f"{rho}", str(lag), "on" if steal else "off", f"{a:.1f}",
                         f"{r['oracle_asp']['time/iteration']:.1f}",
                         f"{best:.1f} ({best_name})", f"{st:.1f}", f"{sts:.1f}", f"{100 * (a / best - 1):+.1f}%",
                         f"{100 * (a / st - 1):+.1f}%", f"{r['asp']['above:time/iteration']:.1f}%",
                         f"{100 * r['asp']['bubble/sorting']:.1f}% / {100 * r['sorted_asc']['bubble/sorting']:.1f}%",
                         f"{100 * floor:.1f}%", f"{r['asp']['rollout/steals']:.0f}"])
            tag = f"{name} max_lag={lag} rho={rho} stealing={'on' if steal else 'off'}"
            checks.append(f"{tag}: ASP {a:.1f}s vs best baseline {best_name} {best:.1f}s "
                          f"({100 * (a / best - 1):+.1f}%, target <= +2%): {'MET' if a <= 1.02 * best else 'MISSED'}")
            if name == "synthetic":
                checks.append(f"{tag}: ASP vs stock pipeline {100 * (a / st - 1):+.1f}% (target <= -15%): "
                              f"{'MET' if a <= 0.85 * st else 'MISSED'}")
            sa, ss = r["asp"]["bubble/sorting"], r["sorted_asc"]["bubble/sorting"]
            checks.append(f"{tag}: sorting bubble ASP {100 * sa:.2f}% vs sorted_asc {100 * ss:.2f}% "
                          f"(target <= 1/3): {'MET' if sa <= ss / 3 + 1e-12 else 'MISSED'}"
                          + ("" if floor <= ss / 3 else f" (unreachable: floor {100 * floor:.1f}% > "
                                                         f"{100 * ss / 3:.1f}%)"))
    md.append(md_table(["workload", "rho", "max_lag", "stealing", "ASP (s)", "oracle ASP (s)", "best baseline (s)",
                        "stock pipeline (s)", "stock + stealing (s)", "ASP vs best", "ASP vs stock",
                        "ASP % above e2e LB",
                        "sorting bubble ASP / sorted_asc", "sorting floor", "ASP steals"], rows))
    report["e2e"] = rep2

    md.append("\n### 3. Cost of a tight lag bound (synthetic, rho = 1.0, stream)\n")
    rows, rep3 = [], {}
    w = wls["synthetic"]
    for lag in (0, 1, 2, 4, 8, 15):
        cfg = sweep.SweepConfig(instances=8, slots=64, minibatch=int(w["minibatch"]), rho=1.0, max_lag=lag)
        r = run_set(str(w["spec"]), ["asp", "verl_kk", "lpt", "sorted_asc", "stock", "stock@stock"], cfg, seeds,
                    "stream", progress)
        rep3[lag] = r
        rows.append([str(lag)] + [f"{r[p]['time/iteration']:.1f}"
                                  for p in ("asp", "verl_kk", "lpt", "sorted_asc", "stock", "stock@stock")]
                    + [f"{r['asp']['lag/mean']:.2f}", f"{r['asp']['lag/max']:.0f}",
                       f"{100 * r['asp']['bubble/sorting']:.1f}% / {100 * r['sorted_asc']['bubble/sorting']:.1f}%"])
    md.append(md_table(["max_lag", "ASP (s)", "verl_kk (s)", "lpt (s)", "sorted_asc (s)", "stock order (s)",
                        "stock pipeline (s)", "ASP lag mean", "ASP lag max", "sorting bubble ASP / sorted_asc"], rows))
    report["lag_sweep"] = rep3

    md.append("\n### 3b. Stale-sample policies under a tight bound (synthetic, rho = 1.0, ASP plan, stream)\n")
    rows, rep3b = [], {}
    for lag in (1, 2, 4):
        for policy in ("regenerate", "drop"):  # the runtime's asp.stale_policy values
            cfg = sweep.SweepConfig(instances=8, slots=64, minibatch=int(w["minibatch"]), rho=1.0, max_lag=lag,
                                    stale_policy=policy)
            r = run_set(str(w["spec"]), ["asp"], cfg, seeds, "stream", progress)["asp"]
            rep3b[f"{lag}/{policy}"] = r
            rows.append([str(lag), policy, f"{r['time/iteration']:.1f}", f"{r['time/rollout']:.1f}",
                         f"{r['lag/max']:.0f}", f"{r['lag/regenerated_groups']:.1f}", f"{r['lag/stale_dropped']:.1f}"])
    md.append(md_table(["max_lag", "stale policy", "iteration (s)", "rollout (s)", "lag max",
                        "regenerated groups", "dropped samples"], rows))
    report["stale_policies"] = rep3b

    # ---------------------------------------------------------------- 5. scaling
    md.append("\n### 4. Scaling: iteration time vs instances (synthetic; trainer fixed at rho = 0.3 of R_LB "
              "at 8 instances; single = one instance with all devices, speed-up amdahl:0.1)\n")
    from mindspeed_asp.sim.bounds import lower_bounds
    from mindspeed_asp.core.problem import InstanceSpec

    scaling = sweep.parse_scaling("amdahl:0.1")
    rows, rep4 = [], {}
    for m in (1, 2, 4, 8, 16, 32):
        vals = {"asp": [], "stock@stock": [], "stock@single": []}
        for seed in seeds:
            cfg = sweep.SweepConfig(instances=m, slots=64, minibatch=int(w["minibatch"]), rho=0.3,
                                    max_lag=15, single_scaling=scaling)
            wb = sweep.prepare(str(w["spec"]), cfg, seed)
            wl = wb.workload
            ref = lower_bounds(wl.truth, wl.prompts.prompt_lens, 8, InstanceSpec(64), cfg.cost)["rollout/R_LB"]
            wb.r_lb = ref  # the same trainer for every m
            for label in vals:
                name, _, mode = label.partition("@")
                res, _ = sweep.run_planner(wb, name, mode or "stream", cfg)
                vals[label].append(res.metrics["time/iteration"])
        rep4[m] = {k: float(np.mean(v)) for k, v in vals.items()}
        rows.append([str(m)] + [f"{rep4[m][k]:.1f}" for k in vals]
                    + [f"{rep4[m]['stock@single'] / rep4[m]['asp']:.2f}x"])
    md.append(md_table(["instances", "ASP stream (s)", "stock (s)", "single big instance (s)",
                        "single / ASP"], rows))
    report["scaling"] = rep4

    # ---------------------------------------------------------------- 6. simulator speed
    if not args.quick:
        from mindspeed_asp.core.problem import Assignment, PlanningProblem
        from mindspeed_asp.sim.pipeline import simulate_pipeline

        md.append("\n### 5. Simulator speed (64 instances x 64 slots, 10^5 groups of 8, round-robin plan)\n")
        wl = workload_from_spec("synthetic:prompts=100000,n=8,seed=0,epochs=1")
        G = len(wl.prompts)
        cfg = sweep.SweepConfig(instances=64, slots=64, minibatch=512)
        ref = lower_bounds(wl.truth, wl.prompts.prompt_lens, 64, InstanceSpec(64), cfg.cost)["rollout/R_LB"]
        tr = trainer_for_rho(1.0, wl.truth, wl.prompts.prompt_lens, ref, 512)
        prob = PlanningProblem(prompts=wl.prompts, estimate=None, instances=64, spec=InstanceSpec(64),
                               minibatch=512, cost=cfg.cost, max_new_tokens=int(wl.max_new_tokens))
        a = Assignment(orders=[np.arange(j, G, 64) for j in range(64)], minibatch=np.full(G, -1),
                       planner="round_robin")
        rows, rep5 = [], {}
        for mode, lag in (("stock", 1), ("stream", 1), ("stream", 4)):
            t0 = time.perf_counter()
            res = simulate_pipeline(prob, a, wl.truth, mode=mode, max_lag=lag, trainer=tr, sync_time=1.0)
            sec = time.perf_counter() - t0
            rep5[f"{mode}/lag={lag}"] = sec
            rows.append([mode, str(lag), f"{G * 8:,}", f"{sec:.1f}", f"{res.metrics['time/iteration']:.0f}"])
            checks.append(f"speed {mode} max_lag={lag}: {sec:.1f} s for 64 x 10^5 groups (target <= 30 s): "
                          f"{'MET' if sec <= 30 else 'MISSED'}")
        md.append(md_table(["mode", "max_lag", "sequences", "wall s (2 shared cores)", "simulated iteration s"],
                           rows))
        report["speed"] = rep5

    report["checks"] = checks
    report["seconds"] = time.time() - t_start
    md.append("\n### Targets\n")
    md.extend(f"- {c}" for c in checks)
    text = "\n".join(md) + "\n"
    (out / "results.md").write_text(text)
    write_results(out / "results.json", report, __file__, argv)
    print(text)
    print(f"wrote {out / 'results.md'} and {out / 'results.json'} in {report['seconds']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
