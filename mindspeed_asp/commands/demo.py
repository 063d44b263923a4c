"""`asp demo [--out runs/demo] [key.path=value ...]`: the tiny task in `stock` and in `asp` mode, side by side.

Runs the packaged tiny_cpu.yaml (2 vLLM-CPU instances of a random-initialised tiny Qwen2, the reference
GRPO trainer, the synthetic demo task) once as MindSpeed-RL's default synchronous schedule and once with
ASP (plan + bounded lag + work stealing), with the same prompts, seeds and number of trained samples, then
prints the comparison table. By default ASP runs twice, with max_lag 1 and 2, so the table shows what a
larger max_lag buys in throughput and costs in reward. Everything is written under --out: one run directory
per variant (metrics, summary, plots) and compare.txt; an --out that already holds them is refused unless
--overwrite. A few minutes on 2 cores.

A variant is a mode with optional `@key=value` settings of the `asp:` section, e.g. `asp@max_lag=2`; its run
directory is named after it (`asp_max_lag2`). A `stock` variant runs at `asp.max_lag=0` (stock trains at lag 0
only), whatever the config or a command-line override gives the others.
"""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import List, Tuple

from mindspeed_asp.errors import ConfigError

DEFAULT_VARIANTS = "stock,asp,asp@max_lag=2"


def parse_variants(spec: str) -> List[Tuple[str, str, List[str]]]:
    """`stock,asp@max_lag=2` -> [(name, mode, asp overrides)]; names are unique directory names. A variant of a
    mode that trains at lag 0 only (stock) without its own `@max_lag=` gets `asp.max_lag=0`, so the lag the config
    or the command line sets for the other variants does not make its config refused."""
    from mindspeed_asp.config import AspSection, override_key

    variants = []
    for item in filter(None, (x.strip() for x in spec.split(","))):
        mode, *settings = item.split("@")
        overrides = []
        for setting in settings:
            if "=" not in setting:
                raise ConfigError(f"variant {item!r}: setting {setting!r} must look like key=value", key="--modes")
            overrides.append(f"asp.{setting}")
        name = mode + "".join("_" + s.replace("=", "") for s in settings)
        if any(name == v[0] for v in variants):
            raise ConfigError(f"variant {item!r} is listed twice", key="--modes")
        if mode in AspSection.LAG0_MODES and "asp.max_lag" not in {override_key(o) for o in overrides}:
            overrides.append("asp.max_lag=0")
        variants.append((name, mode, overrides))
    if not variants:
        raise ConfigError("no variant to run", key="--modes")
    return variants


def _variant_overrides(overrides: List[str], settings: List[str]) -> List[str]:
    """The command line's overrides for one variant, then the variant's own settings: a variant's setting
    (`asp@max_lag=2`) replaces the same key of a command-line override for that variant only (the others keep
    the command line's value). Two command-line overrides of one key are refused (`with_flags`)."""
    from mindspeed_asp.config import check_unique_overrides, override_key

    check_unique_overrides(list(overrides))
    own = {override_key(s) for s in settings}
    return [o for o in overrides if override_key(o) not in own] + list(settings)


def handler(args: argparse.Namespace) -> int:
    from mindspeed_asp.utils.atomic import check_output_dir, write_text
    from mindspeed_asp.commands.compare import compare_runs
    from mindspeed_asp.commands.train import build_config
    from mindspeed_asp.utils.extras import require
    from mindspeed_asp.utils.run_dir import prepare_run_dir

    out = Path(args.out)
    variants = parse_variants(args.modes)
    # Every config is validated before Ray starts, so a bad override fails in a second, not minutes in.
    cfgs = [build_config(args.config, _variant_overrides(args.overrides, extra), mode, str(out / name),
                         flag_names={"--mode": "--modes"})
            for name, mode, extra in variants]
    # So is the output: a demo directory that holds runs is refused unless --overwrite (checked for every
    # variant before any is cleared, so a refusal removes nothing).
    check_output_dir(out, key="--out")
    if not args.overwrite:
        for name, _, _ in variants:
            prepare_run_dir(out / name, overwrite=False, key="--out")
        prepare_run_dir(out, overwrite=False, key="--out", markers=("compare.txt",))
    # Only then the install (a config typo is the user's first news even without the runtime extra), and
    # before anything is cleared: a core-only install's refusal leaves old runs whole.
    require("asp demo")  # a core-only install gets the pip line, not a ModuleNotFoundError
    for name, _, _ in variants:
        prepare_run_dir(out / name, overwrite=True, key="--out")
    prepare_run_dir(out, overwrite=True, key="--out", markers=("compare.txt",))
    from mindspeed_asp.runtime import ray_utils
    from mindspeed_asp.runtime.driver import QUIET_ENV, run_training
    from mindspeed_asp.runtime.stop_signals import RunInterrupted, exit_status
    # The engines' own log lines (vLLM start-up, per-sync reload notices) would bury the table: they stay in
    # Ray's session logs (/tmp/ray/session_latest/logs) unless --verbose; actor errors still reach us.
    try:
        ray_utils.start_local_ray_shielded(num_cpus=cfgs[0].run.ray_num_cpus,
                                           object_store_mb=cfgs[0].run.ray_object_store_mb, env=QUIET_ENV,
                                           log_to_driver=bool(args.verbose))
    except RunInterrupted as exc:
        print(f"asp demo: {exc} while Ray started: stopped, nothing run", file=sys.stderr)
        return exit_status(exc.signum)
    try:
        for (name, _, _), cfg in zip(variants, cfgs):
            print(f"== {name}: {cfg.asp.instances} instances, {cfg.run.steps} updates of "
                  f"{cfg.asp.minibatch_groups} groups x {cfg.data.n} samples, "
                  + f"max_lag {cfg.asp.max_lag}" + (" (synchronous)" if cfg.asp.max_lag == 0 else ""),
                  flush=True)
            summary = run_training(cfg, out / name, progress=not args.quiet)
            if summary.get("interrupted"):  # SIGINT/SIGTERM: the later variants are not started
                print(f"{name} interrupted by {summary.get('stop_signal')} after {summary.get('steps')} updates; "
                      f"`asp train --resume {out / name}` continues it", file=sys.stderr)
                return exit_status(signal.Signals[summary["stop_signal"]])
    finally:
        ray_utils.stop_local_ray()
    table, _ = compare_runs([out / name for name, _, _ in variants])
    write_text(out / "compare.txt", table + "\n")
    print(table)
    print(f"runs, plots and compare.txt under {out}/")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("demo",
                              help="tiny CPU run: stock vs asp (max_lag 1, 2) on 2 instances, with the comparison",
                              description=__doc__)
    p.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    p.add_argument("--config", help="run config (default: the packaged tiny_cpu.yaml)")
    p.add_argument("--modes", default=DEFAULT_VARIANTS,
                   help=f"comma-separated variants, mode[@key=value...] (default {DEFAULT_VARIANTS})")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the runs already under --out (their run files and compare.txt are removed first)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--verbose", action="store_true", help="show the engines' own log lines (vLLM, Ray workers)")
    p.add_argument("overrides", nargs="*", metavar="key.path=value", help="config overrides")
    p.set_defaults(func=handler)
