"""Runtime benchmark on the tiny CPU config: asp against stock and async, side by side in one process.

Same prompts, seeds and number of trained samples in every run. Prints and writes (JSON + Markdown):

1. e2e_tps and iteration time of asp vs stock vs async (ratios against stock), the three bubbles and the
   lag distribution of each mode;
2. convergence: reward curves of asp (max_lag 1 and 2) against stock over the same trained samples, for
   several seeds; final mean reward with the seed-to-seed noise of stock;
3. length bias: KS distance and means of trained response lengths, asp vs stock;
4. weight-sync time per round and peak memory (driver/trainer + instance processes);
5. the simulator's prediction for the same config (cost parameters fitted from the instances' own
   timings) against the measured iteration time.

    .venv/bin/python benchmarks/bench_runtime.py --out runs/bench_runtime [--seeds 0,1,2] [--skip-sim] \
        [--json benchmarks/results/runtime_tiny_cpu.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np

from _results import write_results


def run_one(name: str, out: Path, overrides: List[str], config: str | None) -> Dict[str, Any]:
    from mindspeed_asp.commands.train import build_config
    from mindspeed_asp.runtime.driver import run_training

    cfg = build_config(config, overrides, None, str(out / name))
    print(f"== {name}: {' '.join(overrides)}", file=sys.stderr, flush=True)
    summary = run_training(cfg, out / name, progress=True)
    summary["name"] = name
    return summary


def trained_lengths(run_dir: Path) -> np.ndarray:
    trace = json.loads((run_dir / "trace.json").read_text())
    return np.array([L for g in trace["groups"] if g["trained"] for L in g["sample_lengths"]], dtype=np.float64)


def reward_curve(run_dir: Path) -> List[float]:
    trace = json.loads((run_dir / "trace.json").read_text())
    return [s["reward/mean"] for s in trace["steps"]]


def simulate_prediction(run_dir: Path, summary: Dict[str, Any]) -> Dict[str, Any]:
    """Fit a, b, c from the run's own instance timings and simulate the same stock iterations.

    Each generated group is one timing row: its mean step time (span / longest sample) against the
    sequences and KV tokens of the groups overlapping it on the same instance (group-level, since the
    instance does not log per-step timings). The simulator then replays every stock iteration with the
    observed lengths, the fitted cost, and the measured train and sync times.
    """
    from mindspeed_asp.scheduler.planners import get_planner
    from mindspeed_asp.types import InstanceSpec, LengthEstimate, PlanningProblem, PromptSet
    from mindspeed_asp.cost_model import fit_cost_model
    from mindspeed_asp.sim.pipeline import simulate_pipeline
    from mindspeed_asp.sim.train_time import TrainerModel

    trace = json.loads((run_dir / "trace.json").read_text())
    cfg = summary["config"]
    groups = [g for g in trace["groups"]]
    # Per-iteration instance busy intervals: fit step time ~ a + b*active + c*KV from group-level averages.
    rows_active, rows_kv, rows_t = [], [], []
    for g in groups:
        Ls = np.array(g["sample_lengths"], dtype=np.float64)
        steps = max(1.0, Ls.max())
        overlap = [h for h in groups if h["instance"] == g["instance"] and h["start"] < g["end"] and h["end"] > g["start"]]
        active = sum(len(h["sample_lengths"]) for h in overlap)
        kv = sum(h["prompt_tokens"] + 0.5 * h["response_tokens"] for h in overlap)
        rows_active.append(active)
        rows_kv.append(kv)
        rows_t.append((g["end"] - g["start"]) / steps)
    fit = fit_cost_model(np.array(rows_active), np.array(rows_kv), np.array(rows_t), source=f"fitted from {run_dir}")
    n = cfg["data"]["n"]
    M = cfg["asp"]["minibatch_groups"]
    preds = []
    for w in sorted({g["window"] for g in groups}):
        gs = sorted([g for g in groups if g["window"] == w], key=lambda g: g["gid"])
        L = np.array([g["sample_lengths"] for g in gs], dtype=np.float64)
        P = np.array([g["prompt_tokens"] // n for g in gs], dtype=np.int64)
        ps = PromptSet(prompt_ids=np.array([str(g["gid"]) for g in gs], dtype=object), prompt_lens=P, n=n)
        est = LengthEstimate(median=np.median(L, axis=1), group_max=L.max(axis=1), sigma=np.zeros(len(gs)),
                             p_trunc=np.zeros(len(gs)), has_history=np.ones(len(gs), dtype=bool),
                             estimator="observed", samples=L)
        problem = PlanningProblem(prompts=ps, estimate=est, instances=cfg["asp"]["instances"],
                                  spec=InstanceSpec(slots=cfg["asp"]["slots"]), minibatch=M, cost=fit.cost,
                                  max_new_tokens=cfg["data"]["max_new_tokens"])
        assignment = get_planner("stock")(problem, np.random.default_rng(0))
        # measured train step time as the trainer model's overhead (alpha 0): only rollout is predicted
        trainer = TrainerModel(alpha=0.0, overhead=float(summary.get("time/train", 0.0)), minibatch=M)
        res = simulate_pipeline(problem, assignment, L.astype(np.int64), mode="stock", max_lag=0,
                                trainer=trainer, sync_time=float(summary.get("time/weight_sync", 0.0)))
        preds.append(res.metrics.get("time/iteration", np.nan))
    return {"fit": fit.to_json(), "predicted_iteration_s": float(np.nanmean(preds)),
            "measured_iteration_s": summary["time/iteration"]}


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench_runtime")
    ap.add_argument("--config", default=None, help="run config (default: packaged tiny_cpu.yaml)")
    ap.add_argument("--seeds", default="0,1,2", help="seeds for the convergence comparison")
    ap.add_argument("--json", default=None, help="also write the results here (benchmarks/results/...)")
    ap.add_argument("--skip-sim", action="store_true")
    ap.add_argument("--analyze-only", action="store_true",
                    help="recompute the results from the run directories already under --out")
    ap.add_argument("overrides", nargs="*", help="config overrides applied to every run")
    args = ap.parse_args(argv)
    from scipy.stats import ks_2samp

    from mindspeed_asp.commands.compare import compare_runs
    from mindspeed_asp.runtime import ray_utils
    from mindspeed_asp.runtime.driver import QUIET_ENV

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    base = list(args.overrides)
    t0 = time.time()
    runs: Dict[str, Dict[str, Any]] = {}
    if args.analyze_only:
        for d in sorted(out.iterdir()):
            if (d / "summary.json").is_file():
                runs[d.name] = dict(json.loads((d / "summary.json").read_text()), name=d.name)
    else:
        ray_utils.start_local_ray(num_cpus=8, object_store_mb=512, env=QUIET_ENV)
    try:
        for seed in ([] if args.analyze_only else seeds):
            sd = [f"run.seed={seed}", f"data.seed={seed}"]
            runs[f"stock_s{seed}"] = run_one(f"stock_s{seed}", out, base + sd + ["asp.mode=stock"], args.config)
            runs[f"asp_lag1_s{seed}"] = run_one(f"asp_lag1_s{seed}", out,
                                                base + sd + ["asp.mode=asp", "asp.max_lag=1"], args.config)
            runs[f"async_lag1_s{seed}"] = run_one(f"async_lag1_s{seed}", out,
                                                  base + sd + ["asp.mode=async", "asp.max_lag=1"], args.config)
            runs[f"asp_lag2_s{seed}"] = run_one(f"asp_lag2_s{seed}", out,
                                                base + sd + ["asp.mode=asp", "asp.max_lag=2"], args.config)
    finally:
        if not args.analyze_only:
            ray_utils.stop_local_ray()

    s0 = seeds[0]
    order = [f"stock_s{s0}", f"async_lag1_s{s0}", f"asp_lag1_s{s0}", f"asp_lag2_s{s0}"]
    table, _ = compare_runs([out / name for name in order])
    result: Dict[str, Any] = {"table": table, "seconds": time.time() - t0}
    stock = runs[f"stock_s{s0}"]
    result["ratios"] = {
        name: {"e2e_tps_vs_stock": runs[name]["throughput/e2e_tps"] / stock["throughput/e2e_tps"],
               "iteration_time_vs_stock": runs[name]["time/iteration"] / stock["time/iteration"]}
        for name in order}
    # paired over seeds (same prompts and seeds per pair): mean and std of the ratios against stock
    result["ratios_over_seeds"] = {}
    for kind in ("async_lag1", "asp_lag1", "asp_lag2"):
        tps = [runs[f"{kind}_s{s}"]["throughput/e2e_tps"] / runs[f"stock_s{s}"]["throughput/e2e_tps"]
               for s in seeds if f"{kind}_s{s}" in runs]
        it = [runs[f"stock_s{s}"]["time/iteration"] / runs[f"{kind}_s{s}"]["time/iteration"]
              for s in seeds if f"{kind}_s{s}" in runs]
        result["ratios_over_seeds"][kind] = {
            "seeds": len(tps), "e2e_tps_x_mean": float(np.mean(tps)), "e2e_tps_x_std": float(np.std(tps)),
            "iteration_speedup_x_mean": float(np.mean(it)), "iteration_speedup_x_std": float(np.std(it))}
    result["bubbles"] = {name: {k: runs[name][k] for k in ("bubble/padding", "bubble/padding_basis",
                                                           "bubble/skewness", "bubble/sorting")}
                         for name in order}
    result["lag"] = {name: {"hist": runs[name]["lag/hist"], "mean": runs[name]["lag/mean"],
                            "max": runs[name]["lag/max"]} for name in order}
    # convergence over seeds
    conv: Dict[str, Any] = {}
    for kind in ("stock", "asp_lag1", "asp_lag2"):
        finals = [runs[f"{kind}_s{s}"]["reward/final"] for s in seeds]
        conv[kind] = {"final_mean": float(np.mean(finals)), "final_std": float(np.std(finals, ddof=1))
                      if len(finals) > 1 else 0.0, "finals": finals,
                      "curves": {str(s): reward_curve(out / f"{kind}_s{s}") for s in seeds}}
    result["convergence"] = conv
    # length bias
    Ls, La = trained_lengths(out / f"stock_s{s0}"), trained_lengths(out / f"asp_lag1_s{s0}")
    ks = ks_2samp(Ls, La)
    result["length_bias"] = {"stock_mean": float(Ls.mean()), "asp_mean": float(La.mean()),
                             "ks_distance": float(ks.statistic), "ks_pvalue": float(ks.pvalue)}
    result["weight_sync_s_per_round"] = {name: runs[name]["weight_sync/mean_s"] for name in order}
    result["peak_memory_gib"] = {name: runs[name]["memory/peak_rss_gib"] for name in order}
    if not args.skip_sim:
        try:
            result["simulator"] = simulate_prediction(out / f"stock_s{s0}", stock)
        except Exception as exc:  # noqa: BLE001 - reported, not hidden
            result["simulator"] = {"error": f"{type(exc).__name__}: {exc}"}
    from mindspeed_asp.runtime.run_plots import plot_reward_curves

    plot_reward_curves({f"{k} seed {s}": c for k, v in conv.items() for s, c in v["curves"].items()},
                       out / "reward_curves.png", xlabel="update (same trained samples per update)")
    for path in [out / "bench_runtime.json"] + ([args.json] if args.json else []):
        write_results(path, result, __file__, argv)
    print(table)
    print(json.dumps({k: v for k, v in result.items() if k not in ("table", "convergence")}, indent=2, default=float))
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "curves"} for k, v in conv.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
