"""Import MindSpeed-RL's data-path modules from a checkout (env MINDSPEED_RL_SRC) on a CPU machine.

`mindspeed_rl/__init__.py` (and its sub-packages' `__init__`s) import the whole framework: Megatron, vLLM
Ascend, torchvision, datasets... The contract tests need only a few modules, so the packages are registered
as bare namespace modules pointing at the checkout, and the modules themselves are imported for real.
Test-only: nothing here is used by the project.
"""
from __future__ import annotations

import os
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGES = ["mindspeed_rl", "mindspeed_rl.trainer", "mindspeed_rl.trainer.utils", "mindspeed_rl.utils",
            "mindspeed_rl.datasets", "mindspeed_rl.workers", "mindspeed_rl.models", "mindspeed_rl.models.rollout",
            "mindspeed_rl.config_cls", "mindspeed_rl.models.loss"]


def src() -> str:
    path = os.environ.get("MINDSPEED_RL_SRC", "")
    if not path or not (Path(path) / "mindspeed_rl").is_dir():
        raise RuntimeError("MINDSPEED_RL_SRC does not point at a MindSpeed-RL checkout")
    return str(Path(path).resolve())


def install() -> str:
    root = src()
    for p in (root, str(HERE / "stubs")):
        if p not in sys.path:
            sys.path.insert(0, p)
    for name in PACKAGES:
        if name in sys.modules and getattr(sys.modules[name], "__asp_bare__", False):
            continue
        mod = types.ModuleType(name)
        mod.__path__ = [os.path.join(root, *name.split("."))]
        mod.__asp_bare__ = True
        sys.modules[name] = mod
        parent, _, leaf = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], leaf, mod)
    return root


def worker_setup() -> None:
    """Ray worker_process_setup_hook for the contract tests: the shim, then ASP's own hook (data group)."""
    install()
    from mindspeed_asp.integrations.mindspeed_rl.patch_registry import PatchRegistry
    from mindspeed_asp.integrations.mindspeed_rl.setup_hook import apply_all
    apply_all(manager=PatchRegistry(), groups=["data"], check_pin=False)


class Leader:
    """Test-only stand-in for one vLLM instance's leader rank (a MindSpeed-RL BaseWorker on NPU).

    It runs the row-pulling part of `ActorHybridWorkerBase.generate_sequences` as written at 05a90d7:
    `get_dp_range_indexes(experience_count, use_vllm=True)` under guarantee_order, pop one chunk at a time,
    `td.get_experience('actor_rollout', ['prompts', 'prompt_length'], indexes=chunk)`, then the sync
    generate path's `range(0, experience_count, n)` prompt selection. Only `get_vllm_dp_rank` (which reads
    the HCCL world on NPU) is given directly.
    """

    def __init__(self, instance: int, instances: int, n: int) -> None:
        from mindspeed_asp.integrations.mindspeed_rl.data_patches import get_dp_range_indexes_wrapper

        def stock(self_, experience_count, use_vllm=False, assign_batch_size=None):
            raise AssertionError("the plan cursor should answer for vLLM ranks")
        self.instance, self.instances, self.n = instance, instances, n
        self._get = get_dp_range_indexes_wrapper(stock)

    def get_vllm_dp_rank(self):
        return self.instance, self.instances

    def pull(self, td, experience_count: int):
        import ray
        from mindspeed_asp.integrations.mindspeed_rl.data_patches import ASP_PROMPT_ID
        sorted_indexes = self._get(self, experience_count, use_vllm=True)
        out = []
        while sorted_indexes:  # BaseWorker.all_consumed under guarantee_order
            chunk = sorted_indexes.pop(0)
            batch, index = ray.get(td.get_experience.remote(
                "actor_rollout", ["prompts", "prompt_length", ASP_PROMPT_ID], indexes=chunk, get_n_samples=True))
            pick = list(range(0, experience_count, self.n))  # sync_generate_process
            prompts = batch["prompts"][pick]
            lengths = batch["prompt_length"][pick]
            out.append({"index": list(index),
                        "row_ids": [int(x) for x in batch[ASP_PROMPT_ID].view(-1).tolist()],
                        "prompts": [p[: int(L)].tolist() for p, L in zip(prompts, lengths.view(-1))]})
        return out
