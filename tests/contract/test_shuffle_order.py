"""The plan's iteration windows hold exactly the prompts MindSpeed-RL's real PromptDataLoader would put in
each batch: shuffled with the run's seed (`no_shuffle: false`), or dataset order (`no_shuffle: true`).

Stock batches come from an unpatched PromptDataLoader; the ASP side is export_prompts' draw order ->
prompts.jsonl -> `asp plan`'s windows -> the patched loader's plan-ordered batches."""
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

HERE = Path(__file__).resolve().parent
N, GBS, M, SEED, SIZE = 2, 8, 3, 7, 40


def _dataset():
    rng = np.random.default_rng(0)
    return [{"input_ids": (np.arange(int(rng.integers(3, 30))) + 1000 * i).astype(np.int64),
             "labels": np.array([i], dtype=np.int64)} for i in range(SIZE)]


def _ids(batch):
    return sorted(int(p[0]) // 1000 for p in batch["prompts"])


@pytest.fixture()
def msrl(msrl_src):
    sys.path.insert(0, str(HERE))
    import msrl_shim
    msrl_shim.install()
    from mindspeed_rl.datasets.dataloader import PromptDataLoader
    return PromptDataLoader


def _plan_and_config(tmp_path, dataset, no_shuffle):
    from mindspeed_asp.integrations.mindspeed_rl.export_prompts import draw_order, write_jsonl
    from mindspeed_asp.scheduler.build import plan_epoch
    from mindspeed_asp.workloads.prompts import load_prompt_set
    actor = SimpleNamespace(global_batch_size=GBS, num_workers=0, seed=SEED, dataset_additional_keys=["labels"],
                            no_shuffle=no_shuffle)
    write_jsonl(dataset, tmp_path / "prompts.jsonl", draw_order(dataset, actor))  # what node 0 exports
    plan = plan_epoch(load_prompt_set(str(tmp_path / "prompts.jsonl"), n=N), None, planner="asp", instances=M,
                      slots=16, minibatch=GBS, max_new_tokens=512, groups_per_iteration=GBS, progress=False).plan
    plan.save(tmp_path / "plan.parquet")
    cfg = {
        "megatron_training": {"global_batch_size": GBS, "train_iters": SIZE // GBS, "seed": SEED,
                              "no_shuffle": no_shuffle},
        "actor_config": {"tensor_model_parallel_size": 1},
        "rl_config": {"n_samples_per_prompt": N, "guarantee_order": True, "use_integrated_worker": True,
                      "blocking": True, "actor_resource": {"num_npus": M}},
        "generate_config": {"infer_tensor_parallel_size": 1, "max_num_seqs": 64,
                            "sampling_config": {"max_tokens": 512}},
        "asp": {"mode": "asp", "instances": M, "slots": 16, "minibatch_groups": GBS, "max_lag": 1,
                "plan_path": str(tmp_path / "plan.parquet")},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    return str(tmp_path / "run.yaml")


@pytest.mark.parametrize("no_shuffle", [False, True])
def test_iteration_i_plans_stocks_batch_i(msrl, patched, tmp_path, no_shuffle):
    from mindspeed_asp.integrations.mindspeed_rl.data_patches import PlanOrderedBatches
    dataset = _dataset()
    stock = [_ids(b) for b in msrl(dataset, GBS, 0, SEED, ["labels"], no_shuffle)]  # unpatched MindSpeed-RL
    assert len(stock) == SIZE // GBS
    dataset_order = [list(range(i * GBS, (i + 1) * GBS)) for i in range(SIZE // GBS)]
    assert (stock == dataset_order) == no_shuffle  # the seed's permutation really moves prompts
    patched(_plan_and_config(tmp_path, dataset, no_shuffle))
    batches = iter(msrl(dataset, GBS, 0, SEED, ["labels"], no_shuffle))  # as cli/train_grpo.py builds it
    assert isinstance(batches, PlanOrderedBatches)
    assert [_ids(b) for b in batches] == stock


def test_a_plan_for_another_seed_is_refused_naming_the_cause(msrl, patched, tmp_path):
    from mindspeed_asp.errors import PlanMismatchError
    dataset = _dataset()
    patched(_plan_and_config(tmp_path, dataset, no_shuffle=False))
    with pytest.raises(PlanMismatchError, match="megatron_training.seed, no_shuffle"):
        iter(msrl(dataset, GBS, 0, SEED + 1, ["labels"], False))
