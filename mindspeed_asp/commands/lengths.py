"""`asp lengths`: evaluate length estimators on a trace, and write a synthetic history + dataset.

    asp lengths eval --trace alpaca:<path> [--target t0.7] [--estimator history,cold_start,oracle] [--json out]
    asp lengths synth --prompts 4096 --epochs 3 -o history.parquet [--dataset prompts.jsonl] [--small]
    asp lengths describe --trace synthetic:prompts=4096,n=8
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List

from mindspeed_asp.utils.argtypes import (any_float, finite_float, length_float, length_int, nonneg_float, positive_int,
                                    seed_int)


def register(subparsers) -> None:
    parser = subparsers.add_parser("lengths", help="length history: evaluate estimators, synthesise histories",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="lengths_command", metavar="ACTION")

    ev = sub.add_parser("eval", help="MAE, Kendall tau and group-max coverage of estimators on a trace")
    ev.add_argument("--trace", required=True,
                    help="alpaca:<path> | splitwise:<path>[?n=8] | synthetic:prompts=512,n=8,seed=0[,epochs=3]")
    ev.add_argument("--target", default=None,
                    help="alpaca only: held-out column predicted from the others (t0.0/t0.3/t0.5/t0.7; default t0.7)")
    ev.add_argument("--estimator", default="history",
                    help="comma-separated estimators to compare: history, cold_start, oracle (default history)")
    ev.add_argument("--config", default=None, help="YAML with an asp: section; its asp.estimator is the base")
    ev.add_argument("--recency-decay", type=finite_float(0.0, 1.0, lo_open=True), default=None)
    ev.add_argument("--max-epochs", type=positive_int, default=None)
    ev.add_argument("--quantile", type=finite_float(0.0, 1.0, lo_open=True, hi_open=True), default=None,
                    help="group-max quantile q")
    ev.add_argument("--sigma-shrinkage", type=nonneg_float, default=None)
    ev.add_argument("--no-drift", action="store_true", help="disable the global drift factor")
    ev.add_argument("--max-new-tokens", type=length_int, default=None, help="default: the trace's cap")
    ev.add_argument("--json", default=None, help="write the metrics as JSON here")
    ev.set_defaults(func=_eval)

    sy = sub.add_parser("synth", help="write a synthetic length history and prompt dataset")
    sy.add_argument("--prompts", type=positive_int, required=True, help="number of prompt groups")
    sy.add_argument("--epochs", type=positive_int, required=True, help="history epochs to write (0 .. E-1)")
    sy.add_argument("--n", type=positive_int, default=8, help="samples per prompt")
    sy.add_argument("--seed", type=seed_int, default=0)
    sy.add_argument("--small", action="store_true", help="CPU demo regime (median 48, cap 384 tokens)")
    sy.add_argument("--median", type=length_float, default=None, help="median response tokens")
    sy.add_argument("--cap", type=length_int, default=None, help="max_new_tokens")
    sy.add_argument("--trend", type=any_float, default=None, help="global drift of log-length per epoch")
    sy.add_argument("-o", "--output", required=True, help="history file (.parquet or .jsonl)")
    sy.add_argument("--dataset", default=None, help="prompt dataset (.jsonl); default <output>.prompts.jsonl")
    sy.add_argument("--truth", default=None,
                    help="also write the true lengths of epoch E (history format) for simulation")
    sy.set_defaults(func=_synth)

    de = sub.add_parser("describe", help="length statistics of a trace or synthetic workload")
    de.add_argument("--trace", required=True)
    de.add_argument("--json", default=None)
    de.set_defaults(func=_describe)

    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


#: The flags of `asp lengths eval` that set a key of `asp.estimator`, as (flag, argparse dest, key): applied as
#: overrides of --config (or of the defaults), so each is validated and named as `key=value` would be.
ESTIMATOR_FLAGS = (("--recency-decay", "recency_decay", "asp.estimator.recency_decay"),
                   ("--max-epochs", "max_epochs", "asp.estimator.max_epochs"),
                   ("--quantile", "quantile", "asp.estimator.group_max_quantile"),
                   ("--sigma-shrinkage", "sigma_shrinkage", "asp.estimator.sigma_shrinkage"),
                   ("--no-drift", "no_drift", "asp.estimator.drift"))


def _section(args):
    """The estimator section: defaults, then --config's asp.estimator (the YAML read as `asp plan` reads it: a
    MindSpeed-RL training YAML through its adapter, anything else through the project's reader), then the flags
    as overrides."""
    from mindspeed_asp.commands.plan import flag_overrides, read_config

    overrides, flags = flag_overrides(args, ESTIMATOR_FLAGS)
    return read_config(args.config, overrides, flags, topology=False)[0].estimator


def _resolve_trace(trace: str, target):
    from mindspeed_asp.errors import InputError
    from mindspeed_asp.workloads.spec import workload_from_spec

    if target is not None:
        if not trace.startswith("alpaca:"):
            raise InputError("--target applies to alpaca traces only", key="--target")
        if "?" in trace:
            raise InputError("give the target either in the trace (?target=) or with --target", key="--target")
        trace = f"{trace}?target={target}"
    return workload_from_spec(trace)


def _eval(args) -> int:
    from mindspeed_asp.utils.atomic import check_output_file, write_json
    from mindspeed_asp.errors import InputError
    from mindspeed_asp.scheduler.estimators import make_estimator
    from mindspeed_asp.scheduler.length_metrics import evaluate

    if args.json:
        check_output_file(args.json, key="--json")  # before the evaluation
    wl = _resolve_trace(args.trace, args.target)
    cap = args.max_new_tokens or wl.max_new_tokens
    base = _section(args)
    names = [s.strip() for s in args.estimator.split(",") if s.strip()]
    results: Dict[str, Dict[str, float]] = {}
    for name in names:
        if name not in ("history", "cold_start", "oracle"):
            raise InputError(f"unknown estimator {name!r} (history, cold_start, oracle)", key="--estimator")
        section = base.model_copy(update={"kind": name})
        est = make_estimator(section, true_lengths=wl.truth)
        estimate = est.estimate(wl.prompts, wl.history, cap)
        metrics = evaluate(estimate, wl.truth)
        metrics.update({k: float(v) for k, v in estimate.params.items()
                        if k in ("drift_factor", "pooled_sigma")})
        results[name] = metrics
    print(_table(wl.name, len(wl.prompts), wl.truth.shape[1], cap, base, results))
    if args.json:
        out = {"trace": wl.name, "groups": len(wl.prompts), "n": int(wl.truth.shape[1]), "max_new_tokens": cap,
               "estimator_section": base.model_dump(), "results": results}
        write_json(args.json, out, key="--json", indent=2)
    return 0


def _fmt(v: float, digits: int = 3) -> str:
    return "nan" if v != v else f"{v:.{digits}f}"


def _table(trace: str, groups: int, n: int, cap: int, section, results: Dict[str, Dict[str, float]]) -> str:
    lines: List[str] = [f"trace {trace}: {groups} groups x n={n}, max_new_tokens={cap}; "
                        f"decay={section.recency_decay} max_epochs={section.max_epochs} "
                        f"q={section.group_max_quantile} shrinkage={section.sigma_shrinkage} drift={section.drift}"]
    header = f"{'estimator':<11} {'MAE':>9} {'bias':>9} {'tau':>7} {'spearman':>8} {'tau(max)':>8} " \
             f"{'cover@q':>8} {'cold%':>6}"
    lines += [header, "-" * len(header)]
    for name, m in results.items():
        lines.append(f"{name:<11} {_fmt(m['mae'], 1):>9} {_fmt(m['bias'], 1):>9} {_fmt(m['kendall_tau']):>7} "
                     f"{_fmt(m['spearman']):>8} {_fmt(m['kendall_tau_max']):>8} "
                     f"{_fmt(m['group_max_coverage']):>8} {100 * m['cold_start_frac']:>5.1f}%")
    return "\n".join(lines)


def _synth(args) -> int:
    from mindspeed_asp.utils.atomic import check_output_file
    from mindspeed_asp.errors import InputError
    from mindspeed_asp.core.memory_budget import check_fits, synthesis_bytes
    from mindspeed_asp.scheduler.history import LengthHistory
    from mindspeed_asp.workloads.prompts import save_prompt_set
    from mindspeed_asp.workloads.synthetic import SyntheticRLWorkload

    # counts are >= 1 and numbers finite by their argparse types; outputs and size are checked before work
    out = Path(args.output)
    if out.suffix.lower() not in (".parquet", ".jsonl"):
        raise InputError("output must end in .parquet or .jsonl", path=str(out), key="-o")
    if args.truth and Path(args.truth).suffix.lower() not in (".parquet", ".jsonl"):
        raise InputError("truth file must end in .parquet or .jsonl", path=args.truth, key="--truth")
    dataset = Path(args.dataset) if args.dataset else out.with_name(out.stem + ".prompts.jsonl")
    for path, key in ((out, "-o"), (dataset, "--dataset"), (args.truth, "--truth")):
        if path:
            check_output_file(path, key=key)
    check_fits(synthesis_bytes(args.prompts, args.n, args.epochs + 1),
               f"synthesising {args.prompts} prompts x n={args.n} x {args.epochs + 1} epochs", key="--prompts")
    kw = {}
    if args.median is not None:
        kw["median_tokens"] = args.median
    if args.cap is not None:
        kw["max_new_tokens"] = args.cap
    if args.trend is not None:
        kw["trend"] = args.trend
    factory = SyntheticRLWorkload.small if args.small else SyntheticRLWorkload
    wl = factory(args.prompts, n=args.n, epochs=args.epochs + 1, seed=args.seed, **kw)
    from tqdm import tqdm

    hist = LengthHistory()
    for e in tqdm(range(args.epochs), desc="synthesising epochs", file=sys.stderr, disable=None):
        hist.add_epoch(wl.prompts.prompt_ids, e, wl.lengths(e))
    hist.save(out)  # atomic writes (temp file + rename), as every file below
    save_prompt_set(wl.prompts, dataset)
    print(f"wrote {len(hist)} records ({args.prompts} prompts x {args.epochs} epochs, n={args.n}) to {out}")
    print(f"wrote {args.prompts} prompts to {dataset} (max_new_tokens={wl.max_new_tokens})")
    if args.truth:
        truth = LengthHistory()
        truth.add_epoch(wl.prompts.prompt_ids, args.epochs, wl.lengths(args.epochs))
        truth.save(args.truth)
        print(f"wrote the true lengths of epoch {args.epochs} to {args.truth}")
    return 0


def _describe(args) -> int:
    from mindspeed_asp.utils.atomic import check_output_file, write_json
    from mindspeed_asp.workloads.synthetic import tail_statistics

    if args.json:
        check_output_file(args.json, key="--json")
    wl = _resolve_trace(args.trace, None)
    stats = tail_statistics(wl.truth)
    stats.update({"groups": float(len(wl.prompts)), "n": float(wl.truth.shape[1]),
                  "history_records": float(len(wl.history)), "max_new_tokens": float(wl.max_new_tokens)})
    width = max(len(k) for k in stats)
    print(f"trace {wl.name} (lengths of the predicted epoch)")
    for k, v in stats.items():
        print(f"  {k:<{width}} {v:,.3f}" if not float(v).is_integer() else f"  {k:<{width}} {int(v):,}")
    if args.json:
        write_json(args.json, {"trace": wl.name, **stats}, key="--json", indent=2)
    return 0
