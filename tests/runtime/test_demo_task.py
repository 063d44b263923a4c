"""The CPU demo task: token layout, long-tail targets, reward, dataset file, and learnability under GRPO."""
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the runtime extra: pip install mindspeed-asp[runtime]")

from mindspeed_asp.runtime.tasks.demo import DemoTask
from mindspeed_asp.runtime.hf_sampler import sample_groups
from mindspeed_asp.runtime.tiny_model import EOS_TOKEN_ID
from mindspeed_asp.runtime.trainer import GRPOTrainer
from mindspeed_asp.workloads.prompts import load_prompt_set


def test_prompts_are_seeded_token_ids_below_vocab_without_eos():
    a, b, c = DemoTask(200, seed=1), DemoTask(200, seed=1), DemoTask(200, seed=2)
    assert a.prompts() == b.prompts() and a.prompts() != c.prompts()
    assert a.eos_token_id == EOS_TOKEN_ID
    ids = {pid for pid, _, _ in a.prompts()}
    assert len(ids) == 200
    for pid, toks, cap in a.prompts():
        assert all(0 <= t < 512 for t in toks)
        assert EOS_TOKEN_ID not in toks
        t = a.target_len(pid)
        assert cap == min(128, 2 * t + 8) and 2 <= t <= 60
        assert len(toks) >= 2 + 2  # BOS, length token, at least 2 filler tokens
    small = DemoTask(10, seed=0, vocab_size=256, max_new_tokens=64)
    assert all(t < 256 for _, toks, _ in small.prompts() for t in toks)


def test_targets_have_a_long_tail():
    task = DemoTask(512, seed=0)
    t = np.array([task.target_len(pid) for pid, _, _ in task.prompts()])
    assert 13 <= np.median(t) <= 19
    assert t.max() / np.median(t) >= 3.0
    assert np.percentile(t, 90) / np.median(t) >= 2.0  # the top decile is at least twice the median
    caps = np.array([cap for _, _, cap in task.prompts()])
    assert caps.max() / np.median(caps) >= 2.5


def test_reward_top_and_bottom():
    task = DemoTask(16, seed=0)
    for pid, _, cap in task.prompts():
        best = task.optimal_response(pid)
        assert task.reward(pid, best) == pytest.approx(1.0)
        assert task.reward(pid, best[:-1]) == pytest.approx(0.5)  # same tokens, never stopped
        assert task.reward(pid, [500] * cap) == 0.0  # wrong tokens, truncated
    with pytest.raises(KeyError, match="unknown demo prompt"):
        task.reward("nope", [1])


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="too small"):
        DemoTask(4, vocab_size=64)
    with pytest.raises(ValueError, match="max_new_tokens"):
        DemoTask(4, max_new_tokens=10)
    with pytest.raises(ValueError):
        DemoTask(0)


def test_jsonl_dataset_is_readable_by_the_planner(tmp_path):
    task = DemoTask(32, seed=5)
    path = task.to_jsonl(tmp_path / "demo.jsonl")
    ps = load_prompt_set(path, n=4)
    assert list(ps.prompt_ids) == [pid for pid, _, _ in task.prompts()]
    assert list(ps.prompt_lens) == [len(toks) for _, toks, _ in task.prompts()]


def test_reward_rises_and_lengths_move_under_grpo(tiny_model):
    """A dozen GRPO steps with a pure-HF sampler on the random tiny model (about 15 s on one core)."""
    torch.set_num_threads(1)
    task = DemoTask(64, seed=0)
    tr = GRPOTrainer(tiny_model, lr=3e-3, seed=0, micro_batch_size=64)
    rng = random.Random(0)
    rewards_per_step, stop_share, mean_len = [], [], []
    for step in range(14):
        batch = rng.sample(task.prompts(), 8)
        groups = sample_groups(tr.model, batch, n=8, eos_token_id=task.eos_token_id, version=tr.version,
                               seed=step)
        rewards = [[task.reward(g.prompt_id, s.token_ids) for s in g.samples] for g in groups]
        samples = [s for g in groups for s in g.samples]
        assert all(s.min_version == tr.version for s in samples)
        stop_share.append(np.mean([s.finish_reason == "stop" for s in samples]))
        mean_len.append(np.mean([len(s.token_ids) for s in samples]))
        stats = tr.train_step(groups, rewards)
        assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-3)  # sampler and trainer agree
        rewards_per_step.append(stats["reward_mean"])
    first, last = np.mean(rewards_per_step[:3]), np.mean(rewards_per_step[-3:])
    assert last > first + 0.08, rewards_per_step
    assert np.mean(stop_share[-3:]) > np.mean(stop_share[:3]) + 0.2, stop_share
    assert np.mean(mean_len[-3:]) < 0.8 * np.mean(mean_len[:3]), mean_len


def test_hf_sampler_respects_eos_and_caps_and_reports_true_logprobs(tiny_model):
    torch.set_num_threads(1)
    tr = GRPOTrainer(tiny_model, lr=1e-3, seed=0, temperature=1.3)
    task = DemoTask(4, seed=4)
    prompts = task.prompts()
    groups = sample_groups(tr.model, prompts, n=8, eos_token_id=1, version=7, temperature=1.3, seed=0)
    assert [g.prompt_id for g in groups] == [p[0] for p in prompts]
    assert len({g.group_id for g in groups}) == len(groups)
    for g, (_, toks, cap) in zip(groups, prompts):
        assert g.prompt_token_ids == toks and len(g.samples) == 8
        for s in g.samples:
            assert 1 <= len(s.token_ids) <= cap and s.min_version == s.max_version == 7
            if s.finish_reason == "stop":
                assert s.token_ids[-1] == 1 and 1 not in s.token_ids[:-1]
            else:
                assert s.finish_reason == "length" and len(s.token_ids) == cap and 1 not in s.token_ids
            mine = tr.sequence_logprobs(toks, s.token_ids)
            assert torch.allclose(mine, torch.tensor(s.logprobs), atol=1e-4)
