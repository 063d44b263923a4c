"""Robustness benchmark: is ASP ever behind a simple baseline on workload kinds it has not seen?

Run from the repository root:

    .venv/bin/python benchmarks/bench_robustness.py                 # full matrix, seeds 0-2
    .venv/bin/python benchmarks/bench_robustness.py --quick         # smoke run (tiny workloads, one seed)

Workloads: the synthetic generator's four kinds (workloads/synthetic.py): long_cot (bimodal correct/wrong
lengths, 16k cap with a truncation spike, drifting down), chat, summarisation and tiny_decode. Regimes: rho 0.3,
1, 1.5 (train time / R_LB) x max_lag 1, 2, K-1 (K = minibatches per window: the stock pipeline's own
staleness), 8 instances x 64 slots, history estimates, streaming planners with work stealing (the runtime's
default), the stock pipeline (`stock@stock`: synchronous, never stealing) beside them. Every planner of a
(kind, seed) sees the same workload, estimate and trainer; runs of one regime are interleaved seed by seed.

Criteria (printed with PASS/FAIL and counts; computed from the simulated means over seeds, never tuned):
1. oracle ASP (true lengths) <= the best baseline (every baseline, oracle versions and the stock pipeline
   included) in every regime;
2. ASP with estimates within 2% of the best non-oracle baseline in >= 90% of regimes;
3. ASP's rollout makespan with estimates <= 15% above the (tightened) R_LB of sim.bounds: rollout only, as
   bench_schedulers' first table (barrier mode, no lag gate, stealing on), per kind;
4. KV-bound cluster case (8 x 256 slots, 600,000 KV tokens per instance, long_cot, rho_stock 0.1/0.3/0.5 =
   train time over stock's rollout, max_lag 1/2/K-1): ASP's e2e_tps >= least-loaded async dispatch with no
   plan (the runtime's async mode: one FIFO in dataset order), wherever the KV budget binds (preemptions in
   any run), with the preemptions of each; and, stricter, >= the better of async and the least_loaded
   planner's plan (its offline replay of least-loaded dispatch on predicted lengths, pinned, streaming with
   stealing);
and, per regime, the planner's predicted e2e (its own scoring of the chosen plan) against the simulated one.

Resumable: every finished (kind, seed) unit is appended to `<out>/progress.jsonl` under a key that includes
the settings; a re-run with the same settings skips it (`--fresh` starts over). `--jobs 2` runs units in
parallel processes. The results JSON (benchmarks/_results.py) feeds docs/benchmarks.md, section
"Does the planner hold up on workloads it was not tuned on?", through benchmarks/render_docs.py.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindspeed_asp.experiments import sweep
from _results import write_results

KINDS = ("long_cot", "chat", "summarisation", "tiny_decode")
RHOS = (0.3, 1.0, 1.5)
LAGS = ("1", "2", "K-1")
# async: the runtime's async mode (dataset order from one FIFO, least-loaded, no plan); shared_desc: online LPT
NON_ORACLE = ("sorted_desc", "lpt", "verl_kk", "round_robin", "sorted_asc", "least_loaded", "shared_desc", "stock",
              "async")
ORACLE_BASELINES = ("oracle_lpt", "oracle_verl_kk")
STOCK = "stock@stock"  # the stock pipeline: stock planner, synchronous barrier mode, no stealing
STREAM_PLANNERS = ("asp", "oracle_asp") + tuple(p for p in NON_ORACLE if p != "async") + ORACLE_BASELINES
KV_RHO_STOCK = (0.1, 0.3, 0.5)
KV_PER_SLOT = 600_000 / 256  # the KV-bound cluster case: 600k KV tokens for 256 slots per instance
ROLLOUT_RHO, ROLLOUT_MAX_LAG = 0.1, 10 ** 6  # rollout only (bench_schedulers' first table)
KEEP = ("time/iteration", "throughput/e2e_tps", "time/rollout", "above:time/rollout", "above:rollout/makespan_busy",
        "bound:rollout/R_LB", "rollout/preemptions", "rollout/steals", "lag/max", "plan_seconds", "rho", "rho_stock")


@dataclass(frozen=True)
class Settings:
    """Everything a unit's figures depend on (its cache key)."""

    prompts: int = 512
    n: int = 8
    instances: int = 8
    slots: int = 64
    minibatch: int = 32
    kinds: Tuple[str, ...] = KINDS
    rhos: Tuple[float, ...] = RHOS
    lags: Tuple[str, ...] = LAGS
    kv_instances: int = 8
    kv_slots: int = 256
    kv_prompts: int = 512
    kv_rho_stock: Tuple[float, ...] = KV_RHO_STOCK

    def spec(self, kind: str, prompts: Optional[int] = None) -> str:
        return f"synthetic:mode={kind},prompts={prompts or self.prompts},n={self.n}"

    def key(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


QUICK = Settings(prompts=32, n=4, instances=2, slots=8, minibatch=4, kinds=("long_cot", "tiny_decode"),
                 rhos=(1.0,), lags=("1", "K-1"), kv_instances=2, kv_slots=16, kv_prompts=32, kv_rho_stock=(0.3,))


def lag_value(label: str, groups: int, minibatch: int) -> int:
    k = -(-groups // minibatch)
    return max(1, k - 1) if label == "K-1" else int(label)


def _keep(res) -> Dict[str, Any]:
    m = sweep.mean_metrics([res])
    out = {k: m.get(k, float("nan")) for k in KEEP}
    pp = res.params.get("planner_params", {})
    for k in ("pred_e2e_mean", "pred_rollout_mean", "pred_preemptions", "selection_scope", "selection"):
        if k in pp:
            out[f"planner:{k}"] = pp[k]
    return out


def run_unit(kind: str, seed: int, s: Settings) -> Dict[str, Any]:
    """One workload kind on one seed: every regime x planner, and the rollout-only ASP run."""
    spec = s.spec(kind)
    base = sweep.SweepConfig(instances=s.instances, slots=s.slots, minibatch=s.minibatch)
    wb = sweep.prepare(spec, base, seed)
    G = len(wb.workload.prompts)
    out: Dict[str, Any] = {"kind": kind, "seed": seed, "groups": G, "regimes": {}}
    for rho in s.rhos:
        for lag in s.lags:
            cfg = replace(base, rho=rho, max_lag=lag_value(lag, G, s.minibatch))
            runs = {p: _keep(sweep.run_planner(wb, p, "stream", cfg)[0]) for p in STREAM_PLANNERS}
            runs["async"] = _async(wb, cfg)
            runs[STOCK] = _keep(sweep.run_planner(wb, "stock", "stock", cfg)[0])  # never steals (sweep.steals)
            out["regimes"][f"rho={rho}/lag={lag}"] = {"rho": rho, "lag": lag, "max_lag": cfg.max_lag, "runs": runs}
    roll = replace(base, rho=ROLLOUT_RHO, max_lag=ROLLOUT_MAX_LAG, work_stealing=True)
    out["rollout_only"] = {p: _keep(sweep.run_planner(wb, p, "stock", roll)[0]) for p in ("asp", "oracle_asp")}
    return out


def _async(wb: Any, cfg: Any) -> Dict[str, float]:
    """The runtime's async mode: dataset order from one FIFO, each group to the least-loaded instance."""
    return _keep(sweep.run_planner(wb, "stock", "stream", cfg, dispatch="fifo")[0])


def run_kv_unit(seed: int, s: Settings) -> Dict[str, Any]:
    """The KV-bound cluster case on one seed: ASP vs the two least-loaded dispatches (async's FIFO, and the
    least_loaded planner's plan with stealing)."""
    spec = s.spec("long_cot", s.kv_prompts)
    base = sweep.SweepConfig(instances=s.kv_instances, slots=s.kv_slots, minibatch=s.minibatch,
                             kv_budget=int(round(KV_PER_SLOT * s.kv_slots)))
    wb = sweep.prepare(spec, base, seed)
    G = len(wb.workload.prompts)
    out: Dict[str, Any] = {"kind": "kv", "seed": seed, "groups": G, "kv_budget": base.kv_budget, "regimes": {}}
    for rs in s.kv_rho_stock:
        for lag in s.lags:
            cfg = replace(base, rho_stock=rs, max_lag=lag_value(lag, G, s.minibatch))
            runs = {p: _keep(sweep.run_planner(wb, p, "stream", cfg)[0]) for p in ("asp", "least_loaded")}
            runs["async"] = _async(wb, cfg)
            out["regimes"][f"rho_stock={rs}/lag={lag}"] = {"rho_stock": rs, "lag": lag, "max_lag": cfg.max_lag,
                                                          "runs": runs}
    return out


def _unit(task: Tuple[str, int, Settings]) -> Tuple[str, Dict[str, Any]]:
    kind, seed, s = task
    t0 = time.perf_counter()
    res = run_kv_unit(seed, s) if kind == "kv" else run_unit(kind, seed, s)
    res["seconds"] = time.perf_counter() - t0
    return f"{kind}/{seed}", res


# ------------------------------------------------------------------------------------------------ criteria
def _mean(units: Sequence[Dict[str, Any]], regime: str, planner: str, key: str) -> float:
    vals = [u["regimes"][regime]["runs"][planner][key] for u in units]
    return float(np.mean(vals))


def summarize(units: Dict[str, Dict[str, Any]], s: Settings, seeds: Sequence[int]) -> Dict[str, Any]:
    """Per-regime verdicts and criteria counts, from the simulated means over seeds."""
    regimes: List[Dict[str, Any]] = []
    rollout: Dict[str, Any] = {}
    for kind in s.kinds:
        us = [units[f"{kind}/{sd}"] for sd in seeds]
        for key, reg in us[0]["regimes"].items():
            t = {p: _mean(us, key, p, "time/iteration") for p in reg["runs"]}
            baselines = {p: v for p, v in t.items() if p not in ("asp", "oracle_asp")}
            non_oracle = {p: baselines[p] for p in NON_ORACLE + (STOCK,)}
            best = min(baselines, key=baselines.get)
            best_no = min(non_oracle, key=non_oracle.get)
            pred = [u["regimes"][key]["runs"]["asp"].get("planner:pred_e2e_mean", float("nan")) for u in us]
            sim = [u["regimes"][key]["runs"]["asp"]["time/iteration"] for u in us]
            regimes.append({
                "kind": kind, "rho": reg["rho"], "lag": reg["lag"], "max_lag": reg["max_lag"], "time": t,
                "best_baseline": best, "best_baseline_s": baselines[best],
                "best_non_oracle": best_no, "best_non_oracle_s": non_oracle[best_no],
                "asp_s": t["asp"], "oracle_asp_s": t["oracle_asp"], "stock_s": t[STOCK],
                "oracle_vs_best": t["oracle_asp"] / baselines[best] - 1.0,
                "asp_vs_best_non_oracle": t["asp"] / non_oracle[best_no] - 1.0,
                "oracle_ok": bool(t["oracle_asp"] <= baselines[best] * (1 + 1e-9)),
                "asp_ok": bool(t["asp"] <= 1.02 * non_oracle[best_no]),
                "asp_pred_e2e_s": float(np.mean(pred)), "asp_pred_over_sim": float(np.mean(np.divide(pred, sim))),
                "asp_rollout_above_rlb_pct": _mean(us, key, "asp", "above:time/rollout"),
                "oracle_per_seed_wins": int(sum(
                    u["regimes"][key]["runs"]["oracle_asp"]["time/iteration"]
                    <= min(r["time/iteration"] for p, r in u["regimes"][key]["runs"].items()
                           if p not in ("asp", "oracle_asp")) * (1 + 1e-9) for u in us)),
            })
        above = [u["rollout_only"]["asp"]["above:time/rollout"] for u in us]
        rollout[kind] = {"asp_above_pct": float(np.mean(above)), "asp_above_pct_max": float(np.max(above)),
                         "oracle_above_pct": float(np.mean([u["rollout_only"]["oracle_asp"]["above:time/rollout"]
                                                            for u in us])),
                         "r_lb_s": float(np.mean([u["rollout_only"]["asp"]["bound:rollout/R_LB"] for u in us])),
                         "ok": bool(np.mean(above) <= 15.0)}
    kv: List[Dict[str, Any]] = []
    kus = [units[f"kv/{sd}"] for sd in seeds]
    for key, reg in kus[0]["regimes"].items():
        a_tps = _mean(kus, key, "asp", "throughput/e2e_tps")
        l_tps = _mean(kus, key, "least_loaded", "throughput/e2e_tps")
        f_tps = _mean(kus, key, "async", "throughput/e2e_tps")
        a_pre, l_pre, f_pre = (_mean(kus, key, p, "rollout/preemptions") for p in ("asp", "least_loaded", "async"))
        binds = bool(a_pre > 0 or l_pre > 0 or f_pre > 0)
        ref = max(l_tps, f_tps)
        kv.append({"rho_stock": reg["rho_stock"], "lag": reg["lag"], "max_lag": reg["max_lag"],
                   "asp_e2e_tps": a_tps, "least_loaded_e2e_tps": l_tps, "async_e2e_tps": f_tps,
                   "ratio": a_tps / ref, "ratio_async": a_tps / f_tps, "ratio_least_loaded": a_tps / l_tps,
                   "asp_preemptions": a_pre, "least_loaded_preemptions": l_pre, "async_preemptions": f_pre,
                   "binds": binds, "asp_s": _mean(kus, key, "asp", "time/iteration"),
                   "least_loaded_s": _mean(kus, key, "least_loaded", "time/iteration"),
                   "async_s": _mean(kus, key, "async", "time/iteration"),
                   "ok_async": bool(a_tps >= f_tps or not binds), "ok": bool(a_tps >= ref or not binds)})
    n = len(regimes)
    n_or = sum(r["oracle_ok"] for r in regimes)
    n_asp = sum(r["asp_ok"] for r in regimes)
    n_roll = sum(v["ok"] for v in rollout.values())
    kv_b = [k for k in kv if k["binds"]]
    n_kv = sum(k["ok"] for k in kv_b)
    n_kv_async = sum(k["ok_async"] for k in kv_b)
    criteria = {
        "oracle_le_best": {"text": "oracle ASP <= best baseline in every regime", "met": n_or, "of": n,
                           "pass": n_or == n},
        "asp_within_2pct": {"text": "ASP (estimates) within 2% of the best non-oracle baseline in >= 90% of "
                                    "regimes", "met": n_asp, "of": n, "share": n_asp / n if n else 0.0,
                            "pass": n > 0 and n_asp / n >= 0.9},
        "rollout_within_15pct": {"text": "ASP rollout makespan (estimates) <= 15% above the tightened R_LB",
                                 "met": n_roll, "of": len(rollout), "pass": n_roll == len(rollout)},
        "kv_asp_ge_async": {"text": "ASP e2e_tps >= least-loaded async dispatch with no plan (the runtime's "
                                    "async mode) wherever the KV budget binds (the KV criterion)",
                            "met": n_kv_async, "of": len(kv_b), "pass": bool(kv_b) and n_kv_async == len(kv_b)},
        "kv_asp_ge_least_loaded": {"text": "stricter: ASP e2e_tps >= the better least-loaded dispatch (async, or "
                                           "the least_loaded planner's offline replay of it, pinned, with "
                                           "stealing) wherever the KV budget binds",
                                   "met": n_kv, "of": len(kv_b), "pass": bool(kv_b) and n_kv == len(kv_b)},
    }
    return {"regimes": regimes, "rollout_only": rollout, "kv": kv, "criteria": criteria}


def report_lines(summary: Dict[str, Any]) -> List[str]:
    lines = [f"{'kind':14s} {'rho':>4s} {'lag':>4s} {'best baseline':>24s} {'oracle ASP vs best':>18s} "
             f"{'ASP vs best non-oracle':>24s} {'ASP pred/sim':>12s}"]
    for r in summary["regimes"]:
        lines.append(f"{r['kind']:14s} {r['rho']:>4} {r['lag']:>4s} "
                     f"{r['best_baseline'] + ' ' + format(r['best_baseline_s'], '.1f'):>24s} "
                     f"{100 * r['oracle_vs_best']:+17.1f}% {'' if r['oracle_ok'] else '!'}"
                     f"{r['best_non_oracle'] + ' ' + format(100 * r['asp_vs_best_non_oracle'], '+.1f') + '%':>23s}"
                     f"{'' if r['asp_ok'] else '!'} {r['asp_pred_over_sim']:12.2f}")
    for k, v in summary["rollout_only"].items():
        lines.append(f"rollout only {k}: ASP {v['asp_above_pct']:.1f}% above R_LB (max seed "
                     f"{v['asp_above_pct_max']:.1f}%), oracle ASP {v['oracle_above_pct']:.1f}%")
    for k in summary["kv"]:
        lines.append(f"KV rho_stock={k['rho_stock']} lag={k['lag']}: ASP e2e_tps {k['ratio_async']:.3f}x async, "
                     f"{k['ratio_least_loaded']:.3f}x least_loaded; preemptions {k['asp_preemptions']:.0f} vs "
                     f"{k['async_preemptions']:.0f} / {k['least_loaded_preemptions']:.0f}"
                     f"{'' if k['binds'] else ' (budget does not bind)'}")
    for name, c in summary["criteria"].items():
        lines.append(f"{'PASS' if c['pass'] else 'FAIL'} {name}: {c['text']}: {c['met']} of {c['of']}")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="results JSON (default benchmarks/results/robustness.json; "
                    "--quick: a file in the progress directory)")
    ap.add_argument("--progress-dir", default=None, help="where progress.jsonl lives (default: next to --out)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--jobs", type=int, default=1, help="units run in parallel processes")
    ap.add_argument("--quick", action="store_true", help="smoke run: two tiny kinds, one regime pair, one seed")
    ap.add_argument("--fresh", action="store_true", help="ignore progress.jsonl and start over")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    s = QUICK if args.quick else Settings()
    seeds = [0] if args.quick else [int(x) for x in args.seeds.split(",") if x.strip()]
    out = Path(args.out or ("benchmarks/results/robustness.json" if not args.quick else
                            f"{args.progress_dir or '/tmp/bench_robustness_quick'}/robustness.json"))
    prog_dir = Path(args.progress_dir) if args.progress_dir else out.parent
    prog_dir.mkdir(parents=True, exist_ok=True)
    progress = prog_dir / f"progress_{'quick_' if args.quick else ''}{s.key()}.jsonl"
    done: Dict[str, Dict[str, Any]] = {}
    if progress.is_file() and not args.fresh:
        for line in progress.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                done[rec["unit"]] = rec["result"]
    tasks = [(kind, sd, s) for sd in seeds for kind in s.kinds + ("kv",) if f"{kind}/{sd}" not in done]
    t0 = time.time()
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    say(f"bench_robustness: {len(tasks)} unit(s) to run, {len(done)} done already ({progress})")

    def record(unit: str, res: Dict[str, Any]) -> None:
        done[unit] = res
        with progress.open("a") as fh:
            fh.write(json.dumps({"unit": unit, "result": res}, default=float) + "\n")
        say(f"  {unit} done in {res['seconds']:.0f} s ({time.time() - t0:.0f} s so far)")

    if args.jobs > 1 and len(tasks) > 1:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(args.jobs) as pool:
            for unit, res in pool.imap_unordered(_unit, tasks):
                record(unit, res)
    else:
        for task in tasks:
            record(*_unit(task))
    summary = summarize(done, s, seeds)
    lines = report_lines(summary)
    print("\n".join(lines))
    payload = {"settings": asdict(s), "seeds": seeds, "quick": bool(args.quick),
               "specs": {k: s.spec(k) for k in s.kinds}, "kv_spec": s.spec("long_cot", s.kv_prompts),
               "kv_budget": int(round(KV_PER_SLOT * s.kv_slots)), "planners": list(STREAM_PLANNERS) + [STOCK],
               **summary, "unit_seconds": {u: r["seconds"] for u, r in done.items()},
               "units": done, "seconds": time.time() - t0}
    write_results(out, payload, __file__, argv)
    say(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
