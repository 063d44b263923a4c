"""Plan-ordered batches and TransferDock row layout (no MindSpeed-RL needed: a list dataset stands for
PromptDataset; the contract tests repeat this against MindSpeed-RL's real TransferDock)."""
import numpy as np
import pytest

from mindspeed_asp.errors import ConfigError, PlanMismatchError
from mindspeed_asp.integrations.mindspeed_rl.data_patches import (
    ASP_PROMPT_ID, IterationLayout, PlanCursor, PlanOrderedBatches, open_plan, prompt_set_from_dataset,
    put_prompts_experience_wrapper)
from mindspeed_asp.scheduler.build import plan_epoch

N, GBS, M = 4, 8, 3


def dataset(size=24, seed=0):
    rng = np.random.default_rng(seed)
    return [{"input_ids": np.arange(int(rng.integers(3, 40))) + 100 * i, "labels": np.array([i % 5])}
            for i in range(size)]


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    ds = dataset()
    prompts = prompt_set_from_dataset(ds, N)
    res = plan_epoch(prompts, None, planner="lpt", instances=M, slots=16, minibatch=GBS, max_new_tokens=256,
                     groups_per_iteration=GBS, progress=False)
    path = tmp_path_factory.mktemp("plan") / "plan.parquet"
    res.plan.save(path)
    return path


def test_layout_rows_and_chunks():
    lay = IterationLayout([["5", "2"], ["7"], ["1", "0", "3"]], n=2)
    assert lay.order() == ["5", "2", "7", "1", "0", "3"]
    assert lay.rows(0) == [0, 1, 2, 3] and lay.rows(1) == [4, 5] and lay.rows(2) == [6, 7, 8, 9, 10, 11]
    assert lay.chunks(2, 2) == [[6, 7], [8, 9], [10, 11]]
    assert lay.row_prompt_ids()[:4] == ["5", "5", "2", "2"]
    with pytest.raises(ConfigError, match="actor_rollout_dispatch_size to 2"):
        lay.chunks(0, 6)
    with pytest.raises(ConfigError, match="multiple of n"):
        lay.chunks(0, 3)


def test_batches_follow_the_plan_and_carry_prompt_ids(plan_file):
    ds = dataset()
    plan = open_plan(str(plan_file), M, prompt_set_from_dataset(ds, N))
    published = []
    it = PlanOrderedBatches(ds, plan, M, GBS, N, ["labels"], publish=lambda i, q, n: published.append((i, q, n)))
    batches = list(it)
    assert len(batches) == plan.num_iterations == 3
    for i, b in enumerate(batches):
        queues = [plan.instance_queue(i, j) for j in range(M)]
        order = [p for q in queues for p in q]
        assert [int(t[0]) for t in b[ASP_PROMPT_ID]] == [int(p) for p in order]
        for p, prompt, label in zip(order, b["prompts"], b["labels"]):
            assert prompt.tolist() == ds[int(p)]["input_ids"].tolist()
            assert int(label[0]) == ds[int(p)]["labels"][0]
        assert published[i] == (i, queues, N)
    seen = sorted(int(p) for b in batches for p in (t[0] for t in b[ASP_PROMPT_ID]))
    assert seen == list(range(24))  # the epoch, each prompt once


def test_plan_for_another_dataset_or_shape_is_refused(plan_file):
    with pytest.raises(PlanMismatchError):
        open_plan(str(plan_file), M, prompt_set_from_dataset(dataset(seed=1), N))
    with pytest.raises(ConfigError, match="asp plan --instances 4"):
        open_plan(str(plan_file), 4)
    plan = open_plan(str(plan_file), M)
    with pytest.raises(PlanMismatchError, match="global_batch_size"):
        next(PlanOrderedBatches(dataset(), plan, M, GBS + 1, N))
    with pytest.raises(PlanMismatchError, match="not an index"):
        next(PlanOrderedBatches(dataset(size=5), plan, M, GBS, N))


def test_put_prompts_wrapper_adds_the_id_column():
    calls = []

    def fake_orig(batch, n, keys, indexes=None, add_another_batch=False):
        calls.append(keys)
        return batch, indexes

    wrapped = put_prompts_experience_wrapper(fake_orig)
    wrapped({"prompts": [], ASP_PROMPT_ID: []}, 4, ["labels"])
    wrapped({"prompts": []}, 4, ["labels"])
    assert calls == [["labels", ASP_PROMPT_ID], ["labels"]]


def test_cursor_serves_each_instance_its_chunks():
    c = PlanCursor()
    with pytest.raises(RuntimeError):
        c.chunks(0, 2, 4)
    c.publish(3, [["9", "4"], ["1"]], 4)
    assert c.chunks(0, 2, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert c.chunks(1, 2, 4) == [[8, 9, 10, 11]]
    with pytest.raises(ConfigError, match="3 vLLM instances"):
        c.chunks(0, 3, 4)
    assert c.current() == {"iteration": 3, "order": ["9", "4", "1"]}
