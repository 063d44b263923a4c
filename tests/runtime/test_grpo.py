"""GRPO math on tiny tensors: advantages, the clipped loss by hand, ratio = 1 gives plain policy gradient, KL."""
import math

import pytest

torch = pytest.importorskip("torch", reason="needs the runtime extra: pip install mindspeed-asp[runtime]")

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


def test_entropy_of_uniform():
    ent = grpo.token_entropy(torch.zeros(2, 8))
    assert ent.tolist() == pytest.approx([math.log(8)] * 2, rel=1e-6)


# ---------------------------------------------------------------------------- the decoupled objective
def _tiny_case():
    """Two rows, three tokens; the second row's last token is padding (with a junk behaviour value)."""
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.1], [0.4, 0.3, 0.9]]))
    prox = torch.log(torch.tensor([[0.25, 0.2, 0.2], [0.4, 0.5, 0.9]]))  # ratios 2, 1, 0.5 | 1, 0.6
    behav = torch.log(torch.tensor([[0.25, 0.1, 0.8], [0.1, 0.5, 1.0]]))  # prox/behav 1, 2, 0.25 | 4, 1
    behav[1, 2] = 123.0  # padding: must not matter
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    return logp, prox, behav, mask


def test_decoupled_token_mode_equals_hand_computation():
    logp, prox, behav, mask = _tiny_case()
    eps, cap = 0.2, 3.0
    adv = torch.tensor([1.0, -1.0])
    loss, terms = grpo.decoupled_policy_loss(logp, prox, behav, adv, mask, clip_eps=eps, iw_cap=cap)
    ratios = [[2.0, 1.0, 0.5], [1.0, 0.6]]
    weights = [[1.0, 2.0, 0.25], [3.0, 1.0]]  # 4.0 capped at 3.0
    for row, a in enumerate((1.0, -1.0)):
        for t, (r, w) in enumerate(zip(ratios[row], weights[row])):
            u, c = -a * r, -a * min(max(r, 1 - eps), 1 + eps)
            assert float(loss[row, t]) == pytest.approx(w * max(u, c), rel=1e-5), (row, t)
    assert float(loss[1, 2]) == 0.0  # padding
    # Clipped branch active: row 0 token 0 (A=+1, r=2 -> 1.2); row 1 token 1 (A=-1, r=0.6 -> 0.8).
    assert terms.clipped.tolist() == [[True, False, False], [False, True, False]]
    assert terms.capped.tolist() == [[False, False, False], [True, False, False]]
    st = grpo.offpolicy_stats(terms)
    assert st["tokens"] == 5
    assert st["iw_mean"] == pytest.approx((1 + 2 + 0.25 + 3 + 1) / 5)
    assert st["iw_max"] == pytest.approx(3.0)
    assert st["iw_frac_capped"] == pytest.approx(1 / 5)
    assert st["clip_frac"] == pytest.approx(2 / 5)
    diffs = [0.0, math.log(2), math.log(4), math.log(4), 0.0]  # |log(prox/behav)|
    assert st["behav_prox_absdiff_mean"] == pytest.approx(sum(diffs) / 5, rel=1e-5)
    assert st["behav_prox_absdiff_max"] == pytest.approx(math.log(4), rel=1e-5)
    assert st["behav_unreported_frac"] == 0.0


def test_decoupled_sequence_mode_one_weight_per_row():
    logp, prox, behav, mask = _tiny_case()
    adv = torch.tensor([1.0, 1.0])
    w, capped = grpo.importance_weights(prox, behav, mask, iw_cap=3.0, iw_mode="sequence")
    # Row 0: product of prox/behav = 1 * 2 * 0.25 = 0.5; row 1: 4 * 1 = 4 -> capped at 3. Padding: 1.
    assert w[0].tolist() == pytest.approx([0.5] * 3, rel=1e-5)
    assert w[1, :2].tolist() == pytest.approx([3.0, 3.0], rel=1e-6) and float(w[1, 2]) == 1.0
    assert capped.tolist() == [[False] * 3, [True, True, False]]
    loss_seq, terms = grpo.decoupled_policy_loss(logp, prox, behav, adv, mask, iw_cap=3.0, iw_mode="sequence")
    base, _ = grpo.clipped_policy_loss(logp, prox, adv, mask)
    assert torch.allclose(loss_seq, base * w * mask, rtol=1e-6)
    assert grpo.offpolicy_stats(terms)["iw_frac_capped"] == pytest.approx(2 / 5)  # token-weighted
    # The cap at infinity leaves the raw weights alone.
    w_inf, c_inf = grpo.importance_weights(prox, behav, mask, iw_cap=math.inf, iw_mode="sequence")
    assert float(w_inf[1, 0]) == pytest.approx(4.0, rel=1e-5) and not c_inf.any()


def test_decoupled_equals_standard_against_prox_when_behaviour_is_prox():
    torch.manual_seed(1)
    logits = torch.randn(4, 6, 13, requires_grad=True)
    targets = torch.randint(0, 13, (4, 6))
    mask = (torch.rand(4, 6) > 0.3).float()
    adv = torch.randn(4)
    logp = grpo.token_logprobs(logits, targets)
    prox = logp.detach() + 0.3 * torch.randn(4, 6)  # ratios away from 1, so the clip is exercised
    for mode in grpo.IW_MODES:
        dec, terms = grpo.decoupled_policy_loss(logp, prox, prox.clone(), adv, mask, 0.2, 0.28, iw_cap=2.0,
                                                iw_mode=mode)
        std, st = grpo.clipped_policy_loss(logp, prox, adv, mask, 0.2, 0.28)
        assert torch.equal(dec, std), mode  # bit for bit
        assert torch.equal(terms.weights, torch.ones_like(terms.weights))
        assert not terms.capped.any() and float(st["clip_count"]) == float(terms.clipped.sum()) > 0
        stats = grpo.offpolicy_stats(terms)
        assert stats["iw_mean"] == 1.0 and stats["iw_max"] == 1.0 and stats["behav_prox_absdiff_max"] == 0.0
    # `current` tokens take the proximal log-prob as behaviour whatever the engine said: weight exactly 1.
    stale = prox - 5.0
    dec, terms = grpo.decoupled_policy_loss(logp, prox, stale, adv, mask, current=torch.ones(4, 6, dtype=torch.bool))
    assert torch.equal(dec, grpo.clipped_policy_loss(logp, prox, adv, mask)[0])
    # grpo_token_loss routes to the decoupled objective when given prox_logp, with the same totals.
    total, st = grpo.grpo_token_loss(logp, prox, adv, mask, prox_logp=prox)
    assert float(total.detach()) == float(grpo.grpo_token_loss(logp, prox, adv, mask)[0].detach())
    assert isinstance(st["offpolicy"], grpo.OffPolicyTerms)


def test_decoupled_gradient_flows_through_logp_only_and_is_weighted():
    torch.manual_seed(2)
    logp = torch.randn(2, 4, requires_grad=True)
    prox = (logp.detach() + 0.05).requires_grad_(True)  # inside the clip range: r = e^-0.05
    behav = (prox.detach() - torch.tensor([[0.5], [-0.5]])).requires_grad_(True)
    adv = torch.tensor([1.0, -2.0])
    mask = torch.ones(2, 4)
    loss, terms = grpo.decoupled_policy_loss(logp, prox, behav, adv, mask, iw_cap=10.0)
    loss.sum().backward()
    assert prox.grad is None and behav.grad is None
    assert not terms.weights.requires_grad
    # d/dlogp of w * (-A * exp(logp - prox)) = -A * w * r, with w = e^{+0.5} (row 0) and e^{-0.5} (row 1).
    r = math.exp(-0.05)
    expected = torch.tensor([[-1.0 * math.exp(0.5) * r] * 4, [2.0 * math.exp(-0.5) * r] * 4])
    assert torch.allclose(logp.grad, expected, rtol=1e-5)


def test_unreported_behaviour_counts_as_proximal_and_lags_break_down():
    logp, prox, behav, mask = _tiny_case()
    behav = behav.clone()
    behav[0, 1] = float("nan")  # the engine did not report this token: weight 1, counted
    behav[1, 0] = float("inf")
    loss, terms = grpo.decoupled_policy_loss(logp, prox, behav, torch.tensor([1.0, 1.0]), mask, iw_cap=3.0)
    assert torch.isfinite(loss).all()
    assert float(terms.weights[0, 1]) == 1.0 and float(terms.weights[1, 0]) == 1.0
    st = grpo.offpolicy_stats(terms.with_row_lags([2, 0]))
    assert st["behav_unreported_frac"] == pytest.approx(2 / 5)
    assert st["iw_mean_lag2"] == pytest.approx((1.0 + 1.0 + 0.25) / 3)
    assert st["iw_mean_lag0"] == pytest.approx(1.0)
    # Micro-batches of different widths concatenate into one summary.
    both = grpo.OffPolicyTerms.concat([terms.with_row_lags([2, 0]), terms.with_row_lags([1, 1])])
    assert grpo.offpolicy_stats(both)["tokens"] == 10 and "iw_mean_lag1" in grpo.offpolicy_stats(both)
    assert grpo.offpolicy_stats(grpo.OffPolicyTerms.concat([terms]))["tokens"] == 5


def test_decoupled_refuses_bad_settings():
    logp, prox, behav, mask = _tiny_case()
    adv = torch.tensor([1.0, 1.0])
    with pytest.raises(ValueError, match="iw_mode"):
        grpo.decoupled_policy_loss(logp, prox, behav, adv, mask, iw_mode="row")
    with pytest.raises(ValueError, match="iw_cap"):
        grpo.decoupled_policy_loss(logp, prox, behav, adv, mask, iw_cap=0.5)
    with pytest.raises(ValueError, match="shape mismatch"):
        grpo.decoupled_policy_loss(logp, prox[:, :2], behav, adv, mask)
    empty = grpo.offpolicy_stats(grpo.decoupled_policy_loss(logp, prox, behav, adv, torch.zeros(2, 3))[1])
    assert empty["tokens"] == 0 and empty["iw_mean"] == 1.0
