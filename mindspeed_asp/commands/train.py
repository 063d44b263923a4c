"""`asp train --config FILE [--mode stock|async|asp] [--ray-address ADDR] [key.path=value ...] [--out DIR]`.

One full run. The config is validated (unknown key, wrong type, impossible value, a plan for another dataset)
before Ray starts; the run shows a progress bar (step, reward, lag, queue, tokens/s), writes metrics.jsonl,
summary.json, trace.json and plots under the output directory. It starts and stops its own local Ray, or with
`--ray-address` (`run.ray_address`) runs its rollout instances on an existing, possibly multi-node, Ray
cluster and only disconnects from it at the end. An output directory that already holds a run is refused
unless `--resume` or `--overwrite`; the engines' own log lines are shown only with `--verbose`.

`asp train --resume DIR [run.steps=N ...]` continues the run in DIR from its latest checkpoint (written every
`run.checkpoint_every` updates and whenever a run stops) under the config stored in it; only keys that keep
the run's meaning may be overridden (`run.steps` extends a run). SIGINT or SIGTERM stops a run after the
current update with a checkpoint, a summary marked interrupted and the plots (exit status 128 + signal); a
second signal aborts at once.
"""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple


#: The flags that set a config key, as (flag, key): a flag and an override of its key are refused together.
FLAG_KEYS = (("--mode", "asp.mode"), ("--out", "run.out"), ("--ray-address", "run.ray_address"))


def with_flags(overrides: List[str], given: Dict[str, Optional[str]],
               names: Optional[Dict[str, str]] = None) -> Tuple[List[str], Dict[str, str]]:
    """(the overrides plus one `key=value` per flag given, {flag's override: the flag as typed}) (`given`: flag ->
    value or None). Why overrides: a flag is then validated, and named in errors, exactly as an override of its
    key. A key set twice, by two overrides or by a flag and an override, is refused naming both: the last would
    win silently. `names` renames a flag in the messages (`asp demo` sets asp.mode from --modes)."""
    from mindspeed_asp.config import check_unique_overrides, flag_override, override_key
    from mindspeed_asp.errors import ConfigError

    check_unique_overrides(list(overrides))
    extra = list(overrides)
    flags: Dict[str, str] = {}
    for flag, key in FLAG_KEYS:
        value = given.get(flag)
        if not value:
            continue
        shown = (names or {}).get(flag, flag)
        clash = next((o for o in overrides if override_key(o) == key), None)
        if clash is not None:
            raise ConfigError(f"set twice, by {shown} {value} and the override {clash!r}: give it once",
                              path="command line", key=key)
        item = flag_override(key, value)  # quoted: "host:port" or an --out of digits stays a string
        extra.append(item)
        flags[item] = f"{shown} {value}"
    return extra, flags


def build_config(config: Optional[str], overrides: List[str], mode: Optional[str] = None,
                 out: Optional[str] = None, ray_address: Optional[str] = None,
                 flag_names: Optional[Dict[str, str]] = None):
    """Load and validate the run config (packaged tiny_cpu.yaml when `config` is None)."""
    from mindspeed_asp.runtime.run_config import load_run_config, packaged_config_path

    extra, flags = with_flags(overrides, {"--mode": mode, "--out": out, "--ray-address": ray_address}, flag_names)
    path = config or str(packaged_config_path())
    cfg = load_run_config(path, extra, devices=_device_count(), flags=flags)
    _check_plan(cfg, path)
    _check_cost_file(cfg, path)
    return cfg


def _check_cost_file(cfg, path: str) -> None:
    """asp.cost.file is read whole now, not when the planner starts after Ray and the engines: a bad value or
    a key given twice stops the run before anything starts, naming the cost file's line and key."""
    if not cfg.asp.cost.file:
        return
    from mindspeed_asp.cost_model import load_cost_json
    from mindspeed_asp.errors import ConfigError, InputError

    try:
        load_cost_json(cfg.asp.cost.file, key="asp.cost.file")
    except InputError as exc:
        raise ConfigError(f"cost file refused: {exc}", path=path, key="asp.cost.file") from None


def _device_count() -> Optional[int]:
    """Accelerators visible to this process (None on CPU, where logical slots apply)."""
    from mindspeed_asp.runtime.platform import current_platform

    plat = current_platform()
    if not plat.is_accelerator:
        return None
    return int(plat.device_count())


def _check_plan(cfg, path: str) -> None:
    """A given plan must have been built for this run: its dataset (fingerprint) and every setting the plan
    depends on (instances, slots, n, minibatch, window, cap, max_lag, stealing, planner:
    `run_config.plan_settings`), else stop before Ray. A plan that does not record some of them (built by
    hand, or by code that fills a partial header) is checked on the rest, with a warning naming them."""
    if not cfg.asp.plan_path:
        return
    from mindspeed_asp.errors import ConfigError, InputError, PlanMismatchError
    from mindspeed_asp.runtime.tasks import task_and_prompts
    from mindspeed_asp.runtime.run_config import PLAN_SETTING_KEYS, plan_settings
    from mindspeed_asp.scheduler.plan_file import DispatchPlan

    _, prompts = task_and_prompts(cfg)
    try:
        plan = DispatchPlan.load(cfg.asp.plan_path, prompts=prompts)
    except (PlanMismatchError, InputError) as exc:
        raise ConfigError(f"plan does not fit this run: {exc}", path=path, key="asp.plan_path") from None
    if plan.instances != cfg.asp.instances:
        raise ConfigError(f"plan {cfg.asp.plan_path} is for {plan.instances} instances, the run has "
                          f"{cfg.asp.instances}", path=path, key="asp.plan_path")
    try:
        unchecked = plan.check_settings(plan_settings(cfg, len(prompts)), PLAN_SETTING_KEYS)
    except PlanMismatchError as exc:
        raise ConfigError(f"plan does not fit this run: {exc}", path=path, key="asp.plan_path") from None
    if unchecked:
        print(f"asp train: warning: plan {cfg.asp.plan_path} does not record {', '.join(unchecked)}, so they are "
              "not checked against the run; rebuild it with `asp plan` to have them checked", file=sys.stderr)


def check_output(out: Path, overwrite: bool, key: str) -> None:
    """Refuse an output that cannot take a run, removing nothing: a later refusal (a missing extra) must
    leave an old run whole, so `--overwrite` clears it only once everything has been checked."""
    from mindspeed_asp.utils.atomic import check_output_dir
    from mindspeed_asp.utils.run_dir import prepare_run_dir

    check_output_dir(out, key=key)
    if not overwrite:
        prepare_run_dir(out, overwrite=False, key=key, resume_flag="--resume")  # a directory holding a run


def resume_setup(args: argparse.Namespace):
    """(config, run directory, checkpoint directory) of `--resume DIR`: the checkpoint's config with the
    overrides a resume allows (runtime/resume.py); refused before Ray starts."""
    from mindspeed_asp.errors import ConfigError
    from mindspeed_asp.runtime.checkpoint import STATE_FILE, latest_checkpoint, read_state
    from mindspeed_asp.runtime.resume import resume_config

    for flag, given in (("--overwrite", args.overwrite), ("--config", args.config)):
        if given:
            raise ConfigError(f"{flag} cannot go with --resume (a resumed run keeps its directory and the config "
                              f"stored in its checkpoint)", key=flag)
    out = Path(args.resume)
    if args.out and Path(args.out).resolve() != out.resolve():
        raise ConfigError(f"--out {args.out} differs from --resume {args.resume}; a resumed run writes into its "
                          f"own directory", key="--out")
    ckpt = latest_checkpoint(out)
    state = read_state(ckpt)
    extra, _ = with_flags(args.overrides, {"--mode": args.mode, "--ray-address": args.ray_address})
    where = str(ckpt / STATE_FILE)
    cfg = resume_config(state["config"], str(out), int(state["version"]), extra, where=where,
                        devices=_device_count())
    _check_plan(cfg, where)  # the run reads its plan file again: it must still be the one it was built for
    return cfg, out, ckpt


def handler(args: argparse.Namespace) -> int:
    from mindspeed_asp.utils.extras import require
    from mindspeed_asp.utils.run_dir import prepare_run_dir

    # The user's own mistakes first (config, outputs: core install only), then the install's: a typo in the
    # config is reported as such even where the runtime extra is missing.
    ckpt = None
    if args.resume:
        cfg, out, ckpt = resume_setup(args)
        require("asp train")
    else:
        cfg = build_config(args.config, args.overrides, args.mode, args.out, args.ray_address)
        out = Path(cfg.run.out)
        key = "--out" if args.out else "run.out"
        check_output(out, args.overwrite, key)
        require("asp train")  # a core-only install gets the pip line, not a ModuleNotFoundError
        prepare_run_dir(out, args.overwrite, key=key, resume_flag="--resume")
    from mindspeed_asp.runtime import ray_utils
    from mindspeed_asp.runtime.driver import QUIET_ENV, run_training
    from mindspeed_asp.runtime.platform import current_platform, platform_from_name
    from mindspeed_asp.runtime.stop_signals import RunAborted, RunInterrupted, exit_status

    local = cfg.run.ray_address is None
    try:
        if local:
            # As in `asp demo`: the engines' own log lines (vLLM start-up and warnings, per-sync reload notices)
            # stay in Ray's session logs unless --verbose; actor errors still reach us. A signal while Ray
            # starts stops once it is whole (no half-started Ray, no crash at exit).
            plat = platform_from_name(cfg.run.platform) if cfg.run.platform else current_platform()
            ray_utils.start_local_ray_shielded(num_cpus=cfg.run.ray_num_cpus,
                                               object_store_mb=cfg.run.ray_object_store_mb, platform=plat,
                                               env=QUIET_ENV, log_to_driver=bool(args.verbose))
        summary = run_training(cfg, out, progress=not args.quiet, resume=ckpt)
    except RunInterrupted as exc:
        print(f"asp train: {exc} during start-up: stopped, nothing trained in this part"
              + (f"; {out} still resumes from {ckpt.name}" if ckpt else ""), file=sys.stderr)
        return exit_status(exc.signum)
    except RunAborted as exc:
        print(f"asp train: aborted by a second {exc}; `asp train --resume {out}` continues from the last "
              f"checkpoint written before it, if any", file=sys.stderr)
        return exit_status(exc.signum)
    finally:
        if local:
            ray_utils.stop_local_ray()
    print(format_summary(summary, out))
    if summary.get("interrupted"):
        if summary.get("stop_reason"):  # the run stopped itself (Ray's GCS gone): not a signal, exit 1
            print(f"stopped at update {summary.get('steps')} of {summary.get('steps_planned')}: "
                  f"{summary['stop_reason']}; checkpoint written; continue with: asp train --resume {out}")
            return 1
        print(f"interrupted by {summary.get('stop_signal')} at update {summary.get('steps')} of "
              f"{summary.get('steps_planned')}; checkpoint written; continue with: asp train --resume {out}")
        return exit_status(signal.Signals[summary["stop_signal"]]) if summary.get("stop_signal") else 1
    return 0


def format_summary(s: Dict[str, Any], out: Path) -> str:
    keys = ["throughput/e2e_tps", "throughput/rollout_tps", "time/iteration", "time/weight_sync",
            "bubble/padding", "bubble/skewness", "bubble/sorting", "lag/mean", "lag/max", "reward/final"]
    state = f", interrupted at {s.get('steps')} of {s.get('steps_planned')}" if s.get("interrupted") else ""
    lines = [f"run {out} ({s.get('mode')}, {s.get('steps')} updates{state})"]
    for k in keys:
        v = s.get(k)
        lines.append(f"  {k:24s} {v:.4g}" if isinstance(v, (int, float)) else f"  {k:24s} {v}")
    from mindspeed_asp.utils.run_report import format_events  # what happened: deaths, re-dispatches, regenerated, ...

    lines.append(f"  {'events':24s} {format_events(s)}")
    lines.append(f"  metrics: {out / 'metrics.jsonl'}  summary: {out / 'summary.json'}")
    return "\n".join(lines)


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="run the asynchronous runtime (stock / async / asp mode)",
                              description=__doc__)
    p.add_argument("--config", help="run config YAML (default: the packaged tiny_cpu.yaml)")
    p.add_argument("--mode", choices=["stock", "async", "asp"], help="overrides asp.mode")
    p.add_argument("--out", help="output directory (overrides run.out)")
    p.add_argument("--ray-address", help="run on this existing Ray cluster ('auto', 'host:port'; overrides "
                   "run.ray_address); default: start a local Ray and stop it afterwards")
    p.add_argument("--resume", metavar="DIR",
                   help="continue the run in DIR from its latest checkpoint, under its own config (overrides "
                   "limited to run.steps, run.checkpoint_every, reporting and Ray settings)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run already in the output directory (its run files are removed first)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--verbose", action="store_true", help="show the engines' own log lines (vLLM, Ray workers)")
    p.add_argument("overrides", nargs="*", metavar="key.path=value", help="config overrides")
    p.set_defaults(func=handler)
