"""The cluster-launch run's training entry: MindSpeed-RL's `cli/train_grpo.py`, started by the launcher's
`asp_train` exactly as on a cluster (same arguments, same working directory), behind the CPU stand-ins.

Two things differ from running `cli/train_grpo.py` itself, both only because a CPU cannot run the NPU stack:
- the stand-ins are installed in this driver before MindSpeed-RL is imported, and `initialize_megatron` in the
  `train` task's globals is the stand-in's (see cpu_standins.py);
- the runtime environment MindSpeed-RL's `main()` hands to `ray.init` (the file `ASP_RUNTIME_ENV` names, which
  the launcher set to ASP's `runtime_env.yaml`) is ASP's file plus the stand-in modules as Ray `py_modules` and
  the tier's setup hook, which installs them and then runs ASP's own `apply_all`. So the workers get the
  stand-ins the way a cluster ships code to Ray workers, not through PYTHONPATH, and ASP's patches the way the
  cluster applies them.
"""
from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIPPED_MODULES = ("cpu_standins.py", "cpu_engine_standins.py")


def tier_runtime_env(asp_env_file: Path, out: Path) -> Path:
    """ASP's runtime_env.yaml with the stand-ins shipped as py_modules and the tier's hook in front of ASP's."""
    import yaml
    env = yaml.safe_load(asp_env_file.read_text())
    asp_hook = env.get("worker_process_setup_hook")
    if asp_hook != "mindspeed_asp.integrations.mindspeed_rl.setup_hook.apply_all":
        raise SystemExit(f"{asp_env_file}: expected ASP's worker_process_setup_hook, found {asp_hook!r}")
    env["worker_process_setup_hook"] = "cpu_standins.setup_hook"  # installs, then calls ASP's apply_all
    env["py_modules"] = [str(HERE / name) for name in SHIPPED_MODULES]
    out.write_text(yaml.safe_dump(env, sort_keys=False))
    return out


def main() -> None:
    msrl = Path(os.environ["MINDSPEED_RL_ROOT"]).resolve()
    import cpu_standins
    cpu_standins.install()
    composed = Path(os.environ["ASP_MSRL_CONFIG"])
    os.environ["ASP_RUNTIME_ENV"] = str(tier_runtime_env(Path(os.environ["ASP_RUNTIME_ENV"]),
                                                         composed.parent / "runtime_env_cpu_tier.yaml"))
    entry = msrl / "cli" / "train_grpo.py"
    launcher = runpy.run_path(str(entry), run_name="msrl_train_grpo")
    # run_path returns a copy of the script's globals; the functions share the real ones
    launcher["train"]._function.__globals__["initialize_megatron"] = cpu_standins.initialize_megatron
    sys.argv[0] = str(entry)
    launcher["main"]()


if __name__ == "__main__":
    main()
