"""`asp simulate`: compare planners side by side in the event-driven pipeline simulator.

Prints one table (mean over seeds), writes `simulate.json` and four PNGs (instance Gantt chart, queue
occupancy, bubble breakdown, lag histogram) into --out. Heavy imports stay inside the handler so
`asp --help` is fast.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from mindspeed_asp.utils.argtypes import MAX_SEED, nonneg_float, nonneg_int, positive_int
from mindspeed_asp.core.policy import DEFAULT_STALE_POLICY, STALE_POLICIES

#: Most seeds one command runs (each is a full simulation of every planner).
MAX_SEEDS = 10_000


def _seeds(text: str) -> List[int]:
    from mindspeed_asp.errors import InputError

    try:
        if "-" in text and "," not in text:
            lo, hi = (int(x) for x in text.split("-", 1))
            if hi < lo:
                raise InputError(f"the range {text!r} is empty: write the low seed first ({hi}-{lo})",
                                 key="--seeds")
            if hi - lo + 1 > MAX_SEEDS:
                raise InputError(f"{hi - lo + 1} seeds; at most {MAX_SEEDS}", key="--seeds")
            seeds = list(range(lo, hi + 1))
        else:
            seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"seeds must look like 0,1,2 or 0-4, got {text!r}", key="--seeds") from None
    bad = [x for x in seeds if not 0 <= x <= MAX_SEED]
    if bad:
        raise InputError(f"seed {bad[0]} is out of range (0 .. {MAX_SEED})", key="--seeds")
    return seeds


def _workload_seed(spec: str) -> Optional[int]:
    """The `seed=` a synthetic --workload names itself, if any."""
    from mindspeed_asp.errors import InputError

    if not spec.startswith("synthetic:"):
        return None
    for item in spec[len("synthetic:"):].split(","):
        k, _, v = item.partition("=")
        if k.strip() == "seed":
            try:
                return int(v)
            except ValueError:
                raise InputError(f"bad value {v.strip()!r} for seed", key="seed") from None
    return None


def resolve_seeds(spec: str, seeds_flag: Optional[str]) -> List[int]:
    """The seeds to run: --seeds, or a synthetic workload's own `seed=` (honoured when --seeds is not given;
    both at once is refused, since each seed redraws the workload and one of them would be ignored)."""
    from mindspeed_asp.errors import InputError

    own = _workload_seed(spec)
    if own is not None and seeds_flag is not None:
        raise InputError(f"the workload names seed={own} and --seeds {seeds_flag} is given; give the seed once "
                         "(--seeds redraws the synthetic workload per seed)", key="--seeds")
    if seeds_flag is None:
        return [own] if own is not None else [0]
    return _seeds(seeds_flag)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate", help="simulate planners side by side (bubbles, lag, lower bounds)",
        description="Plan one window of a workload with each planner and simulate instances, the streaming "
                    "trainer and the lag bound. rho sets the trainer: total train time = rho * R_LB of the "
                    "workload (the rollout lower bound with true lengths). A planner may carry its own mode: "
                    "'stock@stock' is MindSpeed-RL's synchronous pipeline.")
    p.add_argument("--workload", required=True,
                   help="synthetic:prompts=512,n=8,seed=0 | alpaca:<path> | splitwise:<path> | "
                        "history:<path>[?epoch=E&n=8&dataset=prompts.jsonl&cap=4096] (a length history or a "
                        "runtime rollout log: epoch E, default the latest, is the truth and the epochs before it "
                        "the history)")
    p.add_argument("--planners", default="asp,stock@stock,round_robin,sorted_asc,verl_kk,lpt,oracle_asp",
                   help="comma list, each NAME or NAME@MODE (mode stream|stock|single)")
    p.add_argument("--instances", type=positive_int, default=8)
    p.add_argument("--slots", type=positive_int, default=64, help="B, max concurrent sequences per instance")
    p.add_argument("--kv-budget", type=positive_int, default=None,
                   help="KV tokens per instance (default unbounded)")
    p.add_argument("--kv-policy", choices=("preempt", "reserve"), default="preempt")
    p.add_argument("--minibatch", type=positive_int, default=32, help="M, groups per trainer update")
    p.add_argument("--rho", type=nonneg_float, default=None,
                   help="trainer work / rollout lower bound R_LB (default 1.0); the output also gives it against "
                        "stock's rollout (rho_stock, docs/design.md#rho-and-rho_stock)")
    p.add_argument("--rho-stock", type=nonneg_float, default=None,
                   help="instead of --rho: trainer work / stock's simulated rollout of the window")
    p.add_argument("--overhead", type=nonneg_float, default=0.0, help="fixed seconds per trainer update")
    p.add_argument("--max-lag", type=nonneg_int, default=1)
    p.add_argument("--stale-policy", choices=STALE_POLICIES, default=DEFAULT_STALE_POLICY,
                   help="stream mode: what happens to a group the lag audit finds stale, as the runtime's "
                        "asp.stale_policy (under the shared policy none does; see docs/design.md#lag-audit)")
    p.add_argument("--sync-time", type=nonneg_float, default=0.0, help="seconds per weight-sync round")
    p.add_argument("--mode", choices=("stream", "stock", "single"), default="stream")
    p.add_argument("--work-stealing", action=argparse.BooleanOptionalAction, default=None,
                   help="idle instances steal not-started groups (the runtime's asp.work_stealing). Default: on "
                        "for streaming planners, off for the stock pipeline (MindSpeed-RL never steals); "
                        "--work-stealing turns it on for every planner, stock included, --no-work-stealing off")
    p.add_argument("--no-advice", action="store_true",
                   help="skip the regime advice (max_lag 0, 1, 2, K-1 against the stock pipeline, simulated on "
                        "the first seed's first window with estimated lengths)")
    p.add_argument("--single-scaling", default=None,
                   help="speed-up curve of one m-device instance for mode single: power:E | amdahl:F | "
                        "table:1=1,2=1.7,...")
    p.add_argument("--estimator", choices=("history", "cold_start", "oracle"), default="history")
    p.add_argument("--cost-file", default=None, help="JSON with a, b, c, p (from `asp fit-cost`)")
    p.add_argument("--seeds", default=None, help="e.g. 0,1,2 or 0-4 (default: the synthetic workload's own "
                   "seed=, else 0; giving both is refused)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=handle)


def _advice(spec: str, planners, cfg, seed: int):
    """Regime advice for the run: the first streaming, non-oracle planner (asp if listed) on `seed`'s window,
    with the estimate the planners see, before any comparison is simulated; None when no planner fits."""
    from mindspeed_asp.experiments import sweep
    from mindspeed_asp.experiments.advice import regime_advice
    from mindspeed_asp.scheduler.planners import needs_oracle

    names = [name for _, name, mode in planners if mode == "stream" and not needs_oracle(name)]
    if not names:
        return None
    name = "asp" if "asp" in names else names[0]
    wb = sweep.prepare(spec, cfg, seed)
    return regime_advice(sweep.problem_for(wb, name, "stream", cfg), planner=name, sync_time=cfg.sync_time,
                         overhead=cfg.overhead, stale_policy=cfg.stale_policy)


def handle(args: argparse.Namespace) -> int:
    import numpy as np

    from mindspeed_asp.utils.atomic import check_output_dir, write_json
    from mindspeed_asp.errors import InputError
    from mindspeed_asp.core.memory_budget import check_fits, planning_bytes
    from mindspeed_asp.core.problem import CostModel
    from mindspeed_asp.experiments import sweep
    from mindspeed_asp.cost_model import load_cost_json

    # ranges and finiteness of the numbers: argparse types (mindspeed_asp.utils.argtypes)
    out = check_output_dir(args.out, key="--out")  # before any simulation
    seeds = resolve_seeds(args.workload, args.seeds)
    if not seeds:
        raise InputError("no seeds", key="--seeds")
    # the slot-side footprint; the workload's own (groups x n) is checked when it is resolved
    check_fits(planning_bytes(0, 0, args.instances, args.slots),
               f"simulating {args.instances} instances x {args.slots} slots", key="--instances/--slots")
    planners = sweep.parse_planners(args.planners, args.mode)
    scaling = sweep.parse_scaling(args.single_scaling)
    if scaling is None and any(m == "single" for _, _, m in planners):
        raise InputError("mode single needs --single-scaling (the speed-up curve of one big instance)",
                         key="--single-scaling")
    cost = load_cost_json(args.cost_file, key="--cost-file") if args.cost_file else CostModel()
    if args.rho is not None and args.rho_stock is not None:
        raise InputError("give the trainer's rho once: --rho (vs R_LB) or --rho-stock (vs stock's rollout)",
                         key="--rho-stock")
    cfg = sweep.SweepConfig(instances=args.instances, slots=args.slots, kv_budget=args.kv_budget,
                            minibatch=args.minibatch, rho=1.0 if args.rho is None else args.rho,
                            rho_stock=args.rho_stock, max_lag=args.max_lag, mode=args.mode,
                            sync_time=args.sync_time, overhead=args.overhead, estimator=args.estimator,
                            stale_policy=args.stale_policy, cost=cost, single_scaling=scaling,
                            work_stealing=args.work_stealing)
    advice = None
    if not args.no_advice:
        advice = _advice(args.workload, planners, cfg, seeds[0])
    try:
        results = sweep.compare(args.workload, planners, cfg, seeds, progress=not args.quiet)
    except ValueError as exc:  # planner/simulator refusals on this input
        raise InputError(str(exc), key="--workload") from None
    rows = {label: sweep.mean_metrics(rs) for label, rs in results.items()}
    modes = {label: mode for label, _, mode in planners}
    print(f"workload {args.workload}: {args.instances} instances x {args.slots} slots, M={args.minibatch}, "
          f"max_lag={args.max_lag}, seeds={seeds}, cost a={cost.a:.3g} b={cost.b:.3g} "
          f"c={cost.c:.3g} p={cost.p:.3g}")
    print(sweep.rho_line(rows))
    print(sweep.format_table(rows, modes))
    print(sweep.e2e_line(results))
    if advice is not None:
        print(advice.format())
        if advice.warning():
            print(advice.warning(), file=sys.stderr)
    payload = {
        "workload": args.workload, "seeds": seeds,
        "config": {k: v for k, v in vars(args).items() if k not in ("func",)},
        "cost": {"a": cost.a, "b": cost.b, "c": cost.c, "p": cost.p, "source": cost.source},
        "mean": rows,
        "runs": {label: [r.summary() for r in rs] for label, rs in results.items()},
        "work_stealing": {label: sweep.steals(cfg, mode) for label, _, mode in planners},
        "advice": advice.as_dict() if advice is not None else None,
    }
    write_json(out / "simulate.json", payload, key="--out", indent=2, default=float)  # atomic
    files = [out / "simulate.json"]
    if not args.no_plots:
        from mindspeed_asp.sim import plots

        first = [rs[0] for rs in results.values()]
        files.append(plots.gantt(first[:6], out / "gantt.png"))
        files.append(plots.queue_occupancy(first, args.minibatch, out / "queue_occupancy.png"))
        files.append(plots.bubble_breakdown(rows, out / "bubbles.png"))
        files.append(plots.lag_histogram(first, args.max_lag, out / "lag_histogram.png"))
    print("wrote " + ", ".join(str(f) for f in files))
    return 0 if all(np.isfinite(r["time/iteration"]) for r in rows.values()) else 1
