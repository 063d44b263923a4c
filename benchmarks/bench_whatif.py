"""The paper's setting in the cluster model, the five configs' splits, the sensitivity of the answer, and the
model against real CPU runs (docs/simulator.md, "Cluster model").

    python benchmarks/bench_whatif.py --seeds 0,1,2 --json benchmarks/results/whatif.json \
        --runs runs/whatif_validation

1. Paper setting: Qwen2.5-7B on 16 A3 devices (TP1) and Qwen2.5-32B on 32 (TP2), batch, n and slots of
   configs/qwen25_7b_A3_asp.yaml and configs/qwen25_32b_A3_asp.yaml, long-CoT lengths (synthetic mode=long_cot:
   median ~2k, 16k cap), six windows per run, several workload seeds. Colocated stock vs the best split of async
   and of asp at max_lag 1, 2 and 4; the ratio of steady-state e2e_tps (all devices) over colocated stock,
   mean and range over the seeds. asp is swept with the planner's fast search and its best split per max_lag
   re-simulated under the full search (the higher is reported, and which).
2. The five configs: the best split at the config's max_lag under its own lengths (n, max_tokens, median
   cap/4) and the share of it the config's split reaches.
3. Sensitivity (seed 0; every assumption for 7B, the decisive ones for 32B): the best ratio per max_lag when
   one assumption changes; what must hold for the paper's 3.22x.
4. Validation: each run directory under --runs (stock, async, asp of the CPU runtime, `asp train`) predicted by
   the cluster model configured as that run (its instances, 1 trainer device, the decode cost fitted from its
   own engine_steps.jsonl, its measured update and sync times, its generated lengths): run time and e2e_tps,
   error per mode.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_results  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PAPER = (("qwen25_7b", "configs/qwen25_7b_A3_asp.yaml"), ("qwen25_32b", "configs/qwen25_32b_A3_asp.yaml"))
CONFIGS = ("qwen25_7b_A3_asp", "qwen25_32b_A3_asp", "qwen25_32b_A2_asp", "qwen3_8b_A3_asp",
           "qwen3_30b_a3b_dapo_A3_asp")
LAGS = (1, 2, 4)
PAPER_RATIO = 3.22
WINDOWS = 6


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _best(rows: Sequence[Dict[str, Any]], mode: str, lag: int) -> Optional[Dict[str, Any]]:
    cands = [r for r in rows if r["mode"] == mode and int(r["max_lag"]) == lag]
    return max(cands, key=lambda r: float(r["e2e_tps"])) if cands else None


def _stats(vals: Sequence[float]) -> Dict[str, float]:
    a = np.asarray(vals, dtype=np.float64)
    return {"mean": float(a.mean()), "min": float(a.min()), "max": float(a.max()), "n": int(len(a))}


def paper_setting(seeds: Sequence[int], refine: bool) -> Dict[str, Any]:
    from mindspeed_asp.experiments import whatif as wi

    out: Dict[str, Any] = {}
    for model, cfg in PAPER:
        s = wi.setting_from_config(str(REPO / cfg))
        per_seed = []
        for seed in seeds:
            spec = f"synthetic:mode=long_cot,n={s.n},seed={seed}"
            wins = wi.make_windows(spec, s, WINDOWS)
            t0 = time.perf_counter()
            rows = wi.sweep(s, wins, ["stock", "async", "asp"], LAGS, refine=refine)
            _say(f"paper {model} seed {seed}: {len(rows)} configurations in {time.perf_counter() - t0:.0f} s")
            stock = next(r for r in rows if r["mode"] == "colocated")
            entry: Dict[str, Any] = {"seed": seed, "stock": stock, "best": {}}
            for mode in ("async", "asp"):
                for lag in LAGS:
                    b = _best(rows, mode, lag)
                    entry["best"][f"{mode}@{lag}"] = dict(b, ratio=float(b["e2e_tps"]) / float(stock["e2e_tps"]))
            entry["rows"] = rows
            per_seed.append(entry)
        summary: Dict[str, Any] = {}
        for key in per_seed[0]["best"]:
            ratios = [e["best"][key]["ratio"] for e in per_seed]
            splits = [int(e["best"][key]["rollout_devices"]) for e in per_seed]
            summary[key] = {"ratio": _stats(ratios), "rollout_devices": splits,
                            "e2e_tps": _stats([e["best"][key]["e2e_tps"] for e in per_seed]),
                            "search": [e["best"][key].get("asp_search", "") for e in per_seed]}
        out[model] = {"config": cfg, "setting": wi.setting_json(s), "assumptions": wi.assumptions(s),
                      "workload": "synthetic:mode=long_cot,n=%d,seed=<seed>" % s.n, "windows": WINDOWS,
                      "stock_e2e_tps": _stats([e["stock"]["e2e_tps"] for e in per_seed]),
                      "stock_window_s": _stats([e["stock"]["window_s"] for e in per_seed]),
                      "summary": summary, "per_seed": per_seed}
    return out


def config_splits() -> Dict[str, Any]:
    from mindspeed_asp.experiments import whatif as wi

    out: Dict[str, Any] = {}
    for name in CONFIGS:
        s = wi.setting_from_config(str(REPO / "configs" / f"{name}.yaml"))
        lag = max(1, int(s.config_split["max_lag"]))
        lags = sorted({lag, 1, 2})
        spec = wi.default_workload(s, WINDOWS)
        wins = wi.make_windows(spec, s, WINDOWS)
        t0 = time.perf_counter()
        rows = wi.sweep(s, wins, ["stock", "async", "asp"], lags, refine=False)
        _say(f"config {name}: {len(rows)} configurations in {time.perf_counter() - t0:.0f} s")
        summ = wi.summarize(s, rows, lags)
        stock = next(r for r in rows if r["mode"] == "colocated")
        best = {str(b["bound"]): {"rollout_devices": b["best"]["rollout_devices"], "mode": b["best"]["mode"],
                                  "max_lag": b["best"]["max_lag"], "e2e_tps": b["best"]["e2e_tps"],
                                  "speedup": b["speedup_vs_colocated"]} for b in summ["best_per_bound"]}
        out[name] = {"workload": spec, "devices": s.devices, "tp": s.tp, "config_split": s.config_split,
                     "stock_e2e_tps": stock["e2e_tps"], "best": best, "config_check": summ.get("config_split")}
    return out


def sensitivity() -> Dict[str, Any]:
    from dataclasses import replace

    from mindspeed_asp.experiments import whatif as wi

    plan = {PAPER[0][0]: ("baseline", "trainer 2x slower", "trainer 2x faster", "no extra forward passes",
                          "colocated KV as large as a split's (mem_util 0.9)", "colocated switch free",
                          "weight sync free", "config lengths (max_tokens cap, median cap/4)"),
            PAPER[1][0]: ("baseline", "trainer 2x slower", "colocated KV as large as a split's (mem_util 0.9)")}
    out: Dict[str, Any] = {}
    for model, cfg in PAPER:
        s0 = wi.setting_from_config(str(REPO / cfg))
        tok = 1.0 / s0.preset.train_tokens_per_s
        change = {"baseline": {}, "trainer 2x slower": {"train_sec_per_token": 2 * tok},
                  "trainer 2x faster": {"train_sec_per_token": 0.5 * tok}, "no extra forward passes":
                  {"extra_passes": 0.0}, "colocated KV as large as a split's (mem_util 0.9)":
                  {"mem_util_colocated": 0.9}, "colocated switch free": {"switch_s": 0.0},
                  "weight sync free": {"sync_s": 0.0}, "config lengths (max_tokens cap, median cap/4)": {}}
        variants = []
        for label in plan[model]:
            s = replace(s0, **change[label])
            spec = wi.default_workload(s, WINDOWS) if label.startswith("config lengths") \
                else f"synthetic:mode=long_cot,n={s.n},seed=0"
            wins = wi.make_windows(spec, s, WINDOWS)
            rows = wi.sweep(s, wins, ["stock", "async", "asp"], LAGS, refine=False)
            summ = wi.summarize(s, rows, LAGS)
            best = {str(b["bound"]): {"ratio": b["speedup_vs_colocated"], "mode": b["best"]["mode"],
                                      "rollout_devices": b["best"]["rollout_devices"]} for b in summ["best_per_bound"]}
            st = summ["colocated"]
            variants.append({"variant": label, "workload": spec, "best": best, "stock_window_s": st["window_s"],
                             "stock_rollout_s": st["rollout_s"], "stock_train_s": st["train_s"],
                             "rho_stock": st["rho_stock"]})
            _say(f"sensitivity {model} {label}: " + ", ".join(f"<= {k}: {v['ratio']:.2f}x" for k, v in best.items()))
        out[model] = {"devices": s0.devices, "variants": variants}
    return out


def conditions_for(paper: Dict[str, Any], sens: Dict[str, Any]) -> List[str]:
    """What must hold for the paper's 3.22x, read off the measured tables (no number typed in)."""
    lines = []
    for model, d in paper.items():
        reach = [(lag, d["summary"][f"asp@{lag}"]["ratio"]) for lag in LAGS]
        ok = [lag for lag, r in reach if r["min"] >= PAPER_RATIO]
        lines.append(f"{model}: asp reaches {PAPER_RATIO}x over colocated stock on every seed at max_lag "
                     + (f"{ok[0]}" if ok else "none of " + "/".join(map(str, LAGS)))
                     + " (mean ratio " + ", ".join(f"{r['mean']:.2f}x at {lag}" for lag, r in reach) + ")")
    for model, m in sens.items():
        for v in m["variants"]:
            hit = [k for k, b in v["best"].items() if b["ratio"] >= PAPER_RATIO]
            lines.append(f"{model} with {v['variant']}: >= {PAPER_RATIO}x at max_lag "
                         + (f"<= {min(map(int, hit))}" if hit else "none of 1/2/4")
                         + " (" + ", ".join(f"{b['ratio']:.2f}x at <= {k}" for k, b in v["best"].items()) + ")")
    return lines


# ---------------------------------------------------------------- validation against CPU runs
def _fit_trainer(steps: List[Dict[str, Any]]) -> Dict[str, float]:
    """Per-update time = alpha * tokens + overhead, least squares (non-negative), from the run's steps."""
    from scipy.optimize import nnls

    tok = np.array([float(r.get("tokens/trained", 0)) for r in steps if "time/train" in r])
    t = np.array([float(r["time/train"]) for r in steps if "time/train" in r])
    X = np.stack([tok, np.ones_like(tok)], axis=1)
    scale = np.maximum(np.abs(X).max(axis=0), 1e-12)
    coef, _ = nnls(X / scale, t)
    coef = coef / scale
    return {"alpha": float(coef[0]), "overhead": float(coef[1])}


def predict_run(run_dir: Path, cost_from: Optional[Path] = None) -> Dict[str, Any]:
    """The cluster model configured as one CPU run, against what the run measured."""
    from mindspeed_asp.cost_model import fit_timings_file
    from mindspeed_asp.experiments import whatif as wi
    from mindspeed_asp.sim import cluster as cm
    from mindspeed_asp.core.problem import LengthEstimate, PromptSet

    summary = json.loads((run_dir / "summary.json").read_text())
    trace = json.loads((run_dir / "trace.json").read_text())
    mode = summary["mode"]
    inst = int(summary["instances"])
    dev = summary.get("devices") or {}
    devices = int(dev.get("total", inst + 1)) if isinstance(dev, dict) else inst + 1
    trainer_dev = devices - inst
    steps = trace["steps"]
    M = len(steps[0]["gids"]) if "gids" in steps[0] else 8
    fit = fit_timings_file((cost_from or run_dir) / "engine_steps.jsonl")
    tr = _fit_trainer(steps)
    sync = float(np.mean([r["time/weight_sync"] for r in steps if "time/weight_sync" in r] or [0.0]))
    trained = {}
    for g in trace["groups"]:
        if g.get("trained") or g["gid"] not in trained:
            trained[g["gid"]] = g
    gids = sorted(trained)
    n = len(trained[gids[0]]["sample_lengths"])
    L = np.array([trained[g]["sample_lengths"] for g in gids], dtype=np.int64)
    P = np.array([trained[g]["prompt_tokens"] // n for g in gids], dtype=np.int64)
    G = len(gids)
    ps = PromptSet(prompt_ids=np.array([str(g) for g in gids], dtype=object), prompt_lens=P, n=n)
    est = LengthEstimate(median=np.median(L, axis=1), group_max=L.max(axis=1).astype(float), sigma=np.zeros(G),
                         p_trunc=np.zeros(G), has_history=np.ones(G, dtype=bool), estimator="observed",
                         samples=L.astype(float))
    slots = int(summary.get("slots", 0)) or 32
    max_lag = int(summary.get("max_lag", 0))
    window = M if mode == "stock" else 2 * M
    G_use = (G // window) * window
    wins = cm.Windows(prompts=ps, truth=L, estimate=est, window_groups=window, minibatch=M,
                      max_new_tokens=int(L.max())).take(np.arange(G_use))
    model = cm.ClusterModel(cost=lambda tp: fit.cost, kv_split=lambda tp: None, kv_colocated=lambda tp: None,
                            slots=slots, trainer=cm.TrainerCost(sec_per_token=tr["alpha"] * trainer_dev,
                                                                extra_passes=0.0, overhead_s=tr["overhead"]),
                            sync_s=sync, switch_s=lambda d: 0.0)
    split = cm.Split(devices=devices, tp=1, rollout_devices=inst)
    cm_mode = {"stock": "stock_split", "async": "async", "asp": "asp"}[mode]
    if cm_mode == "stock_split":
        res = cm.simulate_barrier(model, wins, split, wi.planner_fn("stock"))
    else:
        res = cm.simulate_stream(model, wins, split, cm_mode, max_lag, wi.planner_fn(cm_mode, asp_search="full"))
    tokens_model = wins.tokens()
    pred_e2e = tokens_model / (devices * res.total_s)
    used_steps = G_use // M
    meas_time = float(steps[used_steps - 1]["t_end"] - min(g["submit"] for g in trace["groups"]))
    meas_tokens = float(sum(r.get("tokens/trained", 0) for r in steps[:used_steps]))
    meas_e2e = meas_tokens / (devices * meas_time)
    return {"run": run_dir.name, "mode": mode, "max_lag": max_lag, "instances": inst, "devices": devices,
            "updates": used_steps, "groups": G_use,
            "cost_fit": {"a": fit.cost.a, "b": fit.cost.b, "c": fit.cost.c, "p": fit.cost.p, "r2": fit.r2,
                         "mean_rel": fit.mean_rel, "samples": fit.samples,
                         "from": (cost_from or run_dir).name},
            "trainer_fit": tr, "sync_s": sync,
            "measured": {"time_s": meas_time, "e2e_tps": meas_e2e, "tokens": meas_tokens,
                         "summary_e2e_tps": summary.get("throughput/e2e_tps")},
            "predicted": {"time_s": res.total_s, "e2e_tps": pred_e2e, "tokens": tokens_model,
                          "rollout_s_per_window": res.rollout_s, "lag_max": res.lag_max},
            "error": {"time": res.total_s / meas_time - 1.0, "e2e_tps": pred_e2e / meas_e2e - 1.0}}


def validation(roots: Sequence[Path]) -> Dict[str, Any]:
    """Every complete run directory under each root, predicted with its own cost fit; the cross-check uses the
    root's stock run's fit (the first one) for every run of that root; a summary per mode and max_lag."""
    own: List[Dict[str, Any]] = []
    cross: List[Dict[str, Any]] = []
    for root in roots:
        dirs = sorted(d for d in root.iterdir() if (d / "summary.json").is_file() and (d / "trace.json").is_file()
                      and (d / "engine_steps.jsonl").is_file())
        if not dirs:
            raise SystemExit(f"no run directories with summary.json, trace.json and engine_steps.jsonl under {root}")
        stock = [d for d in dirs if json.loads((d / "summary.json").read_text())["mode"] == "stock"]
        for d in dirs:
            r = dict(predict_run(d), set=root.name)
            own.append(r)
            _say(f"validation {root.name}/{r['run']} ({r['mode']}): time {r['measured']['time_s']:.1f} s measured, "
                 f"{r['predicted']['time_s']:.1f} s predicted ({r['error']['time']:+.1%})")
            if stock:
                cross.append(dict(predict_run(d, cost_from=stock[0]), set=root.name))
    by: Dict[str, List[float]] = {}
    for r in own:
        by.setdefault(f"{r['mode']}@{r['max_lag']}", []).append(r["error"]["time"])
    summary = {k: {"runs": len(v), "mean_error": float(np.mean(v)), "mean_abs_error": float(np.mean(np.abs(v))),
                   "max_abs_error": float(np.max(np.abs(v))), "within_target": int(np.sum(np.abs(v) <= 0.10))}
               for k, v in sorted(by.items())}
    return {"runs": own, "cross": cross, "by_mode": summary, "target_abs_error": 0.10}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "whatif.json"))
    ap.add_argument("--runs", default=None, help="comma list of directories of CPU run directories to validate "
                    "against")
    ap.add_argument("--no-refine", action="store_true", help="skip the asp full-search re-simulation")
    ap.add_argument("--only", default="paper,configs,sensitivity,validation")
    ap.add_argument("--reuse-from", default=None, help="a previous results file: the simulated parts not in "
                    "--only are copied from it (its date and commit are recorded under `reused`)")
    args = ap.parse_args(argv)
    parts = set(args.only.split(","))
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    result: Dict[str, Any] = {"lags": list(LAGS), "paper_ratio": PAPER_RATIO, "seeds": seeds}
    if args.reuse_from:
        old = json.loads(Path(args.reuse_from).read_text())
        copied = [k for k in ("paper", "configs", "sensitivity") if k in old and k not in parts]
        result.update({k: old[k] for k in copied})
        result["seeds"] = old.get("seeds", seeds) if "paper" in copied else seeds
        result["reused"] = {"parts": copied, "measured_at": old.get("measured_at"), "commit": old.get("commit"),
                            "command": old.get("command")}
    t0 = time.perf_counter()
    if "paper" in parts:
        result["paper"] = paper_setting(seeds, refine=not args.no_refine)
    if "configs" in parts:
        result["configs"] = config_splits()
    if "sensitivity" in parts:
        result["sensitivity"] = sensitivity()
    if "paper" in result and "sensitivity" in result:
        result["conditions_322"] = conditions_for(result["paper"], result["sensitivity"])
        for line in result["conditions_322"]:
            print(line)
    if "validation" in parts and args.runs:
        result["validation"] = validation([Path(x) for x in args.runs.split(",") if x.strip()])
    result["seconds"] = time.perf_counter() - t0
    write_results(args.json, result, __file__, argv)
    print(f"wrote {args.json} in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
