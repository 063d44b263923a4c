"""Run MindSpeed-RL's own GRPO `train` task on a CPU, the way `cli/train_grpo.py` does on a cluster.

    python run_msrl.py --workdir DIR --mode {stock,asp0,asp1,async1} [--without-asp] [--iters 3]
        [--tag NAME] [--save-interval K] [--stop-after-save K | --resume]

The driver installs the CPU stand-ins, imports MindSpeed-RL (`cli/train_grpo.py`, as a cluster's launcher
does), starts a local Ray with the project's `runtime_env.yaml` (its `worker_process_setup_hook` is ASP's,
behind the stand-ins), and calls `train.remote(config)`. Everything the workers print reaches this process's
stdout (Ray forwards it); the workers' own output files are also copied to `worker_output.log` in the run
directory, complete (Ray's forwarding can drop the last lines at shutdown). The tier's tests read those and
ASP's audit file.

A pre-empted run and its restart: `--stop-after-save K` kills the run (every Ray process at once, as a scheduler
pre-empts a job) once the checkpoint of iteration K and ASP's state beside it exist; `--resume` runs the same directory
again from its checkpoint (Megatron's `finetune` off, the plan kept), auditing into `asp_audit_resume.jsonl`.
"""
from __future__ import annotations

import argparse
import json
import signal
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests"))

MODES = {  # name -> the asp: section (stock keeps one so the run YAML has the same shape)
    "stock": {"mode": "stock", "instances": 1, "max_lag": 0},
    "asp0": {"mode": "colocated", "instances": 1, "max_lag": 0},  # the plan on MindSpeed-RL's own engines
    "asp1": {"mode": "asp", "instances": 2, "max_lag": 1},
    "async1": {"mode": "async", "instances": 1, "max_lag": 1},
}


def build_plan(workdir: Path, cfg_path: Path, gbs: int, n: int, instances: int, max_lag: int, iters: int,
               max_tokens: int) -> Path:
    """What node 0 of a cluster run does (shell/msrl_common.sh): export the prompts in the loader's draw order
    with ASP's exporter, then `asp plan` with the run's batch shape."""
    prompts = workdir / "prompts.jsonl"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.environ["MINDSPEED_RL_SRC"], str(HERE)]))
    code = ("import cpu_standins; cpu_standins.install(); import sys; "
            "from mindspeed_asp.integrations.mindspeed_rl.export_prompts import main; "
            f"sys.exit(main(['--config', {str(cfg_path)!r}, '-o', {str(prompts)!r}, '--train-iters', '{iters}']))")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=str(workdir))
    plan = workdir / "plan.parquet"
    subprocess.run([sys.executable, "-m", "mindspeed_asp.cli", "plan", "--dataset", str(prompts),
                    "--instances", str(instances), "--slots", "8", "--minibatch", str(gbs), "--n", str(n),
                    "--groups-per-iteration", str(gbs), "--max-new-tokens", str(max_tokens),
                    "--max-lag", str(max_lag), "--planner", "asp", "-o", str(plan), "--no-progress"],
                   check=True, env=env, cwd=str(workdir))
    return plan


def collect_worker_output(session_dir: str, dest: Path) -> None:
    """Copy what every Ray worker wrote (its stdout and stderr files in the session's log folder) to `dest`.

    The driver's copy of worker output is forwarded asynchronously, so its last lines can be lost when the
    driver shuts Ray down right after `train` returns; the files the workers write are complete."""
    logs = Path(session_dir) / "logs"
    with dest.open("w") as out:
        for f in sorted(logs.glob("worker-*.out")) + sorted(logs.glob("worker-*.err")):
            out.write(f.read_text(errors="replace"))


def stop_after(path: Path, session_dir: str, worker_log: Path, message: str, poll_s: float = 0.2) -> threading.Thread:
    """Pre-empt the run once `path` exists, as a cluster scheduler does: every Ray process is killed at once
    (no graceful shutdown in which the train task could go on to the next checkpoint), then this driver exits."""
    def watch() -> None:
        while not path.exists():
            time.sleep(poll_s)
        print(f"[msrl-e2e] {path.name} written: stopping the run", flush=True)
        import ray
        node = ray._private.worker._global_node  # noqa: SLF001 - the only handle on the local cluster's processes
        node.kill_all_processes(check_alive=False, allow_graceful=False)
        collect_worker_output(session_dir, worker_log)
        print(message, flush=True)
        sys.stderr.flush()
        os._exit(0)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def kill_instance_after(audit: Path, updates: int, actor: str, out: Path, poll_s: float = 0.2) -> threading.Thread:
    """Crash one rollout TP rank (SIGKILL to its process, as an OOM kill or a device fault does) once the audit
    holds `updates` records; its time goes to out/killed.json. The run must then end fast, with the named error."""
    def watch() -> None:
        while not (audit.exists() and len(audit.read_text().splitlines()) >= updates):
            time.sleep(poll_s)
        import ray
        info = ray.get(ray.get_actor(actor).ready.remote(), timeout=60)
        os.kill(int(info["pid"]), signal.SIGKILL)
        (out / "killed.json").write_text(json.dumps({"actor": actor, "pid": info["pid"], "time": time.time()}))
        print(f"[msrl-e2e] killed {actor} (pid {info['pid']}) after {updates} updates", flush=True)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--mode", choices=sorted(MODES), required=True)
    ap.add_argument("--without-asp", action="store_true", help="stock MindSpeed-RL, ASP not installed")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--gbs", type=int, default=2)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--tag", default="", help="suffix of the run directory (runs of one mode kept apart)")
    ap.add_argument("--save-interval", type=int, default=1000, help="megatron_training.save_interval")
    run_kind = ap.add_mutually_exclusive_group()
    run_kind.add_argument("--stop-after-save", type=int, metavar="K",
                          help="interrupt the run once iteration K's checkpoint and ASP state are written")
    run_kind.add_argument("--resume", action="store_true", help="relaunch the run directory: the shipped finetune "
                          "semantics stay, and the launcher's own resume composition switches to the checkpoint")
    ap.add_argument("--kill-instance-after", type=int, metavar="K",
                    help="SIGKILL rollout instance 1's TP rank 0 once K updates are audited (the run must fail fast)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="a launch-line Hydra override, composed into the config file as shell/ launchers do")
    args = ap.parse_args()
    root = Path(args.workdir).resolve()
    out = root / (args.mode + ("-noasp" if args.without_asp else "") + (f"-{args.tag}" if args.tag else ""))
    out.mkdir(parents=True, exist_ok=True)
    msrl = os.environ["MINDSPEED_RL_SRC"]
    sys.path.insert(0, msrl)

    import cpu_standins
    cpu_standins.install()
    import fixtures
    import yaml
    model = fixtures.make_model(root)
    data = fixtures.make_dataset(root, model, count=(args.iters + 4) * args.gbs)
    audit = out / ("asp_audit_resume.jsonl" if args.resume else "asp_audit.jsonl")
    asp = dict(MODES[args.mode], slots=8, minibatch_groups=args.gbs, audit_path=str(audit))
    cfg = fixtures.run_config(model, data, out, gbs=args.gbs, n=args.n, iters=args.iters, asp=asp)
    cfg["megatron_training"]["save_interval"] = args.save_interval
    cfg_path = out / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    if asp["mode"] in ("asp", "colocated"):  # the modes that follow a plan
        plan = out / "plan.parquet"
        if not (args.resume and plan.is_file()):  # a restart keeps the run's plan
            plan = build_plan(out, cfg_path, args.gbs, args.n, asp["instances"], asp["max_lag"], args.iters,
                              cfg["generate_config"]["sampling_config"]["max_tokens"])
        asp["plan_path"] = str(plan)
        cfg["asp"] = asp
        cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    # As shell/msrl_common.sh's asp_prepare: launch-line overrides, and on a relaunch the resume settings
    # (finetune: true stays in the file, as shipped), composed with Hydra into the one file both sides read
    from mindspeed_asp.integrations.mindspeed_rl.launch_config import resume_overrides, write_composed
    overrides = list(args.override)
    if args.resume:
        extra, resumed = resume_overrides(cfg_path, out, overrides)
        if not extra:
            raise SystemExit(f"--resume: {cfg['actor_config']['save']} holds no checkpoint with ASP's state")
        print(f"[msrl-e2e] resuming iteration {resumed}: composed {' '.join(extra)}", flush=True)
        overrides += extra
    if overrides:
        cfg_path = write_composed(cfg_path, msrl, overrides, out / ("composed-resume" if args.resume else "composed"))
    os.environ["ASP_MSRL_CONFIG"] = str(cfg_path)

    # As on a cluster: `python cli/train_grpo.py` runs MindSpeed-RL's launcher as a script (so Ray pickles its
    # `train` task and the worker classes by value, from a process where no ASP hook runs), through Hydra.
    import runpy
    import ray
    from mindspeed_asp.integrations.mindspeed_rl.setup_hook import RUNTIME_ENV_FILE
    launcher = runpy.run_path(str(Path(msrl) / "cli" / "train_grpo.py"), run_name="msrl_train_grpo")
    # run_path returns a copy of the script's globals; its functions share the real ones
    launcher["train"]._function.__globals__["initialize_megatron"] = cpu_standins.initialize_megatron
    env_file = Path(msrl) / "configs" / "envs" / "runtime_env.yaml" if args.without_asp else RUNTIME_ENV_FILE
    runtime_env = yaml.safe_load(env_file.read_text())
    runtime_env["worker_process_setup_hook"] = "cpu_standins.setup_hook"
    runtime_env.setdefault("env_vars", {}).update({
        "PYTHONPATH": os.pathsep.join([msrl, str(HERE), str(REPO)]),
        "MINDSPEED_RL_SRC": msrl, "ASP_MSRL_CONFIG": str(cfg_path),
        "ASP_STANDIN_WITHOUT_ASP": "1" if args.without_asp else "0",
        "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false",
    })
    # A cluster's `ray start --resources` declares the NPUs; here a local Ray with logical NPUs, and logical
    # CPUs oversubscribed on purpose (TransferDock alone asks for 10 on a 2-core machine). MindSpeed-RL's
    # main() sees Ray initialised and skips its own ray.init.
    ctx = ray.init(num_cpus=32, resources={"NPU": 8}, runtime_env=runtime_env, include_dashboard=False,
                   log_to_driver=True)
    session_dir = ctx.address_info["session_dir"]
    worker_log = out / ("worker_output_resume.log" if args.resume else "worker_output.log")
    t0 = time.time()
    if args.stop_after_save:
        from mindspeed_asp.integrations.mindspeed_rl.resume_state import state_path
        stop_after(state_path(cfg["actor_config"]["save"], args.stop_after_save), session_dir, worker_log,
                   f"[msrl-e2e] {args.mode} stopped after the checkpoint of iteration {args.stop_after_save}")
    if args.kill_instance_after:
        kill_instance_after(audit, args.kill_instance_after, "asp_rollout_1_0", out)
    argv = sys.argv
    sys.argv = [str(Path(msrl) / "cli" / "train_grpo.py"), "--config-path", str(cfg_path.parent),
                "--config-name", cfg_path.stem,
                f"hydra.run.dir={out / 'hydra'}", "hydra.output_subdir=null"]
    try:
        launcher["main"]()
        collect_worker_output(session_dir, worker_log)
    finally:
        sys.argv = argv
        if ray.is_initialized():
            ray.shutdown()
    print(f"[msrl-e2e] {args.mode} finished in {time.time() - t0:.1f}s", flush=True)
    (out / "done.json").write_text(json.dumps({"mode": args.mode, "seconds": time.time() - t0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
