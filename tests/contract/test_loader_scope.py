"""In mode asp only the trainer's PromptDataLoader follows the dispatch plan; every other loader in the
process (an evaluation split, a unit test's own dataset) iterates exactly as stock, plan file or not.

The trainer's loader is the one over the train split that MindSpeed-RL's train task builds
(`train_ds, _, _ = build_train_valid_test_datasets(...)` in cli/train_grpo.py): the patched builder marks it.
Datasets are MindSpeed-RL's real packed PromptDataset, written with its own IndexedDatasetBuilder."""
import ast
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

HERE = Path(__file__).resolve().parent
N, GBS, SEED, DOCS = 2, 8, 3, 40  # split 80,20,0: train 32 prompts (4 iterations), valid 8


@pytest.fixture()
def msrl(msrl_src, tmp_path):
    sys.path.insert(0, str(HERE))
    import msrl_shim
    msrl_shim.install()
    import torch
    from mindspeed_rl.datasets.indexed_dataset import IndexedDatasetBuilder
    prefix = tmp_path / "data" / "toy"
    prefix.parent.mkdir()
    rng = np.random.default_rng(0)
    lens = [int(rng.integers(2, 30)) for _ in range(DOCS)]
    for field in ("input_ids", "labels"):
        builder = IndexedDatasetBuilder(f"{prefix}_packed_{field}_document.bin", dtype=np.int32)
        for i, n in enumerate(lens):
            row = [1000 * i + k for k in range(n)] if field == "input_ids" else [i % 7]
            builder.add_item(torch.tensor(row, dtype=torch.int32))
            builder.end_document()
        builder.finalize(f"{prefix}_packed_{field}_document.idx")
    from mindspeed_rl.datasets import build_dataset as bd
    from mindspeed_rl.datasets.dataloader import PromptDataLoader
    from mindspeed_rl.datasets.prompt_dataset import PromptDataset
    extra = SimpleNamespace(is_pairwise_dataset=False, max_prompt_length=64, dataset_additional_keys=["labels"])

    def build():  # as cli/train_grpo.py calls it (looked up at call time: patched once the data group is applied)
        return bd.build_train_valid_test_datasets(
            data_prefix=[str(prefix)], splits_string="80,20,0", seq_length=64,
            train_valid_test_num_samples=[32, 8, 0], seed=SEED, dataset_cls=PromptDataset, extra_param=extra)
    return SimpleNamespace(build=build, loader=lambda ds: PromptDataLoader(ds, GBS, 0, SEED, ["labels"], False))


def _batches(it):
    return [[p.tolist() for p in b["prompts"]] for b in it]


def _config(tmp_path, plan_path):
    cfg = {
        "megatron_training": {"global_batch_size": GBS, "train_iters": 4, "seed": SEED},
        "actor_config": {"tensor_model_parallel_size": 1},
        "rl_config": {"n_samples_per_prompt": N, "guarantee_order": True, "use_integrated_worker": True,
                      "blocking": True, "actor_resource": {"num_npus": 3}},
        "generate_config": {"infer_tensor_parallel_size": 1, "max_num_seqs": 64,
                            "sampling_config": {"max_tokens": 512}},
        "asp": {"mode": "asp", "instances": 3, "slots": 16, "minibatch_groups": GBS, "max_lag": 1,
                "plan_path": str(plan_path)},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _plan(tmp_path, train_ds):
    """What node 0 does: export the train split in the loader's draw order, then `asp plan`."""
    from mindspeed_asp.integrations.mindspeed_rl.export_prompts import draw_order, write_jsonl
    from mindspeed_asp.scheduler.build import plan_epoch
    from mindspeed_asp.workloads.prompts import load_prompt_set
    actor = SimpleNamespace(global_batch_size=GBS, num_workers=0, seed=SEED, dataset_additional_keys=["labels"],
                            no_shuffle=False)
    write_jsonl(train_ds, tmp_path / "prompts.jsonl", draw_order(train_ds, actor))
    plan = plan_epoch(load_prompt_set(str(tmp_path / "prompts.jsonl"), n=N), None, planner="asp", instances=3,
                      slots=16, minibatch=GBS, max_new_tokens=512, groups_per_iteration=GBS, progress=False).plan
    plan.save(tmp_path / "plan.parquet")
    return tmp_path / "plan.parquet"


def test_only_the_training_split_follows_the_plan(msrl, patched, tmp_path):
    from mindspeed_asp.integrations.mindspeed_rl.data_patches import PlanOrderedBatches, is_training_split
    train, valid, _ = msrl.build()
    stock_train, stock_valid = _batches(msrl.loader(train)), _batches(msrl.loader(valid))
    patched(_config(tmp_path, _plan(tmp_path, train)))
    train, valid, test = msrl.build()  # the patched builder marks the train split only
    assert is_training_split(train) and not is_training_split(valid) and test is None
    planned = iter(msrl.loader(train))
    assert isinstance(planned, PlanOrderedBatches)
    assert [sorted(map(str, b)) for b in _batches(planned)] == [sorted(map(str, b)) for b in stock_train]
    assert _batches(msrl.loader(valid)) == stock_valid  # the evaluation split: stock order, untouched


def test_other_loaders_ignore_a_missing_plan_the_trainers_loader_names_it(msrl, patched, tmp_path):
    from mindspeed_asp.errors import InputError
    train, valid, _ = msrl.build()
    stock_valid = _batches(msrl.loader(valid))
    own = [{"input_ids": np.arange(5) + 7 * i, "labels": np.array([i])} for i in range(16)]  # a test's dataset
    stock_own = _batches(msrl.loader(own))
    missing = tmp_path / "no_plan.parquet"
    patched(_config(tmp_path, missing))
    train, valid, _ = msrl.build()
    assert _batches(msrl.loader(valid)) == stock_valid
    assert _batches(msrl.loader(own)) == stock_own
    with pytest.raises(InputError) as info:
        iter(msrl.loader(train))
    msg = str(info.value)
    assert str(missing) in msg and "plan file not found" in msg and "asp plan" in msg and "asp.plan_path" in msg


def test_a_plan_for_the_training_split_leaves_another_dataset_alone(msrl, patched, tmp_path):
    from mindspeed_asp.errors import PlanMismatchError
    train, _, _ = msrl.build()
    other = [{"input_ids": np.arange(3 + i % 5) + 11 * i, "labels": np.array([i])} for i in range(32)]  # same size
    stock_other = _batches(msrl.loader(other))
    patched(_config(tmp_path, _plan(tmp_path, train)))
    assert _batches(msrl.loader(other)) == stock_other
    train, _, _ = msrl.build()
    with pytest.raises(PlanMismatchError, match="megatron_training.seed"):  # the trainer's loader, wrong seed
        from mindspeed_rl.datasets.dataloader import PromptDataLoader
        iter(PromptDataLoader(train, GBS, 0, SEED + 1, ["labels"], False))


def test_train_tasks_build_their_loader_from_the_marked_split(msrl_src):
    """cli/train_grpo.py, train_dapo.py and train_ppo.py take the train split of build_train_valid_test_datasets
    and hand it to the PromptDataLoader they iterate (pinned source, read with ast)."""
    for cli in ("train_grpo", "train_dapo", "train_ppo"):
        tree = ast.parse((Path(msrl_src) / "cli" / f"{cli}.py").read_text())
        split = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                 and ast.unparse(n.value.func) == "build_train_valid_test_datasets"]
        assert len(split) == 1 and isinstance(split[0].targets[0], ast.Tuple), cli
        train_name = ast.unparse(split[0].targets[0].elts[0])
        loaders = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "PromptDataLoader"]
        assert loaders and all(ast.unparse(c.args[0]) == train_name for c in loaders), cli
