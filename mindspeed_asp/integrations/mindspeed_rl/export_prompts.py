"""Write a MindSpeed-RL prompt dataset as the JSON Lines `asp plan --dataset` reads.

Run it on a node where MindSpeed-RL imports (from its root), with the training YAML of the run:

    python -m mindspeed_asp.integrations.mindspeed_rl.export_prompts --config configs/qwen25_7b_A3_asp.yaml \\
        -o runs/qwen25_7b_A3/prompts.jsonl

Ids are dataset indexes (what the plan-ordered loader fetches) and lengths are `len(input_ids)`, exactly as
`data_patches.prompt_set_from_dataset` computes them at run time, so the plan's fingerprint check passes
only for the same dataset, split and sequence length.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional


def build_dataset(cfg: Dict[str, Any]) -> Any:
    """MindSpeed-RL's train split exactly as cli/train_grpo.py builds it."""
    from mindspeed_rl.config_cls.megatron_config import MegatronConfig
    from mindspeed_rl.datasets.build_dataset import build_train_valid_test_datasets
    from mindspeed_rl.datasets.prompt_dataset import PromptDataset
    actor = MegatronConfig({**cfg["megatron_training"], **cfg["actor_config"]}, cfg.get("model"))
    train_ds, _, _ = build_train_valid_test_datasets(
        data_prefix=[actor.data_path], splits_string=actor.split, seq_length=actor.seq_length,
        train_valid_test_num_samples=[actor.train_iters * actor.global_batch_size, 0, 0], seed=actor.seed,
        dataset_cls=PromptDataset, extra_param=actor)
    return train_ds


def write_jsonl(dataset: Any, out: Path) -> int:
    from tqdm import tqdm
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as fh:
        for i in tqdm(range(len(dataset)), desc="export prompts", file=sys.stderr, unit="prompt"):
            fh.write(json.dumps({"prompt_id": str(i), "prompt_len": int(len(dataset[i]["input_ids"]))}) + "\n")
    return len(dataset)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="MindSpeed-RL training YAML (with Hydra model defaults resolved)")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    from mindspeed_asp.config import read_yaml
    cfg = read_yaml(args.config)
    model_name = cfg.get("megatron_training", {}).get("model")
    if "model" not in cfg and model_name:  # Hydra's `defaults: [model: [...]]`, resolved from MindSpeed-RL's tree
        from mindspeed_asp.integrations.mindspeed_rl.pins import mindspeed_rl_root
        root = mindspeed_rl_root()
        model_file = root / "configs" / "model" / f"{model_name}.yaml" if root else None
        if model_file and model_file.is_file():
            cfg["model"] = read_yaml(model_file)
    count = write_jsonl(build_dataset(cfg), Path(args.output))
    print(f"wrote {count} prompts to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
