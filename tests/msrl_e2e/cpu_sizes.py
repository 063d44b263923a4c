"""The one list of launch-line overrides a CPU forces on a shipped config, each with its reason.

The cluster-launch run (`test_msrl_cluster_launch.py`) launches `configs/qwen25_7b_A3_asp.yaml` unmodified
through the launcher's shell functions; these overrides go on its launch line, where a user's own overrides go,
and the launcher composes them (Hydra's compose API) as it composes any. Every key not listed keeps the shipped
value: the loss, the estimator, the lag bound's mode, the re-planning, the sampling and the GRPO settings.
"""
from __future__ import annotations

import json
from typing import Dict, List, Tuple

from fixtures import MODEL_SECTION

#: (key, value, reason). A `{}` in a value is filled by `overrides()` with the tier's own paths.
SIZES: Tuple[Tuple[str, str, str], ...] = (
    ("megatron_training.model", "tiny", "a 7B model does not fit 2 CPU cores: the tiny Qwen2 the tier builds"),
    ("actor_config.model", "tiny", "the same model section for the actor"),
    ("+model.tiny", "{model}", "its architecture (the shipped defaults list only knows qwen25_7b)"),
    ("megatron_training.tokenizer_name_or_path", "{tokenizer}", "the tiny model's tokenizer and HF weights"),
    ("megatron_training.data_path", "{data}", "the tier's arithmetic prompts, packed by MindSpeed-RL's builder"),
    ("megatron_training.global_batch_size", "2", "CPU time: 2 prompts per iteration"),
    ("rl_config.mini_batch_size", "2", "one update per iteration, as shipped (mini_batch = global batch)"),
    ("asp.minibatch_groups", "2", "ASP's minibatch is the trainer's global batch"),
    ("rl_config.n_samples_per_prompt", "4", "CPU time: 4 responses per prompt"),
    ("megatron_training.seq_length", "128", "the tiny model's context"),
    ("rl_config.max_prompt_length", "64", "the tier's prompts are ~12 tokens"),
    ("generate_config.max_model_len", "128", "the tiny model's context"),
    ("generate_config.max_num_seqs", "64", "a CPU engine's batch"),
    ("generate_config.sampling_config.max_tokens", "12", "CPU time: short answers (the task needs ~3 tokens)"),
    ("actor_config.tensor_model_parallel_size", "1", "the tier's Megatron stand-in is TP1 (real megatron-core at "
     "TP2 and TP2xPP2 with MindSpeed-RL's export and loaders: test_mcore_weight_path.py)"),
    ("actor_config.pipeline_model_parallel_size", "1", "as above"),
    ("rl_config.actor_resource.num_npus", "1", "one logical NPU trains"),
    ("asp.instances", "2", "two rollout instances, placed on the second node (the head has one NPU)"),
    ("asp.slots", "8", "a CPU engine's concurrent sequences"),
    ("generate_config.offload_train_optimizer", "false", "no device memory to free on a CPU"),
    ("generate_config.offload_train_grad", "false", "as above"),
    ("rl_config.use_tensorboard", "false", "its writer opens ./runs in the entry's working directory, "
     "MindSpeed-RL's root, read-only here"),
    ("actor_config.load", "{work}/ckpt", "./ckpt (the converted starting checkpoint) is relative to MindSpeed-RL's "
     "root: none exists here, so finetune starts from the HF weights"),
    ("actor_config.save", "{work}/ckpt_asp", "./ckpt_asp, likewise relative to the read-only root"),
)


def _hydra_value(v: object) -> str:
    """A value in Hydra's override grammar (strings quoted, booleans lower-case)."""
    if isinstance(v, bool):
        return str(v).lower()
    return json.dumps(v) if isinstance(v, str) else str(v)


def overrides(*, tokenizer: str, data: str, work: str, extra: Tuple[str, ...] = ()) -> List[str]:
    """The size overrides filled with the tier's paths, then `extra` (a test's own launch-line overrides)."""
    model = "{" + ",".join(f"{k}:{_hydra_value(v)}" for k, v in MODEL_SECTION["tiny"].items()) + "}"
    fill: Dict[str, str] = {"model": model, "tokenizer": tokenizer, "data": data, "work": work}
    return [f"{key}={value.format(**fill)}" for key, value, _ in SIZES] + list(extra)
