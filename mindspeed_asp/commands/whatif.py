"""`asp whatif`: on N devices, colocated stock or a rollout/trainer split, which split and max_lag, how much faster?

Sweeps rollout devices (N/4 .. 7N/8 in TP steps) x max_lag x planner (stock = MindSpeed-RL's colocated
iteration, async, asp; stock_split on request) in the cluster model (`mindspeed_asp/sim/cluster.py`), prints
the table, the best split and max_lag per staleness bound with its speed-up over colocated stock, and every
assumption; writes whatif.json and whatif.png with --out. `--config configs/X.yaml` takes the model, devices,
TP, batch and lengths of one MindSpeed-RL + ASP config. Heavy imports stay inside the handler.
"""
from __future__ import annotations

import argparse
import sys
from typing import List

from mindspeed_asp.utils.argtypes import nonneg_float, positive_float, positive_int


def _int_list(text: str, key: str) -> List[int]:
    from mindspeed_asp.errors import InputError

    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"expected a comma list of integers like 1,2,4, got {text!r}", key=key) from None
    if not vals or any(v < 0 for v in vals):
        raise InputError(f"expected integers >= 0, got {text!r}", key=key)
    return vals


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "whatif", help="capacity planner: colocated stock vs rollout/trainer splits x max_lag on N devices",
        description="Simulate colocated stock MindSpeed-RL (all devices generate, then all train) against every "
                    "rollout/trainer split in the async and ASP modes at each max_lag, at steady state over "
                    "several windows, and print the best split and max_lag per staleness bound. e2e_tps = "
                    "tokens / (all devices x seconds). Every cost is a stated preset or a file you give.")
    p.add_argument("--config", default=None, help="a MindSpeed-RL + ASP config (configs/*.yaml): model, devices, "
                   "TP, batch, n, max response tokens and its own split")
    p.add_argument("--model", default=None, help="model preset: qwen25_7b, qwen25_32b, qwen3_8b, qwen3_30b_a3b")
    p.add_argument("--device", default=None, choices=("A3", "A2"), help="device preset (default A3)")
    p.add_argument("--devices", type=positive_int, default=None, help="N, all devices of the run")
    p.add_argument("--tp", type=positive_int, default=None, help="devices per inference instance (default: "
                   "the smallest power of two whose instances hold the weights and 16k KV tokens at both "
                   "--mem-util and --mem-util-colocated)")
    p.add_argument("--cost-file", default=None, help="decode cost JSON (a, b, c, p) from `asp fit-cost`, for "
                   "instances of --tp devices (replaces the preset's formula)")
    p.add_argument("--calibrate-log", default=None, help="a stock MindSpeed-RL training log: timing/update "
                   "sets the trainer speed, timing/rollout scales the decode cost")
    p.add_argument("--workload", default=None, help="lengths: synthetic:... | history:<file> | alpaca:<path> | "
                   "splitwise:<path> (default: synthetic with the run's n, cap and median cap/4)")
    p.add_argument("--windows", type=positive_int, default=6, help="consecutive iterations simulated (>= 3)")
    p.add_argument("--window-groups", type=positive_int, default=None, help="prompt groups per iteration")
    p.add_argument("--minibatch", type=positive_int, default=None, help="groups per update")
    p.add_argument("--slots", type=positive_int, default=None, help="max concurrent sequences per instance")
    p.add_argument("--max-lag", default="1,2,4", help="comma list of max_lag values")
    p.add_argument("--planners", default="stock,async,asp", help="comma list of stock (colocated), "
                   "stock_split, async, asp")
    p.add_argument("--splits", default=None, help="comma list of rollout device counts (default N/4 .. 7N/8)")
    p.add_argument("--extra-passes", type=nonneg_float, default=None, help="forward passes per token besides "
                   "the update (reference + old log-prob = 2)")
    p.add_argument("--train-efficiency", type=positive_float, default=None, help="share of linear scaling "
                   "the trainer keeps (0..1]")
    p.add_argument("--train-overhead", type=nonneg_float, default=None, help="seconds per update")
    p.add_argument("--sync-time", type=nonneg_float, default=None, help="seconds per weight sync of a split")
    p.add_argument("--switch-time", type=nonneg_float, default=None, help="seconds of the colocated phase "
                   "switch per iteration")
    p.add_argument("--mem-util", type=positive_float, default=None, help="HBM share of a split's instances")
    p.add_argument("--mem-util-colocated", type=positive_float, default=None, help="HBM share of a colocated "
                   "instance")
    p.add_argument("--no-refine", action="store_true", help="skip re-simulating the best asp split of each "
                   "max_lag under the planner's full search")
    p.add_argument("--out", default=None, help="directory for whatif.json and whatif.png")
    p.add_argument("--json", default=None, help="also write the JSON here")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=handle)


def make_setting(args: argparse.Namespace):
    """The Setting of the flags (--config first, flags override it); errors name the flag."""
    from mindspeed_asp.cost_model import load_cost_json
    from mindspeed_asp.errors import InputError
    from mindspeed_asp.experiments import whatif as wi
    from mindspeed_asp.sim.model_presets import get_device, get_preset

    over = dict(devices=args.devices, tp=args.tp, window_groups=args.window_groups, minibatch=args.minibatch,
                slots=args.slots, extra_passes=args.extra_passes, train_efficiency=args.train_efficiency,
                train_overhead_s=args.train_overhead, sync_s=args.sync_time, switch_s=args.switch_time,
                mem_util_split=args.mem_util, mem_util_colocated=args.mem_util_colocated)
    if args.model:
        over["preset"] = get_preset(args.model)
    if args.device:
        over["device"] = get_device(args.device)
    if args.train_efficiency is not None and args.train_efficiency > 1:
        raise InputError(f"must be in (0, 1], got {args.train_efficiency}", key="--train-efficiency")
    for flag, v in (("--mem-util", args.mem_util), ("--mem-util-colocated", args.mem_util_colocated)):
        if v is not None and v > 1:
            raise InputError(f"must be in (0, 1], got {v}", key=flag)
    if args.config:
        s = wi.setting_from_config(args.config, **over)
    else:
        if not args.model:
            raise InputError("give --model (a preset) or --config", key="--model")
        if args.devices is None:
            raise InputError("give --devices (all devices of the run) or --config", key="--devices")
        over.setdefault("device", get_device("A3"))
        if over.get("tp") is None:  # the smallest TP whose instances hold the model, split and colocated alike
            utils = (over.get("mem_util_split") or wi.Setting.mem_util_split,
                     over.get("mem_util_colocated") or wi.Setting.mem_util_colocated)
            over["tp"] = max(over["preset"].min_tp(over["device"], u) for u in utils)
        s = wi.Setting(**{k: v for k, v in over.items() if v is not None}, name=f"{args.model}_{args.devices}")
    if s.devices % s.tp:
        raise InputError(f"{s.devices} devices are not a multiple of TP {s.tp}", key="--tp")
    wi.check_fits(s, tp_key="--tp" if args.tp is not None or not args.config
                  else "generate_config.infer_tensor_parallel_size")
    from_config = bool(args.config)
    wi.check_shape(s, args.windows,
                   slots_key="asp.slots" if from_config and args.slots is None else "--slots",
                   groups_key="megatron_training.global_batch_size" if from_config and args.window_groups is None
                   else "--window-groups")
    if args.cost_file:
        s = wi.with_overrides(s, cost_override=load_cost_json(args.cost_file, key="--cost-file"))
    return s


def handle(args: argparse.Namespace) -> int:
    from mindspeed_asp.utils.atomic import check_output_dir, write_json
    from mindspeed_asp.errors import InputError
    from mindspeed_asp.experiments import whatif as wi

    out = check_output_dir(args.out, key="--out") if args.out else None
    lags = _int_list(args.max_lag, "--max-lag")
    planners = [x.strip() for x in args.planners.split(",") if x.strip()]
    for pl in planners:
        if pl not in wi.PLANNER_MODES:
            raise InputError(f"unknown planner {pl!r}; choose from {', '.join(wi.PLANNER_MODES)}", key="--planners")
    if not planners:
        raise InputError("no planners given", key="--planners")
    if args.windows < 3:
        raise InputError(f"steady state needs >= 3 windows, got {args.windows}", key="--windows")
    s = make_setting(args)
    splits = _int_list(args.splits, "--splits") if args.splits else None
    if splits:
        bad = [r for r in splits if r % s.tp or not 0 < r < s.devices]
        if bad:
            raise InputError(f"rollout devices {bad[0]} must be a multiple of TP {s.tp} in (0, {s.devices})",
                             key="--splits")
    spec = args.workload or wi.default_workload(s, args.windows)
    wins = wi.make_windows(spec, s, args.windows)
    say = (lambda m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    if args.calibrate_log:
        from mindspeed_asp.integrations.mindspeed_rl.log_reader import read_training_log

        summ = read_training_log(args.calibrate_log, skip_first=1)
        s = wi.calibrate_from_log(s, summ, args.calibrate_log, wins)
        say(f"calibrated from {args.calibrate_log}: {s.sources.get('calibration', '')}")
    rows = wi.sweep(s, wins, planners, lags, splits=splits, progress=say, refine=not args.no_refine)
    summary = wi.summarize(s, rows, lags)
    model_info = wi.assumptions(s)
    print(f"{s.name or s.preset.name}: {s.devices} x {s.device.name}, TP{s.tp}, {wins.count} windows of "
          f"{s.window_groups} groups x n={wins.prompts.n} (M={s.minibatch}), workload {spec}")
    print(wi.format_rows(rows))
    print()
    print(wi.format_best(summary))
    print("\nassumptions:")
    for k, v in model_info.items():
        print(f"  {k}: {v}")
    payload = {"setting": wi.setting_json(s), "workload": spec, "windows": wins.count, "max_lags": lags,
               "planners": planners, "rows": rows, "summary": summary, "assumptions": model_info}
    files = []
    for path, key in ((out / "whatif.json" if out else None, "--out"), (args.json, "--json")):
        if path:
            files.append(write_json(path, payload, key=key, indent=2, default=float))
    if out and not args.no_plots:
        files.append(wi.plot(rows, out / "whatif.png", title=f"{s.name or s.preset.name}: {s.devices} devices"))
    if files:
        print("wrote " + ", ".join(str(f) for f in files))
    return 0
