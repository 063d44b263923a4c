"""GRPO math on tiny tensors: advantages, the clipped loss by hand, ratio = 1 gives plain policy gradient, KL."""
import math

import pytest
import torch

from mindspeed_asp.runtime import grpo


def test_advantages_zero_mean_unit_std_per_group():
    adv = grpo.group_advantages([[1.0, 0.0, 0.0, 1.0], [0.2, 0.5, 0.9]])
    for a in adv:
        assert abs(float(a.sum())) < 1e-5
        assert float(a.std(unbiased=True)) == pytest.approx(1.0, abs=1e-4)
    # Hand value: rewards [1,0,0,1], mean 0.5, unbiased std sqrt(1/3).
    assert float(adv[0][0]) == pytest.approx(0.5 / math.sqrt(1 / 3), rel=1e-4)
    assert float(adv[0][1]) < 0 < float(adv[0][0])


def test_constant_rewards_and_singleton_groups_have_zero_advantage():
    adv = grpo.group_advantages([[1.0, 1.0, 1.0], [0.0, 0.0], [0.7]])
    for a in adv:
        assert torch.equal(a, torch.zeros_like(a))
        assert torch.isfinite(a).all()


def test_mean_centred_advantages_without_std():
    adv = grpo.group_advantages([[3.0, 1.0]], scale_by_std=False)
    assert adv[0].tolist() == [1.0, -1.0]


def test_bad_rewards_raise():
    with pytest.raises(ValueError, match="no rewards"):
        grpo.group_advantages([[]])
    with pytest.raises(ValueError, match="non-finite"):
        grpo.group_advantages([[1.0, float("nan")]])


def test_clipped_loss_equals_hand_computation():
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.1]]))
    old = torch.log(torch.tensor([[0.25, 0.2, 0.2]]))  # ratios 2.0, 1.0, 0.5
    mask = torch.tensor([[1.0, 1.0, 1.0]])
    eps = 0.2
    for a in (1.0, -1.0):
        loss, stats = grpo.clipped_policy_loss(logp, old, torch.tensor([a]), mask, clip_eps=eps)
        expected = []
        clipped = 0
        for r in (2.0, 1.0, 0.5):
            u, c = -a * r, -a * min(max(r, 1 - eps), 1 + eps)
            expected.append(max(u, c))
            clipped += c > u
        assert loss[0].tolist() == pytest.approx(expected, rel=1e-5)
        assert float(stats["clip_count"]) == clipped
        assert float(stats["ratio_sum"]) == pytest.approx(3.5, rel=1e-5)
    # A=+1: ratio 2.0 clipped to 1.2 (loss -1.2); ratio 0.5 unclipped (-0.5): pessimistic bound.
    loss, _ = grpo.clipped_policy_loss(logp, old, torch.tensor([1.0]), mask, clip_eps=eps)
    assert loss[0].tolist() == pytest.approx([-1.2, -1.0, -0.5], rel=1e-5)


def test_asymmetric_clip_and_padding_mask():
    logp = torch.log(torch.tensor([[0.5, 0.9]]))
    old = torch.log(torch.tensor([[0.25, 0.1]]))  # ratio 2.0 and 9.0 (the second is padding)
    mask = torch.tensor([[1.0, 0.0]])
    loss, stats = grpo.clipped_policy_loss(logp, old, torch.tensor([1.0]), mask, clip_eps=0.2, clip_eps_high=0.28)
    assert loss[0].tolist() == pytest.approx([-1.28, 0.0], rel=1e-5)
    assert float(stats["ratio_max"]) == pytest.approx(2.0, rel=1e-5)  # padding never counted


def test_ratio_one_gives_plain_policy_gradient():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, requires_grad=True)
    targets = torch.randint(0, 11, (3, 5))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]], dtype=torch.float32)
    adv = torch.tensor([0.7, -1.3, 0.4])

    logp = grpo.token_logprobs(logits, targets)
    loss, stats = grpo.clipped_policy_loss(logp, logp.detach(), adv, mask, clip_eps=0.2)
    (loss.sum() / mask.sum()).backward()
    g_grpo = logits.grad.clone()
    assert float(stats["clip_count"]) == 0
    assert float(stats["ratio_sum"]) == pytest.approx(float(mask.sum()))

    logits.grad = None
    logp = grpo.token_logprobs(logits, targets)
    pg = -(adv[:, None] * logp * mask).sum() / mask.sum()  # REINFORCE with the group baseline in adv
    pg.backward()
    assert torch.allclose(g_grpo, logits.grad, atol=1e-6)


def test_kl_is_zero_for_identical_models_and_positive_otherwise():
    logp = torch.log(torch.tensor([[0.3, 0.6, 0.1]]))
    mask = torch.ones(1, 3)
    assert torch.equal(grpo.kl_k3(logp, logp.clone(), mask), torch.zeros(1, 3))
    ref = torch.log(torch.tensor([[0.5, 0.4, 0.1]]))
    kl = grpo.kl_k3(logp, ref, mask)
    assert (kl >= 0).all() and float(kl.sum()) > 0
    d = math.log(0.5 / 0.3)
    assert float(kl[0, 0]) == pytest.approx(math.exp(d) - d - 1, rel=1e-5)


def test_grpo_token_loss_adds_kl_term():
    logp = torch.log(torch.tensor([[0.3, 0.6]]))
    ref = torch.log(torch.tensor([[0.5, 0.4]]))
    mask = torch.ones(1, 2)
    adv = torch.tensor([1.0])
    base, st0 = grpo.grpo_token_loss(logp, logp, adv, mask)
    with_kl, st1 = grpo.grpo_token_loss(logp, logp, adv, mask, ref_logp=ref, kl_coef=0.1)
    assert float(st0["kl_sum"]) == 0.0
    assert float(with_kl - base) == pytest.approx(0.1 * float(st1["kl_sum"]), rel=1e-5)


def test_entropy_of_uniform_and_padding_bubble():
    ent = grpo.token_entropy(torch.zeros(2, 8))
    assert ent.tolist() == pytest.approx([math.log(8)] * 2, rel=1e-6)
    assert grpo.padding_bubble([3, 5, 4]) == (3, 12)
    assert grpo.padding_bubble([]) == (0, 0)
