"""The tier's inputs, all made here: a tiny tokenizer and model, a packed prompt dataset, and the run YAML.

The task is arithmetic with a `\\boxed{}` answer, scored by MindSpeed-RL's own `math_17k_acc` rule reward. The
tokenizer is character-level with `\\boxed{` as one token, so a random tiny model sometimes answers right and
GRPO's group-normalised advantages are not all zero.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Dict, List

BOXED = "\\boxed{"
SPECIALS = ["<pad>", "<eos>"]  # ids 0 and 1: the tiny model's bos/pad and eos
CHARS = list("0123456789+=? }") + [BOXED] + list("abcdefghijklmnopqrstuvwxyz")
VOCAB_SIZE = 48


def vocab() -> Dict[str, int]:
    toks = SPECIALS + CHARS
    toks += [f"<unused{i}>" for i in range(VOCAB_SIZE - len(toks))]
    return {t: i for i, t in enumerate(toks)}


def write_tokenizer(path: Path) -> None:
    """A character-level fast tokenizer (HF `tokenizers`), saved beside the model as AutoTokenizer reads it."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.WordLevel(vocab=vocab(), unk_token="<unused0>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\\boxed\{|."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<pad>",
                                   unk_token="<unused0>")
    fast.save_pretrained(str(path))


def make_model(root: Path) -> str:
    """Tiny Qwen2 (vocab = the tokenizer's) plus its tokenizer, in one directory (reused when present)."""
    from mindspeed_asp.runtime.tiny_model import ensure_tiny_model
    path = root / "tiny-qwen2-msrl"
    ensure_tiny_model(str(path), seed=0, vocab_size=VOCAB_SIZE, max_position_embeddings=512)
    if not (path / "tokenizer.json").exists():
        write_tokenizer(path)
    return str(path)


def problems(count: int, seed: int = 0) -> List[Dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        a, b = rng.randint(0, 4), rng.randint(0, 4)
        out.append({"prompt": f"{a}+{b}=? {BOXED}", "label": str(a + b)})
    return out


def make_dataset(root: Path, model_path: str, count: int) -> str:
    """MindSpeed-RL's packed prompt dataset (`<prefix>_packed_{input_ids,labels}_document.{bin,idx}`), written
    with its own IndexedDatasetBuilder; returns the prefix (`data_path`)."""
    import numpy as np
    import torch
    from transformers import AutoTokenizer
    from mindspeed_rl.datasets.indexed_dataset import IndexedDatasetBuilder
    prefix = root / "dataset" / "arith"
    if Path(f"{prefix}_packed_input_ids_document.idx").exists():
        return str(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(model_path)
    items = problems(count)
    for field in ("input_ids", "labels"):
        builder = IndexedDatasetBuilder(f"{prefix}_packed_{field}_document.bin", dtype=np.int32)
        for it in items:
            text = it["prompt"] if field == "input_ids" else it["label"]
            builder.add_item(torch.tensor(tok.encode(text, add_special_tokens=False), dtype=torch.int32))
            builder.end_document()
        builder.finalize(f"{prefix}_packed_{field}_document.idx")
    (prefix.parent / "problems.json").write_text(json.dumps(items))
    return str(prefix)


MODEL_SECTION = {"tiny": {"use_mcore_models": True, "num_layers": 2, "hidden_size": 128, "ffn_hidden_size": 256,
                          "num_attention_heads": 4, "group_query_attention": True, "num_query_groups": 2,
                          "max_position_embeddings": 512, "position_embedding_type": "rope",
                          "untie_embeddings_and_output_weights": True, "normalization": "RMSNorm",
                          "swiglu": True, "add_qkv_bias": True, "disable_bias_linear": True,
                          "padded_vocab_size": VOCAB_SIZE, "rotary_base": 10000}}


def run_config(model_path: str, data_path: str, out: Path, *, gbs: int, n: int, iters: int, asp: Dict[str, Any],
               max_tokens: int = 12, lr: float = 5e-4) -> Dict[str, Any]:
    """A MindSpeed-RL GRPO config (the shape of configs/grpo_qwen25_7b_A3.yaml) with an `asp:` section."""
    return {
        "model": MODEL_SECTION,
        "megatron_training": {
            "model": "tiny", "use_mcore_models": True, "tokenizer_type": "PretrainedFromHF",
            "tokenizer_name_or_path": model_path, "global_batch_size": gbs, "seq_length": 128,
            "save_interval": 1000, "train_iters": iters, "stage": "ray_grpo", "attention_dropout": 0.0,
            "init_method_std": 0.01, "hidden_dropout": 0.0, "distributed_backend": "nccl",
            "no_shared_storage": True, "dataset_additional_keys": ["labels"], "data_path": data_path,
            "split": "100,0,0", "no_shuffle": False, "full_shuffle_instruction_dataset": False, "seed": 1,
            "reuse_fp32_param": False, "bf16": True,
        },
        "actor_config": {
            "model": "tiny", "micro_batch_size": 4, "tensor_model_parallel_size": 1,
            "pipeline_model_parallel_size": 1, "lr": lr, "lr_decay_style": "constant", "min_lr": 0.0,
            "weight_decay": 0.0, "lr_warmup_fraction": 0.0, "clip_grad": 1.0, "adam_beta1": 0.9,
            "adam_beta2": 0.95, "finetune": True, "load": str(out / "ckpt"), "save": str(out / "ckpt"),
            "no_load_optim": True, "no_load_rng": True,
        },
        "rl_config": {
            "guarantee_order": True, "use_integrated_worker": True, "blocking": True, "gamma": 1.0, "lam": 0.95,
            "actor_forward_micro_batch_size": 4, "ref_forward_micro_batch_size": 4,
            "adv_estimator": "group_norm", "kl_penalty": "low_var_kl", "kl_ctrl_type": "fixed",
            "init_kl_coef": 0.001, "mini_batch_size": gbs, "max_prompt_length": 64, "epochs": 1,
            "clip_ratio": 0.2, "entropy_coeff": 0.01, "shuffle_mini_batch": False, "n_samples_per_prompt": n,
            "rule_reward": True, "verifier_function": ["math_17k_acc"], "verifier_weight": [1.0],
            "log_max_throughput": False, "num_cpus_for_local_task": 1.0, "num_cpus_for_placement_group": 1,
            "use_tensorboard": False, "actor_resource": {"num_npus": 1},
            "actor_rollout_dispatch_size": gbs * n // max(1, int(asp.get("instances", 1)))
            if asp.get("mode") == "colocated" else gbs * n,
            "actor_logprob_dispatch_size": gbs * n, "actor_update_dispatch_size": gbs * n,
            "adv_dispatch_size": gbs * n,
        },
        "generate_config": {
            "trust_remote_code": True, "offload_train_optimizer": False, "offload_train_grad": False,
            "offload_train_param": False, "infer_tensor_parallel_size": 1, "infer_pipeline_parallel_size": 1,
            "infer_expert_parallel_size": 1, "max_num_seqs": 64, "max_model_len": 128,
            "max_num_batched_tokens": 2048, "dtype": "bfloat16", "gpu_memory_utilization": 0.4,
            "sampling_config": {"logprobs": 1, "max_tokens": max_tokens, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
                                "temperature": 1.0, "detokenize": False},
        },
        "asp": asp,
    }
