"""Convergence benchmark: does bounded lag cost learning? Stock, asp and async, standard vs decoupled objective.

Runs the tiny CPU config (real vLLM-CPU instances, the reference GRPO trainer, the demo task) in every mode
of `--runs`, each with every objective of `--objectives`, for every seed, interleaved (for each seed, every
config in turn), so machine noise hits all modes alike. One local Ray serves every run. Reports (stdout,
JSON, plot):

1. reward against updates and against wall time (from the first dispatch), mean and 95% Student-t band
   over seeds;
2. final reward (mean of the last quarter of updates) with its 95% interval, and whether each config lies
   within stock's interval and above 0.9x stock's mean (the targets of docs/trainer.md);
3. updates and seconds to reach `--target` (trailing mean of 3 updates), ratio to stock paired by seed; a
   run that never reaches it counts with its whole length (censored: a lower bound, never a flattering one);
4. length bias: KS distance of trained response lengths against stock's (same seed), next to stock's own
   seed-to-seed KS spread;
5. starvation: the share of generated group attempts discarded as stale (regenerated), by quartile of the
   attempt's mean response length (stock's quartiles), and trained vs generated lengths;
6. learning-rate sensitivity (`--lr-sweep`): stock and asp at other rates, to check the tiny task is a fair
   test of staleness.

    .venv/bin/python benchmarks/bench_convergence.py --seeds 0,1,2,3,4 --out runs/bench_convergence \\
        --json benchmarks/results/convergence.json

A run whose directory already holds a summary.json is read back, not re-run (`--rerun` to force), so an
interrupted benchmark continues where it stopped; `--analyze-only` only reads.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from _results import write_results

#: run kinds -> overrides of the tiny config
RUN_KINDS: Dict[str, List[str]] = {
    "stock": ["asp.mode=stock", "asp.max_lag=0"],  # stock trains at lag 0 only (a nonzero asp.max_lag is refused)
    "asp_lag0": ["asp.mode=asp", "asp.max_lag=0"],
    "asp_lag1": ["asp.mode=asp", "asp.max_lag=1"],
    "asp_lag2": ["asp.mode=asp", "asp.max_lag=2"],
    "async_lag1": ["asp.mode=async", "asp.max_lag=1"],
}
OBJECTIVE_TAG = {"standard": "std", "decoupled": "dec"}
#: kinds where every sample is trained at lag 0: every token is current, so the decoupled loss IS the standard
#: loss (tests/runtime/test_grpo.py checks it bit for bit); they run once, under the standard objective, unless
#: --lag0-both asks for the (identical-math) decoupled run too.
LAG0_KINDS = ("stock", "asp_lag0")


def config_name(kind: str, objective: str, lr: Optional[float]) -> str:
    return f"{kind}_{OBJECTIVE_TAG[objective]}" + ("" if lr is None else f"_lr{lr:g}")


def read_run(run_dir: Path) -> Dict[str, Any]:
    """The per-update rows and per-group records the analysis needs, from a finished run directory."""
    summary = json.loads((run_dir / "summary.json").read_text())
    trace = json.loads((run_dir / "trace.json").read_text())
    steps = [s for s in trace["steps"] if "reward/mean" in s]
    first = min(g["submit"] for g in trace["groups"])
    return {
        "summary": summary,
        "rewards": [float(s["reward/mean"]) for s in steps],
        "t": [float(s["t_end"] - first) for s in steps],
        "trained_lengths": [L for g in trace["groups"] if g["trained"] for L in g["sample_lengths"]],
        "attempts": [(g["gid"], g["submit"], bool(g["trained"]), g["sample_lengths"]) for g in trace["groups"]],
    }


def run_or_read(name: str, out: Path, overrides: List[str], config: Optional[str], rerun: bool,
                analyze_only: bool) -> Optional[Dict[str, Any]]:
    run_dir = out / name
    if (run_dir / "summary.json").is_file() and not rerun:
        return read_run(run_dir)
    if analyze_only:
        return None
    from mindspeed_asp.commands.train import build_config
    from mindspeed_asp.runtime.driver import run_training

    cfg = build_config(config, overrides, None, str(run_dir))
    print(f"== {name}: {' '.join(overrides)}", file=sys.stderr, flush=True)
    t0 = time.time()
    try:
        run_training(cfg, run_dir, progress=False)
    except Exception as exc:  # noqa: BLE001 - one failed run must not lose the others; it is reported
        print(f"!! {name} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return None
    print(f"   {name} done in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    return read_run(run_dir)


def band(curves: Sequence[Sequence[float]]) -> Dict[str, List[float]]:
    """Per-update mean and 95% interval over seeds (curves truncated to the shortest)."""
    from mindspeed_asp.core.learning import mean_interval

    n = min(len(c) for c in curves)
    cols = [mean_interval([c[i] for c in curves]) for i in range(n)]
    return {"mean": [c[0] for c in cols], "lo": [c[1] for c in cols], "hi": [c[2] for c in cols]}


def time_band(runs: Sequence[Dict[str, Any]], grid: np.ndarray) -> Dict[str, List[float]]:
    """Smoothed reward against wall time: each seed's trailing mean held between its updates, up to its end."""
    from mindspeed_asp.core.learning import mean_interval, smoothed

    rows = []
    for r in runs:
        s = smoothed(r["rewards"])
        idx = np.searchsorted(np.asarray(r["t"]), grid, side="right") - 1
        end = r["t"][-1]
        rows.append([float(s[i]) if i >= 0 and g <= end else math.nan for i, g in zip(idx, grid)])
    # a point of the band needs most seeds still running (a curve held flat after its run ended would lie)
    need = max(1, (len(rows) + 1) // 2)
    cols = [mean_interval([row[i] for row in rows if not math.isnan(row[i])])
            if sum(not math.isnan(row[i]) for row in rows) >= need else (math.nan,) * 3 for i in range(len(grid))]
    return {"t": grid.tolist(), "mean": [c[0] for c in cols], "lo": [c[1] for c in cols], "hi": [c[2] for c in cols]}


def analyze(results: Dict[str, Dict[int, Dict[str, Any]]], target: float) -> Dict[str, Any]:
    from mindspeed_asp.core.learning import final_reward, ks_distance, length_starvation, mean_interval, \
        seconds_to_target, updates_to_target

    stock_name = next((n for n in results if n.startswith("stock_std") and "_lr" not in n), None)
    stock = results.get(stock_name, {}) if stock_name else {}
    stock_finals = [final_reward(r["rewards"]) for r in stock.values()]
    s_mean, s_lo, s_hi = mean_interval(stock_finals)
    # stock's own seed-to-seed length spread: KS between every pair of stock seeds
    stock_ks = [ks_distance(a["trained_lengths"], b["trained_lengths"])
                for a, b in itertools.combinations(stock.values(), 2)]
    # length quartiles of stock's generated groups: every config's discards are binned on the same edges
    all_gen = [float(np.mean(a[3])) for r in stock.values() for a in r["attempts"] if a[3]]
    edges = np.quantile(all_gen, [0.25, 0.5, 0.75]) if all_gen else None
    t_max = max((r["t"][-1] for runs in results.values() for r in runs.values()), default=0.0)
    grid = np.linspace(0.0, t_max, 60)
    out: Dict[str, Any] = {"target_reward": target, "stock": stock_name,
                           "stock_final": {"mean": s_mean, "lo": s_lo, "hi": s_hi},
                           "stock_ks_seed_spread": {"mean": float(np.mean(stock_ks)) if stock_ks else math.nan,
                                                    "max": float(np.max(stock_ks)) if stock_ks else math.nan},
                           "configs": {}}
    for name, runs in results.items():
        if not runs:
            continue
        seeds = sorted(runs)
        finals = [final_reward(runs[s]["rewards"]) for s in seeds]
        m, lo, hi = mean_interval(finals)
        upd = [updates_to_target(runs[s]["rewards"], target) for s in seeds]
        sec = [seconds_to_target(runs[s]["rewards"], runs[s]["t"], 0.0, target) for s in seeds]

        def censored(r: Dict[str, Any]) -> float:
            """Seconds to the target, or the run's whole length where it was never reached (a lower bound)."""
            x = seconds_to_target(r["rewards"], r["t"], 0.0, target)
            return r["t"][-1] if x is None else x

        paired = [censored(runs[s]) / censored(stock[s]) for s in seeds if s in stock]
        ks = [ks_distance(runs[s]["trained_lengths"], stock[s]["trained_lengths"]) for s in seeds if s in stock]
        run_s = [runs[s]["t"][-1] for s in seeds]
        tps = [runs[s]["summary"].get("throughput/e2e_tps") for s in seeds]
        tps_x = [runs[s]["summary"]["throughput/e2e_tps"] / stock[s]["summary"]["throughput/e2e_tps"]
                 for s in seeds if s in stock]
        cfg = {
            "seeds": seeds,
            "final_reward": {"per_seed": finals, "mean": m, "lo": lo, "hi": hi,
                             "x_stock": m / s_mean if s_mean and not math.isnan(s_mean) else math.nan,
                             "within_stock_interval": bool(s_lo <= m <= s_hi) if not math.isnan(s_lo) else None},
            "updates_to_target": upd,
            "seconds_to_target": sec,
            "seconds_to_target_x_stock": dict(zip(("mean", "lo", "hi"), mean_interval(paired)),
                                              n=len(paired)),
            "reached_target": sum(x is not None for x in upd),
            "run_seconds": dict(zip(("mean", "lo", "hi"), mean_interval(run_s))),
            "e2e_tps": dict(zip(("mean", "lo", "hi"), mean_interval(tps))),
            "e2e_tps_x_stock": dict(zip(("mean", "lo", "hi"), mean_interval(tps_x))),
            "ks_vs_stock": {"per_seed": ks, "mean": float(np.mean(ks)) if ks else math.nan},
            "starvation": length_starvation([((s, a[0]),) + tuple(a[1:]) for s in seeds
                                             for a in runs[s]["attempts"]], edges),
            "offpolicy": {k: float(np.mean([runs[s]["summary"].get(k, math.nan) for s in seeds]))
                          for k in ("offpolicy/iw_mean", "offpolicy/iw_max", "offpolicy/iw_frac_capped",
                                    "offpolicy/clip_frac", "offpolicy/behav_prox_absdiff_mean", "lag/mean",
                                    "lag/token_weighted_mean")},
            "reward_by_update": band([runs[s]["rewards"] for s in seeds]),
            "reward_by_time": time_band([runs[s] for s in seeds], grid),
        }
        out["configs"][name] = cfg
    return out


def print_report(a: Dict[str, Any]) -> str:
    lines = [f"target reward R* = {a['target_reward']:g}; final reward = mean of the last quarter of updates; "
             f"intervals are 95% Student-t over seeds",
             f"stock's seed-to-seed KS of trained lengths: mean {a['stock_ks_seed_spread']['mean']:.3f}, "
             f"max {a['stock_ks_seed_spread']['max']:.3f}", ""]
    hdr = (f"{'config':<24}{'seeds':>5}  {'final reward [95%]':<22}{'x stock':>8}  {'in':>3}  {'reached':>7}  "
           f"{'s to R* x stock [95%]':<22}{'e2e_tps x stock':<18}{'KS':>6}  {'discarded':>9}  "
           f"{'iw capped':>9}  {'clip':>6}")
    lines += [hdr, "-" * len(hdr)]
    for name, c in a["configs"].items():
        f, t, e = c["final_reward"], c["seconds_to_target_x_stock"], c["e2e_tps_x_stock"]
        inside = {True: "yes", False: "no", None: "-"}[f["within_stock_interval"]]
        tt = f"{t['mean']:.2f} [{t['lo']:.2f}, {t['hi']:.2f}]" if t["n"] else "-"
        ee = f"{e['mean']:.2f} [{e['lo']:.2f}, {e['hi']:.2f}]"
        lines.append(f"{name:<24}{len(c['seeds']):>5}  {f['mean']:.3f} [{f['lo']:.3f}, {f['hi']:.3f}]"
                     f"{'':<2}{f['x_stock']:>8.2f}  {inside:>3}  {c['reached_target']:>3}/{len(c['seeds']):<3}  "
                     f"{tt:<22}{ee:<18}{c['ks_vs_stock']['mean']:>6.3f}  "
                     f"{c['starvation']['discarded_share']:>9.3f}  {c['offpolicy']['offpolicy/iw_frac_capped']:>9.3f}  "
                     f"{c['offpolicy']['offpolicy/clip_frac']:>6.3f}")
    lines.append("")
    lines.append("discarded (regenerated or dropped) share of generated groups by length quartile (stock's edges):")
    for name, c in a["configs"].items():
        q = c["starvation"]["discarded_share_by_quartile"]
        lines.append(f"  {name:<24}" + "  ".join(f"Q{i + 1} {x:.3f}" for i, x in enumerate(q))
                     + f"   trained/generated len {c['starvation']['trained_len_mean']:.1f}"
                       f"/{c['starvation']['generated_len_mean']:.1f}, "
                       f"KS {c['starvation']['ks_trained_vs_generated']:.3f}")
    text = "\n".join(lines)
    print(text)
    return text


def plot(a: Dict[str, Any], path: Path) -> None:
    from mindspeed_asp.utils.plotting import pyplot, save_figure

    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    for name, c in a["configs"].items():
        if "_lr" in name:
            continue
        u = c["reward_by_update"]
        x = np.arange(1, len(u["mean"]) + 1)
        line, = ax1.plot(x, u["mean"], label=name)
        ax1.fill_between(x, u["lo"], u["hi"], alpha=0.12, color=line.get_color())
        t = c["reward_by_time"]
        ax2.plot(t["t"], t["mean"], label=name, color=line.get_color())
        ax2.fill_between(t["t"], t["lo"], t["hi"], alpha=0.12, color=line.get_color())
    for ax in (ax1, ax2):
        ax.axhline(a["target_reward"], ls=":", color="grey")
        ax.set_ylabel("reward (mean over the minibatch)")
        ax.grid(alpha=0.3)
    ax1.set_xlabel("update")
    ax2.set_xlabel("seconds from the first dispatch (trailing mean of 3 updates)")
    ax1.set_title("reward vs updates, mean and 95% band over seeds")
    ax2.set_title("reward vs wall time")
    ax1.legend(fontsize=7, ncol=2)
    save_figure(fig, path)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None, help="run config (default: the packaged tiny_cpu.yaml)")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--runs", default=",".join(RUN_KINDS), help=f"run kinds, from {', '.join(RUN_KINDS)}")
    ap.add_argument("--objectives", default="standard,decoupled")
    ap.add_argument("--lr-sweep", default="", help="other learning rates to run (e.g. 0.001,0.01)")
    ap.add_argument("--lr-sweep-runs", default="stock,asp_lag1", help="run kinds of the lr sweep")
    ap.add_argument("--lr-sweep-seeds", default="0,1,2")
    ap.add_argument("--lr-sweep-objective", default="decoupled")
    ap.add_argument("--target", type=float, default=0.2, help="target reward R* for time-to-target")
    ap.add_argument("--out", default="runs/bench_convergence")
    ap.add_argument("--json", default=None, help="write the analysis here")
    ap.add_argument("--plot", default=None, help="reward curves PNG (default: OUT/convergence.png)")
    ap.add_argument("--lag0-both", action="store_true",
                    help="also run stock and asp_lag0 with the decoupled objective (the same loss at lag 0)")
    ap.add_argument("--rerun", action="store_true", help="re-run configs whose run directory exists")
    ap.add_argument("--analyze-only", action="store_true")
    ap.add_argument("--note", default=None, help="a remark printed with the results (how the runs were made)")
    ap.add_argument("overrides", nargs="*", help="config overrides applied to every run")
    args = ap.parse_args(argv)

    kinds = [k for k in args.runs.split(",") if k]
    unknown = [k for k in kinds + [k for k in args.lr_sweep_runs.split(",") if k] if k not in RUN_KINDS]
    if unknown:
        ap.error(f"--runs: unknown run kind(s) {unknown}; choose from {list(RUN_KINDS)}")
    objectives = [o for o in args.objectives.split(",") if o]
    if any(o not in OBJECTIVE_TAG for o in objectives + [args.lr_sweep_objective]):
        ap.error(f"--objectives: choose from {list(OBJECTIVE_TAG)}")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    lr_seeds = [int(s) for s in args.lr_sweep_seeds.split(",") if s.strip()]
    lrs = [float(x) for x in args.lr_sweep.split(",") if x.strip()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # (seed, name, overrides), interleaved: every config of a seed before the next seed
    plan = []
    for seed in seeds:
        for kind in kinds:
            for obj in objectives:
                if kind in LAG0_KINDS and obj != "standard" and not args.lag0_both:
                    continue
                plan.append((seed, config_name(kind, obj, None), RUN_KINDS[kind] + [f"trainer.objective={obj}"]))
    for seed in lr_seeds:
        for lr in lrs:
            for kind in [k for k in args.lr_sweep_runs.split(",") if k]:
                obj = args.lr_sweep_objective
                plan.append((seed, config_name(kind, obj, lr),
                             RUN_KINDS[kind] + [f"trainer.objective={obj}", f"trainer.lr={lr}"]))
    results: Dict[str, Dict[int, Dict[str, Any]]] = {name: {} for _, name, _ in plan}
    todo = [p for p in plan if args.rerun or not (out / f"{p[1]}_s{p[0]}" / "summary.json").is_file()]
    print(f"{len(plan)} runs, {len(todo)} to run", file=sys.stderr, flush=True)
    started_ray = False
    t0 = time.time()
    try:
        for i, (seed, name, overrides) in enumerate(plan):
            done = (out / f"{name}_s{seed}" / "summary.json").is_file()
            will_run = not args.analyze_only and (args.rerun or not done)
            if will_run and not started_ray:
                from mindspeed_asp.commands.train import build_config
                from mindspeed_asp.runtime import ray_utils
                from mindspeed_asp.runtime.driver import QUIET_ENV

                base = build_config(args.config, list(args.overrides), None, str(out))
                ray_utils.start_local_ray(num_cpus=base.run.ray_num_cpus,
                                          object_store_mb=base.run.ray_object_store_mb, env=QUIET_ENV,
                                          log_to_driver=False)
                started_ray = True
            if will_run:
                print(f"[{i + 1}/{len(plan)}] {time.time() - t0:.0f} s elapsed", file=sys.stderr, flush=True)
            r = run_or_read(f"{name}_s{seed}", out, list(args.overrides) + overrides
                            + [f"run.seed={seed}", f"data.seed={seed}"], args.config, args.rerun, args.analyze_only)
            if r is not None:
                results[name][seed] = r
    finally:
        if started_ray:
            from mindspeed_asp.runtime import ray_utils

            ray_utils.stop_local_ray()
    a = analyze({k: v for k, v in results.items() if v}, args.target)
    a["report"] = print_report(a)
    if args.note:
        a["note"] = args.note
    plot(a, Path(args.plot) if args.plot else out / "convergence.png")
    if args.json:
        # the command that produced the runs: an --analyze-only re-read names the same runs
        given = list(argv if argv is not None else sys.argv[1:])
        if "--note" in given:  # the note describes the command; it is not part of it
            del given[given.index("--note"):given.index("--note") + 2]
        argv_used = [x for x in given if x != "--analyze-only"]
        write_results(args.json, a, __file__, argv_used, indent=1)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
