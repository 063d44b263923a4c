"""Every Megatron worker checks, right after `initialize_megatron` returns, that ASP's patches are still the
objects ASP installed (MindSpeed's repatch flow, run by MindSpeed-LLM's adaptor inside it, could revert them
silently), logs how many are live, and refuses to train otherwise.

The wrapped method is MindSpeed-RL's real `BaseWorker.setup_distributed_rank` (pinned source), patched by
ASP's real hook in a fresh interpreter with the CPU tier's stand-ins for the NPU stack; only what the method
reads from Ray and Megatron is given to it."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

E2E = Path(__file__).resolve().parents[1] / "msrl_e2e"
LOSS = "mindspeed_rl.models.loss.grpo_actor_loss_func.GRPOActorLossFunc.compute_loss"
DISPATCH = "mindspeed_rl.workers.base_worker.BaseWorker.dispatch_transfer_dock_data"

SCRIPT = r"""
import copy, json, os, sys, types
import cpu_standins
cpu_standins.install()
from mindspeed_asp.errors import RunError
from mindspeed_asp.integrations.mindspeed_rl.setup_hook import apply_all
targets = apply_all()
import ray
from mindspeed_rl.workers.base_worker import BaseWorker
from mindspeed_rl.models.loss.grpo_actor_loss_func import GRPOActorLossFunc
ctx = types.SimpleNamespace(get_accelerator_ids=lambda: {"NPU": ["0"]})
ray.get_runtime_context = lambda: ctx                          # read for a log line only

def worker(initialize_func):
    w = object.__new__(BaseWorker)                             # what setup_distributed_rank reads
    w.megatron_config = types.SimpleNamespace(stage="ray_grpo")
    w.rl_config = types.SimpleNamespace(zmq_communication=False)
    w.initialize_func = initialize_func
    w.steps = []
    def megatron_module():
        w.steps.append("get_megatron_module")
        return {"parallel_state": object(), "vocab_parallel_cross_entropy": None,
                "get_args": lambda: "args", "get_forward_backward_func": lambda: "fb"}
    w.get_megatron_module = megatron_module
    return w

def init_ok(config):
    pass

ok = worker(init_ok)
BaseWorker.setup_distributed_rank(ok)
stock_loss = GRPOActorLossFunc.compute_loss.__wrapped__
stock_dispatch = BaseWorker.dispatch_transfer_dock_data.__wrapped__

def init_repatching(config):                                   # a repatch inside initialize_megatron
    GRPOActorLossFunc.compute_loss = stock_loss
    BaseWorker.dispatch_transfer_dock_data = stock_dispatch

bad = worker(init_repatching)
try:
    BaseWorker.setup_distributed_rank(bad)
    error = None
except RunError as exc:
    error = str(exc)
print(json.dumps({"n": len(set(targets)), "pid": os.getpid(), "ok_steps": ok.steps, "ok_args": ok.args,
                  "init_restored": ok.initialize_func is init_ok, "bad_steps": bad.steps, "error": error,
                  "bad_init_restored": bad.initialize_func is init_repatching}))
"""


def test_a_revert_during_initialize_megatron_stops_the_worker_naming_the_targets(msrl_src, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ASP_MSRL_CONFIG", "ASP_PATCHES")}
    env.update(PYTHONPATH=str(E2E), MINDSPEED_RL_SRC=str(msrl_src))
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    # Live: one line, and MindSpeed-RL's method goes on as stock (the check sits between its two steps).
    assert f"mindspeed-asp: {res['n']} patches live after initialize_megatron (pid {res['pid']})" in out.stderr
    assert res["ok_steps"] == ["get_megatron_module"] and res["ok_args"] == "args" and res["init_restored"]
    # Reverted: a RunError naming each reverted target, before the worker builds anything.
    assert res["error"] is not None and res["bad_steps"] == [] and res["bad_init_restored"]
    assert f"2 of {res['n']} patches were reverted after initialize_megatron" in res["error"]
    assert f"{LOSS} now holds {LOSS}" in res["error"] and f"{DISPATCH} now holds" in res["error"]


def _method(src: Path, module: str, cls: str, name: str):
    tree = ast.parse(src.joinpath(*module.split(".")).with_suffix(".py").read_text())
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next((n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def test_setup_distributed_rank_is_where_every_megatron_worker_initialises_megatron(msrl_src):
    """The wrapped method holds MindSpeed-RL's only `initialize_func` call, and every Megatron worker's
    `initialize` goes through it (pinned source, read with ast)."""
    from mindspeed_asp.integrations.mindspeed_rl.setup_hook import LIVENESS_TARGET, patch_groups
    assert patch_groups()["liveness"][0][0] == LIVENESS_TARGET
    src = Path(msrl_src)
    fn = _method(src, "mindspeed_rl.workers.base_worker", "BaseWorker", "setup_distributed_rank")
    calls = [ast.unparse(n) for n in ast.walk(fn) if isinstance(n, ast.Call)
             and ast.unparse(n.func) == "self.initialize_func"]
    assert calls == ["self.initialize_func(config=config)"]
    users = []
    for path in sorted((src / "mindspeed_rl").rglob("*.py")):
        text = path.read_text()
        if "initialize_func(" in text:
            users.append(path.relative_to(src).as_posix())
    assert users == ["mindspeed_rl/workers/base_worker.py"], users
    for module, cls in (("actor_hybrid_worker", "ActorHybridWorkerBase"), ("reference_worker", "ReferenceWorkerBase"),
                        ("reward_worker", "RewardWorkerBase"), ("critic_worker", "CriticWorkerBase"),
                        ("vit_worker", "VitWorkerBase")):
        init = _method(src, f"mindspeed_rl.workers.{module}", cls, "initialize")
        assert "self.setup_distributed_rank()" in ast.unparse(init), cls
