"""Plan-ordered batches and TransferDock row layout (no MindSpeed-RL needed: a list dataset stands for
PromptDataset; the contract tests repeat this against MindSpeed-RL's real TransferDock)."""
import numpy as np
import pytest

pytest.importorskip("torch", reason="the batches are torch tensors: needs the runtime extra")

from mindspeed_asp.errors import ConfigError, PlanMismatchError
from mindspeed_asp.integrations.mindspeed_rl.data_patches import (
    ASP_PROMPT_ID, IterationLayout, PlanCursor, PlanOrderedBatches, balance_queues, loader_order, open_plan,
    prompt_set_from_dataset, put_prompts_experience_wrapper, reward_claim_rows)
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


def test_balance_queues_moves_fewest_tails_and_keeps_plan_order():
    q = [["a", "b", "c", "d"], ["e"], ["f", "g", "h"], ["i", "j", "k", "l"]]
    out = balance_queues(q)
    assert [len(x) for x in out] == [3, 3, 3, 3]
    assert out == [["a", "b", "c"], ["e", "d", "l"], ["f", "g", "h"], ["i", "j", "k"]]  # heads kept, 2 moves
    assert balance_queues([["x", "y"], ["z", "w"]]) == [["x", "y"], ["z", "w"]]  # already equal: untouched
    with pytest.raises(ConfigError, match="megatron_training.global_batch_size"):
        balance_queues([["a", "b"], ["c"]])


class UnevenPlan:
    """Stands for a DispatchPlan whose planner balanced predicted work, not counts (instance_queue is all
    PlanOrderedBatches reads)."""

    def __init__(self, queues):
        self.queues = queues
        self.num_iterations = len(queues)

    def instance_queue(self, it, j):
        return self.queues[it][j]


def test_vllm_data_parallel_engines_get_equal_generate_calls():
    """Unequal planned counts would give vLLM's DP ranks unequal numbers of generate() calls (a hang); with
    equal_counts every engine pulls the same number of chunks, its planned head first, the iteration's
    prompts unchanged."""
    m, gbs = 4, 16
    ds = dataset(size=32)
    plan = UnevenPlan([[[str(p) for p in q] for q in it] for it in (
        [[0, 1, 2, 3, 4, 5, 6], [7], [8, 9, 10, 11], [12, 13, 14, 15]],
        [[16, 17], [18, 19, 20, 21, 22, 23], [24, 25, 26], [27, 28, 29, 30, 31]])])
    cursor = PlanCursor()
    plain = PlanOrderedBatches(ds, plan, m, gbs, N, publish=cursor.publish)
    next(plain)
    assert [len(cursor.chunks(j, m, N)) for j in range(m)] == [7, 1, 4, 4]  # stock chunks per engine: a DP hang
    batches = PlanOrderedBatches(ds, plan, m, gbs, N, publish=cursor.publish, equal_counts=True)
    for i, b in enumerate(batches):
        assert [len(cursor.chunks(j, m, N)) for j in range(m)] == [gbs // m] * m
        planned = plan.queues[i]
        assert sorted(int(t[0]) for t in b[ASP_PROMPT_ID]) == sorted(int(p) for q in planned for p in q)
        for j, q in enumerate(cursor.layout.queues):
            keep = min(len(planned[j]), gbs // m)
            assert list(q[:keep]) == planned[j][:keep]  # each engine starts with its planned head
    assert cursor.layout.queues[0] == ["16", "17", "22", "23"]  # the tails of engines 1 and 3, in order
    assert cursor.layout.queues[2] == ["24", "25", "26", "31"]


def test_prompt_set_lists_ids_in_the_loaders_draw_order():
    class Loader:
        sampler = [3, 0, 2, 1]
    ds = dataset(size=4)
    order = loader_order(Loader())
    assert order == [3, 0, 2, 1]
    ps = prompt_set_from_dataset(ds, N, order=order)
    assert list(ps.prompt_ids) == ["3", "0", "2", "1"]
    assert list(ps.prompt_lens) == [len(ds[i]["input_ids"]) for i in order]
    assert ps.fingerprint() != prompt_set_from_dataset(ds, N).fingerprint()  # another order, another plan


def test_short_final_window_is_dropped_like_drop_last(tmp_path):
    ds = dataset(size=20)  # 2 full windows of 8 and a short one of 4
    prompts = prompt_set_from_dataset(ds, N)
    plan = plan_epoch(prompts, None, planner="lpt", instances=M, slots=16, minibatch=GBS, max_new_tokens=256,
                      groups_per_iteration=GBS, progress=False).plan
    assert plan.num_iterations == 3
    assert len(list(PlanOrderedBatches(ds, plan, M, GBS, N))) == 2


def test_reward_claim_rows_are_whole_groups_dividing_the_dock():
    assert reward_claim_rows(64, 16, 64 * 16) == 64
    assert reward_claim_rows(None, 8, 32 * 8) == 256
    assert reward_claim_rows(12, 4, 40) == 8  # 12 rows is 3 groups; 10 groups split into 2s
    assert reward_claim_rows(3, 4, 40) == 4  # less than a group: one group


def test_batches_say_which_groups_the_plan_isolated(plan_file, tmp_path):
    """The groups a plan isolated reach the rollout driver as positions in the batch (their gids there)."""
    from mindspeed_asp.scheduler.plan_file import DispatchPlan

    ds = dataset()
    base = DispatchPlan.load(plan_file)
    rows = [int(base.iteration_rows(0)[3]), int(base.iteration_rows(2)[0])]
    path = tmp_path / "isolated.parquet"
    DispatchPlan(dict(base.header, isolated_rows=sorted(rows)), base.cols).save(path)
    plan = open_plan(str(path), M, prompt_set_from_dataset(ds, N))
    it = PlanOrderedBatches(ds, plan, M, GBS, N)
    for i in range(3):
        batch = next(it)
        ids = [int(t[0]) for t in batch[ASP_PROMPT_ID]]
        want = [r for r in rows if base.iteration_of(str(r)) == i]
        assert [ids[k] for k in it.isolated_positions()] == want
