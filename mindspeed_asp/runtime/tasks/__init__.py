"""The tasks of the standalone runtime (`data.task`), behind one interface (runtime/tasks/base.py).

- `demo` (tasks/demo.py): the synthetic task a tiny random model learns on CPU; the policy's own lengths.
- `replay` (tasks/replay.py): demo-like prompts whose response lengths are imposed by a synthetic regime or a
  length trace, scaled to a CPU budget: a real workload's long tail on the tiny model.
- `dataset` (tasks/dataset.py): text prompts with reference answers from a JSONL file, math-verified.

`build_task(cfg, model_path)` picks one by `cfg.data.task`; the heavy modules load only for the task asked for.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Tuple

from mindspeed_asp.errors import ConfigError
from mindspeed_asp.runtime.tasks.base import GenerationLimits, Task, prompt_set_of

if TYPE_CHECKING:
    from mindspeed_asp.runtime.run_config import RunConfig
    from mindspeed_asp.core.problem import PromptSet

__all__ = ["GenerationLimits", "Task", "build_task", "prompt_set_of", "task_and_prompts"]


def build_task(cfg: "RunConfig", model_path: Optional[str]) -> Task:
    """The task `cfg.data.task` names, built from the config (and, where it needs one, the model directory)."""
    name = cfg.data.task
    if name == "demo":
        from mindspeed_asp.runtime.tasks.demo import DemoTask

        return DemoTask(cfg.data.num_prompts, seed=cfg.data.seed, max_new_tokens=cfg.data.max_new_tokens)
    if name == "replay":
        from mindspeed_asp.runtime.tasks.replay import build_replay_task

        return build_replay_task(cfg, model_path)
    if name == "dataset":
        from mindspeed_asp.runtime.tasks.dataset import build_dataset_task

        return build_dataset_task(cfg, str(model_path))
    raise ConfigError(f"unknown task {name!r}", key="data.task")


def task_and_prompts(cfg: "RunConfig", model_path: Optional[str] = None) -> Tuple[Task, "PromptSet"]:
    """The run's task and its PromptSet (the dataset a plan file must have been built for). `model_path` None:
    the run's own model directory (`model:`; the tiny model is built into the cache if missing), so a plan
    checked before Ray starts sees the very prompts the run will dispatch."""
    if model_path is None:
        from mindspeed_asp.runtime.tiny_model import run_model_path

        model_path = run_model_path(cfg.model)
    task = build_task(cfg, model_path)
    return task, task.prompt_set(cfg.data.n)
