"""`asp plan`: build the epoch's DispatchPlan (the offline pass) and print a short summary.

    asp plan --dataset prompts.jsonl --history hist.parquet --instances 8 --slots 64 --minibatch 32 \\
        [--planner asp] [--groups-per-iteration 512] [--n 8] [--max-new-tokens 4096] [--cost cost.json] \\
        [--rho 1.0] [--truth truth.parquet] -o plan.parquet

The summary ends with the regime advice: the first window simulated (one length scenario drawn from the
estimate, the plan's cost and rho) at max_lag 0, 1, 2 and K-1 against the stock pipeline, with a WARNING line on
stderr when the chosen --max-lag is predicted slower than stock (--no-advice skips it).
Without --history every prompt gets the cold-start estimate. Planners named oracle_* (oracle_asp,
oracle_lpt, oracle_verl_kk) plan with true lengths read from --truth (a length-history file; its latest epoch,
or --truth-epoch).

--config takes defaults from a YAML: a run config or a file with only an `asp:` section (its `asp:` section), or
a MindSpeed-RL training YAML (detected by MindSpeed-RL's own sections; validated whole, cluster shape included,
and it also gives the instances that follow the plan, the batch as the window, n, max tokens and the seed). A
flag that sets a key of the `asp:` section (--instances, --slots, --minibatch, --planner, --rho, --kv-budget,
--max-lag, --no-work-stealing, --estimator, --history, --cost) is applied as an override of that key, so it
is validated, and named in errors, as `asp.<key>=value` would be.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from mindspeed_asp.utils.argtypes import length_int, nonneg_int, positive_float, positive_int, seed_int


def register(subparsers) -> None:
    p = subparsers.add_parser("plan", help="build a dispatch plan for an epoch (the offline pass)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True, help="prompt dataset, JSON Lines with prompt_id and prompt_len")
    p.add_argument("--history", default=None, help="length history (.parquet or .jsonl)")
    p.add_argument("--config", default=None, help="YAML whose asp: section supplies defaults: a run config, a "
                   "YAML with only an asp: section, or a MindSpeed-RL training YAML (which also gives the instances, "
                   "batch, n, max tokens and seed; its loss keys are the trainer's and not read here)")
    p.add_argument("--instances", type=positive_int, default=None, help="inference instances N")
    p.add_argument("--slots", type=positive_int, default=None, help="max concurrent sequences per instance B")
    p.add_argument("--minibatch", type=positive_int, default=None, help="trainer minibatch M, in prompt groups")
    p.add_argument("--planner", default=None, help="asp (default) or a baseline: stock, random, sorted_asc, "
                   "sorted_desc, round_robin, least_loaded, verl_kk, lpt, shared_desc (longest first from one shared "
                   "queue), oracle_asp, oracle_lpt, oracle_verl_kk")
    p.add_argument("--groups-per-iteration", type=positive_int, default=None,
                   help="prompt groups per training iteration (default: a MindSpeed-RL --config's global batch, "
                   "else the whole dataset is one iteration)")
    p.add_argument("--n", type=positive_int, default=None,
                   help="samples per prompt (default: a MindSpeed-RL --config's n_samples_per_prompt, else 8)")
    p.add_argument("--max-new-tokens", type=length_int, default=None,
                   help="generation cap (default: a MindSpeed-RL --config's max_tokens, else the longest length "
                   "in the history)")
    p.add_argument("--cost", default=None, help="cost-model JSON from `asp fit-cost` (keys a, b, c[, p])")
    p.add_argument("--rho", type=positive_float, default=None,
                   help="trainer work / the window's rollout lower bound R_LB (default 1.0); rho_stock, over "
                        "stock's rollout, is smaller: docs/design.md#rho-and-rho_stock")
    p.add_argument("--kv-budget", type=positive_int, default=None,
                   help="KV budget per instance, tokens (default: --config's asp.kv_budget_tokens, else unbounded)")
    p.add_argument("--max-lag", type=nonneg_int, default=None,
                   help="the max_lag the plan will run under (asp.max_lag); ASP scores its candidates with it "
                        "(default: --config's asp.max_lag, else 1)")
    p.add_argument("--no-work-stealing", action="store_true",
                   help="score the plan as run without work stealing (default: --config's asp.work_stealing, "
                        "else on)")
    p.add_argument("--estimator", default=None, choices=("history", "cold_start"),
                   help="length estimator (default history)")
    p.add_argument("--truth", default=None, help="true lengths for oracle_* planners (length-history file)")
    p.add_argument("--truth-epoch", type=nonneg_int, default=None,
                   help="epoch of --truth to use (default: latest)")
    p.add_argument("--seed", type=seed_int, default=None,
                   help="the planner's seed (default: a MindSpeed-RL --config's megatron_training.seed, else 0)")
    p.add_argument("--format", default=None, choices=("parquet", "jsonl"), help="default: from -o's suffix")
    p.add_argument("--json", default=None, help="also write the summary as JSON here")
    p.add_argument("--no-advice", action="store_true",
                   help="skip the regime advice (the first window simulated at max_lag 0, 1, 2, K-1 against the "
                        "stock pipeline, and the simulated gap to the rollout lower bound)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("-o", "--output", required=True, help="plan file (.parquet or .jsonl)")
    p.set_defaults(func=run)


def _truth_matrix(path: str, epoch: Optional[int], prompts):
    from mindspeed_asp.errors import InputError
    from mindspeed_asp.scheduler.history import LengthHistory

    hist = LengthHistory.load(path)
    epochs = hist.epochs()
    if not epochs:
        raise InputError("truth file holds no lengths", path=path)
    e = epochs[-1] if epoch is None else int(epoch)
    if e not in epochs:
        raise InputError(f"no epoch {e} in truth file (epochs: {epochs})", path=path, key="epoch")
    mat = hist.epoch_matrix([str(p) for p in prompts.prompt_ids], e, prompts.n)
    missing = (mat < 0).any(axis=1)
    if missing.any():
        first = str(prompts.prompt_ids[int(missing.argmax())])
        raise InputError(f"epoch {e} lacks {prompts.n} true lengths for {int(missing.sum())} prompt(s), first "
                         f"prompt_id {first!r}", path=path)
    return mat.astype(float), e


#: The flags that set a key of the `asp:` section, as (flag, argparse dest, key): each one given becomes an
#: override of its key (`config.flag_override`), applied and validated with the config, never merged into it
#: after validation.
FLAG_KEYS: Tuple[Tuple[str, str, str], ...] = (
    ("--instances", "instances", "asp.instances"), ("--slots", "slots", "asp.slots"),
    ("--minibatch", "minibatch", "asp.minibatch_groups"), ("--planner", "planner", "asp.planner"),
    ("--rho", "rho", "asp.rho"), ("--kv-budget", "kv_budget", "asp.kv_budget_tokens"),
    ("--max-lag", "max_lag", "asp.max_lag"), ("--estimator", "estimator", "asp.estimator.kind"),
    ("--history", "history", "asp.history_path"), ("--cost", "cost", "asp.cost.file"),
    ("--no-work-stealing", "no_work_stealing", "asp.work_stealing"),
)


def flag_overrides(args, flag_keys=FLAG_KEYS) -> Tuple[List[str], Dict[str, str]]:
    """(one override per flag given, {override: the flag as typed}) for `read_config`; a `--no-X` flag given sets
    its key to false."""
    from mindspeed_asp.config import flag_override

    overrides: List[str] = []
    flags: Dict[str, str] = {}
    for flag, dest, key in flag_keys:
        value = getattr(args, dest, None)
        if value is None or value is False:
            continue
        item = flag_override(key, False if flag.startswith("--no-") else value)
        overrides.append(item)
        flags[item] = flag if flag.startswith("--no-") else f"{flag} {value}"
    return overrides, flags


def read_config(path: Optional[str], overrides: List[str], flags: Dict[str, str], topology: bool = True,
                plan_output: Optional[str] = None):
    """(the `asp:` section with `overrides` applied, the MindSpeed-RL topology or None), the YAML read once.

    Which reader: a MindSpeed-RL training YAML (it has MindSpeed-RL's own sections: `config.is_training_yaml`)
    through the MindSpeed-RL adapter, validated whole (`topology_from_dict`; with `topology=False` its `asp:`
    section alone, loss keys included); anything else (a run config, a YAML with only an `asp:` section) through
    the project's own reader. No `path`: the flags alone, on the section's defaults. `plan_output`: the plan
    being built, standing in for a training YAML's `asp.plan_path` when it names none yet (the run needs one,
    the command that writes it does not)."""
    from mindspeed_asp.config import asp_section_from_dict, is_training_yaml, read_yaml, validate_overridden

    if path is None:
        return asp_section_from_dict({"asp": {}}, "command line", overrides, flags), None
    data = read_yaml(path)
    if not is_training_yaml(data):
        return asp_section_from_dict(data, path, overrides, flags), None
    from mindspeed_asp.integrations.mindspeed_rl.config_section import msrl_asp_section, topology_from_dict

    if not topology:
        return validate_overridden(data, overrides, path, lambda d: msrl_asp_section(d, path), flags), None

    def validate(d: Dict[str, Any]):
        if plan_output and isinstance(d.get("asp"), dict) and d["asp"].get("plan_path") is None:
            d["asp"]["plan_path"] = str(plan_output)
        return topology_from_dict(d, path)
    topo = validate_overridden(data, overrides, path, validate, flags)
    return topo.asp, topo


def _check_shape(prompts, instances: int, slots: int, n: int, n_key: str, window_groups: Optional[int],
                 args) -> None:
    """Refuse a cluster the planners cannot use: more instances than groups in a window (an instance would get
    none, and the regime advice, which simulates every instance, runs for minutes on such a cluster), or fewer
    slots than a group's n samples (the planners place a group on one instance and count its n samples in
    flight together, as the runtime dispatches it: the runtime refuses data.n > asp.slots too)."""
    from mindspeed_asp.errors import InputError

    inst_key = "--instances" if args.instances is not None else "asp.instances"
    slots_key = "--slots" if args.slots is not None else "asp.slots"
    window = min(window_groups or len(prompts), len(prompts))
    if instances > window:
        what = (f"--groups-per-iteration {window_groups}" if args.groups_per_iteration
                else f"megatron_training.global_batch_size {window_groups}" if window_groups
                else "without --groups-per-iteration the whole dataset is one iteration")
        raise InputError(f"{instances} instances for {window} groups per iteration ({what}): every instance needs "
                         f"at least one group of each window; give at most {window} instances or a larger window",
                         key=inst_key)
    if slots < n:
        raise InputError(f"{slots_key} {slots} is below a group's {n} samples ({n_key} {n}): a group's samples "
                         f"run together on one instance; give {slots_key} {n} or more", key=slots_key)


def run(args) -> int:
    from mindspeed_asp.utils.atomic import check_output_file, write_json
    from mindspeed_asp.errors import InputError
    from mindspeed_asp.core.memory_budget import check_fits, check_kv_budget, planning_bytes
    from mindspeed_asp.scheduler.build import estimate_lengths, build_plan
    from mindspeed_asp.scheduler.history import LengthHistory
    from mindspeed_asp.scheduler.plan_file import plan_format
    from mindspeed_asp.scheduler.planners import PLANNERS, needs_oracle
    from mindspeed_asp.cost_model import cost_from_section, load_cost_json
    from mindspeed_asp.core.problem import CostModel
    from mindspeed_asp.workloads.prompts import load_prompt_set

    if args.config is None:
        for value, flag in ((args.instances, "--instances"), (args.slots, "--slots"), (args.minibatch, "--minibatch")):
            if value is None:
                raise InputError("required (or give --config with an asp: section)", key=flag)
    overrides, flags = flag_overrides(args)
    asp, topo = read_config(args.config, overrides, flags, plan_output=args.output)
    # a MindSpeed-RL run plans for the instances that follow the plan (its pool, or its colocated engines) and
    # one global batch per window; its n, cap and seed are the run's
    instances = topo.instances if topo is not None else asp.instances
    slots, minibatch, planner = asp.slots, asp.minibatch_groups, asp.planner
    if planner not in PLANNERS:  # checked with the config already (PLANNER_NAMES); the registry must agree
        raise InputError(f"unknown planner {planner!r}; choose one of: {', '.join(PLANNERS)}", key="--planner")
    rho = asp.rho or 1.0  # finite and > 0 (argtypes, config)
    max_lag, work_stealing, kv_budget = asp.max_lag, bool(asp.work_stealing), asp.kv_budget_tokens
    kv_key = "--kv-budget" if args.kv_budget is not None else "asp.kv_budget_tokens"
    n = args.n if args.n is not None else (topo.n if topo is not None else 8)
    n_key = "rl_config.n_samples_per_prompt" if args.n is None and topo is not None else "--n"
    window = args.groups_per_iteration if args.groups_per_iteration is not None else (
        topo.gbs if topo is not None else None)
    seed = args.seed if args.seed is not None else (topo.seed if topo is not None else 0)
    # Every output is checked before any work: a bad -o fails now, not after the planning pass.
    plan_format(args.output, args.format)
    check_output_file(args.output, key="-o")
    if args.json:
        check_output_file(args.json, key="--json")

    history_path = asp.history_path
    if history_path and not Path(history_path).is_file():
        raise InputError("length history file not found", path=history_path,
                         key="--history" if args.history else "asp.history_path")
    prompts = load_prompt_set(args.dataset, n=n)
    check_fits(planning_bytes(len(prompts), n, instances, slots),
               f"planning {len(prompts)} groups x n={n} on {instances} instances x {slots} slots",
               key="--instances/--slots/--n")
    _check_shape(prompts, instances, slots, n, n_key, window, args)
    history = LengthHistory.load(history_path) if history_path else None
    max_new = args.max_new_tokens if args.max_new_tokens is not None else (
        topo.max_tokens if topo is not None else None)
    if max_new is None:
        if history is None or history.num_samples == 0:
            raise InputError("required when no --history gives the generation cap", key="--max-new-tokens")
        max_new = int(history.records()[3].max())
    check_kv_budget(kv_budget, prompts.prompt_lens, max_new, key=kv_key)
    if asp.cost.file:
        cost = load_cost_json(asp.cost.file, key="--cost" if args.cost else "asp.cost.file")
    elif args.config is not None:
        cost = cost_from_section(asp.cost, origin=f"{args.config} asp.cost")
    else:
        cost = CostModel()
    section = asp.estimator
    truth, truth_epoch = None, None
    if needs_oracle(planner):
        if not args.truth:
            raise InputError(f"planner {planner} plans with true lengths: give --truth", key="--truth")
        truth, truth_epoch = _truth_matrix(args.truth, args.truth_epoch, prompts)
    est = estimate_lengths(prompts, history, max_new, planner=planner, estimator_section=section,
                           true_lengths=truth)
    provenance: Dict[str, Any] = {"dataset": str(args.dataset), "history": history_path, "cost_file": asp.cost.file,
                                  "config": args.config}
    if truth is not None:
        provenance.update({"truth": args.truth, "truth_epoch": truth_epoch})
    t0 = time.perf_counter()
    result = build_plan(prompts, est, instances=instances, slots=slots, minibatch=minibatch,
                        max_new_tokens=max_new, planner=planner, groups_per_iteration=window,
                        cost=cost, rho=rho, kv_budget=kv_budget, seed=seed, provenance=provenance,
                        progress=False if args.no_progress else None, max_lag=max_lag,
                        work_stealing=work_stealing)
    plan_s = time.perf_counter() - t0
    out = result.plan.save(args.output, args.format)  # atomic: temp file + rename
    advice = None
    if not args.no_advice:
        advice = first_window_advice(result, prompts, est, cost=cost, rho=rho, kv_budget=kv_budget,
                                     max_new_tokens=max_new, seed=seed)
    summary = plan_summary(result, max_new, advice=advice, plan_seconds=plan_s)
    print(format_summary(summary, str(out)))
    if advice is not None:
        print(advice.format())
        if advice.warning():
            print(advice.warning(), file=sys.stderr)
    if args.json:
        write_json(args.json, summary, key="--json", indent=2)
    return 0


def first_window_advice(result, prompts, est, *, cost, rho: float, kv_budget: Optional[int], max_new_tokens: int,
                        seed: int):
    """Regime advice on the plan's first window, in the regime the plan was built for (its header)."""
    from mindspeed_asp.experiments.advice import regime_advice
    from mindspeed_asp.core.problem import InstanceSpec, PlanningProblem

    plan = result.plan
    rows = plan.iteration_rows(0)
    h = plan.header
    problem = PlanningProblem(prompts=prompts.subset(rows), estimate=est.subset(rows),
                              instances=plan.instances, spec=InstanceSpec(slots=int(h["slots"]), kv_budget=kv_budget),
                              minibatch=int(h["minibatch_groups"]), cost=cost, max_new_tokens=int(max_new_tokens),
                              rho=float(rho), seed=int(seed), max_lag=int(h["max_lag"]),
                              work_stealing=bool(h["work_stealing"]))
    return regime_advice(problem, plan.assignment(0), planner=str(h["planner"]))


def plan_summary(result, max_new_tokens: int, advice=None, plan_seconds: Optional[float] = None) -> Dict[str, Any]:
    """Machine-readable summary of a built plan (also printed as a table).

    `pred_makespan_s` / `pred_bound_s` are the planner's fluid figures (one model on both sides: they can meet
    when the longest group binds). With `advice`, `gap` holds the honest figure: the first window's
    event-simulated rollout against the sim.bounds lower bound of the same predicted lengths.
    """
    plan = result.plan
    sums = result.summaries
    makespan = float(sum(s.makespan for s in sums))
    bound = float(sum(s.bound for s in sums))
    est = result.estimate
    out: Dict[str, Any] = {
        "groups": plan.num_groups,
        "samples": plan.num_groups * int(plan.header["n"]),
        "iterations": plan.num_iterations,
        "instances": plan.instances,
        "planner": plan.header["planner"],
        "estimator": est.estimator,
        "with_history": int(est.has_history.sum()),
        "max_new_tokens": int(max_new_tokens),
        "pred_makespan_s": makespan,
        "pred_bound_s": bound,
        "pred_above_bound_pct": 100.0 * (makespan / bound - 1.0) if bound > 0 else 0.0,
        "pred_max_over_mean_worst": max((s.max_over_mean for s in sums), default=1.0),
        "pred_max_over_mean_mean": float(sum(s.max_over_mean for s in sums) / max(len(sums), 1)),
        "dataset_fingerprint": plan.fingerprint,
        "max_lag": int(plan.header["max_lag"]),
        "work_stealing": bool(plan.header["work_stealing"]),
        "shared_iterations": len(plan.header.get("shared_iterations") or []),
        "isolated_groups": len(plan.header.get("isolated_rows") or []),
    }
    if plan_seconds is not None:
        out["plan_seconds"] = float(plan_seconds)
    if advice is not None:
        out["gap"] = {"window": 0, "groups": advice.groups, "instances": advice.instances,
                      "shrunk": advice.shrunk, "sim_rollout_s": advice.pred_rollout_s,
                      "rollout_lb_s": advice.rollout_lb_s, "above_lb_pct": advice.gap_pct}
        out["advice"] = advice.as_dict()
        if plan_seconds:
            out["advice"]["share_of_planning"] = advice.seconds / plan_seconds
    return out


def format_summary(s: Dict[str, Any], path: str) -> str:
    lines = [
        f"wrote {path}",
        f"  groups            {s['groups']} ({s['samples']} samples) in {s['iterations']} iteration(s) "
        f"on {s['instances']} instance(s)",
        f"  planner           {s['planner']}   estimator {s['estimator']} "
        f"({s['with_history']}/{s['groups']} groups with history, cap {s['max_new_tokens']})",
        f"  load balance      predicted max/mean instance time {s['pred_max_over_mean_mean']:.3f} "
        f"(worst iteration {s['pred_max_over_mean_worst']:.3f})",
        f"  fluid makespan    {s['pred_makespan_s']:.1f} s vs its fluid bound {s['pred_bound_s']:.1f} s "
        f"({s['pred_above_bound_pct']:+.1f}%; the planner's model on both sides)",
    ]
    shared = int(s.get("shared_iterations", 0))
    lines.append(f"  dispatch          {s['iterations'] - shared} iteration(s) pinned to instance queues, {shared} "
                 f"from one shared queue (least-loaded: the selection found no pinned plan faster there)")
    isolated = int(s.get("isolated_groups", 0))
    if isolated:
        lines.append(f"  isolation         {isolated} dominant group(s) isolated: each one's instance steals nothing "
                     f"while it runs (its longest sequence alone sets the rollout's end)")
    g = s.get("gap")
    if g is not None:
        lines.append(f"  true-bound gap    first window: simulated rollout {g['sim_rollout_s']:.1f} s vs lower bound "
                     f"{g['rollout_lb_s']:.1f} s ({g['above_lb_pct']:+.1f}%; event simulator and sim.bounds R_LB "
                     f"on the same predicted lengths)")
    lines.append(f"  dataset           fingerprint {s['dataset_fingerprint']}")
    return "\n".join(lines)
