"""Write a MindSpeed-RL prompt dataset as the JSON Lines `asp plan --dataset` reads.

Run it on a node where MindSpeed-RL imports (from its root), with the training YAML of the run:

    python -m mindspeed_asp.integrations.mindspeed_rl.export_prompts --config configs/qwen25_7b_A3_asp.yaml \\
        -o runs/qwen25_7b_A3/prompts.jsonl [--train-iters N]

Ids are dataset indexes (what the plan-ordered loader fetches) and lengths are `len(input_ids)`, exactly as
`data_patches.prompt_set_from_dataset` computes them at run time. Lines are written in the order the run's
PromptDataLoader draws the prompts (shuffled with `megatron_training.seed` unless `no_shuffle`), because
`asp plan` cuts iteration windows as consecutive slices of this file: window i is then exactly stock's batch
i. The plan's fingerprint check passes only for the same dataset, split, sequence length, train_iters (the
dataset's length follows it), seed and shuffling.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple


def build_dataset(cfg: Dict[str, Any]) -> Tuple[Any, Any]:
    """MindSpeed-RL's train split exactly as cli/train_grpo.py builds it, and the actor config it used."""
    from mindspeed_rl.config_cls.megatron_config import MegatronConfig
    from mindspeed_rl.datasets.build_dataset import build_train_valid_test_datasets
    from mindspeed_rl.datasets.prompt_dataset import PromptDataset
    actor = MegatronConfig({**cfg["megatron_training"], **cfg["actor_config"]}, cfg.get("model"))
    train_ds, _, _ = build_train_valid_test_datasets(
        data_prefix=[actor.data_path], splits_string=actor.split, seq_length=actor.seq_length,
        train_valid_test_num_samples=[actor.train_iters * actor.global_batch_size, 0, 0], seed=actor.seed,
        dataset_cls=PromptDataset, extra_param=actor)
    return train_ds, actor


def draw_order(dataset: Any, actor: Any) -> List[int]:
    """Dataset indexes in the order cli/train_grpo.py's PromptDataLoader (same arguments) draws them."""
    from mindspeed_rl.datasets.dataloader import PromptDataLoader
    from mindspeed_asp.integrations.mindspeed_rl.data_patches import loader_order
    loader = PromptDataLoader(dataset, actor.global_batch_size, actor.num_workers, actor.seed,
                              actor.dataset_additional_keys, actor.no_shuffle)
    return loader_order(loader)


def write_jsonl(dataset: Any, out: Path, order: Optional[Sequence[int]] = None) -> int:
    from tqdm import tqdm

    from mindspeed_asp.utils.atomic import atomic_open
    idx = range(len(dataset)) if order is None else order
    with atomic_open(out) as fh:  # temp file + rename: no half-written dataset for `asp plan`
        for i in tqdm(idx, desc="export prompts", file=sys.stderr, unit="prompt"):
            fh.write(json.dumps({"prompt_id": str(int(i)), "prompt_len": int(len(dataset[int(i)]["input_ids"]))})
                     + "\n")
    return len(idx)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="MindSpeed-RL training YAML (with Hydra model defaults resolved)")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--train-iters", type=int, default=None,
                    help="the run's megatron_training.train_iters when overridden (it sets the dataset's length)")
    args = ap.parse_args(argv)
    from mindspeed_asp.config import read_yaml
    cfg = read_yaml(args.config)
    if args.train_iters is not None:
        cfg.setdefault("megatron_training", {})["train_iters"] = int(args.train_iters)
    model_name = cfg.get("megatron_training", {}).get("model")
    if "model" not in cfg and model_name:  # Hydra's `defaults: [model: [...]]`, resolved from MindSpeed-RL's tree
        from mindspeed_asp.integrations.mindspeed_rl.pins import mindspeed_rl_root
        root = mindspeed_rl_root()
        model_file = root / "configs" / "model" / f"{model_name}.yaml" if root else None
        if model_file and model_file.is_file():
            cfg["model"] = read_yaml(model_file)
    dataset, actor = build_dataset(cfg)
    count = write_jsonl(dataset, Path(args.output), draw_order(dataset, actor))
    print(f"wrote {count} prompts to {args.output} (in the loader's draw order, "
          f"{'dataset order' if actor.no_shuffle else f'shuffled with seed {actor.seed}'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
