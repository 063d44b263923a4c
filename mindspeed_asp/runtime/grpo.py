"""Pure GRPO math: group-normalised advantages, the clipped surrogate loss, the KL penalty, entropy.

Kept free of models and optimizers so every formula can be checked by hand on tiny tensors
(tests/test_grpo.py) and reused by any trainer (the reference PyTorch trainer here, or a Megatron actor).

Conventions (the ones verl / TRL use for GRPO):
- advantage of sample i in a group: (r_i - mean(r)) / (std(r) + eps), with the unbiased std; a group whose
  rewards are all equal (or a group of one) carries no signal and gets advantage 0 for every sample;
- ratio = exp(logp_current - logp_behaviour) per response token, where logp_behaviour is what the rollout
  engine reported when it sampled the token (so off-policy samples are importance-corrected);
- per-token loss = max(-A * ratio, -A * clip(ratio, 1 - eps_low, 1 + eps_high)) (PPO's pessimistic bound);
- KL to a frozen reference uses the k3 estimator exp(ref - cur) - (ref - cur) - 1 (non-negative, 0 when equal).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch


def group_advantages(rewards: Sequence[Sequence[float]], eps: float = 1e-6,
                     scale_by_std: bool = True) -> List[torch.Tensor]:
    """Per-group normalised advantages, one float32 tensor per group (groups may differ in size).

    `scale_by_std=False` gives Dr.GRPO's mean-centred advantages. Constant-reward groups get zeros (their
    std is 0, and dividing 0 by eps would be 0 anyway; stated so the behaviour is explicit).
    """
    out: List[torch.Tensor] = []
    for g, group in enumerate(rewards):
        r = torch.as_tensor(list(group), dtype=torch.float64)
        if r.numel() == 0:
            raise ValueError(f"group {g} has no rewards")
        if not torch.isfinite(r).all():
            raise ValueError(f"group {g} has a non-finite reward: {list(group)}")
        if r.numel() == 1:
            out.append(torch.zeros(1, dtype=torch.float32))
            continue
        centred = r - r.mean()
        if scale_by_std:
            std = r.std(unbiased=True)
            adv = torch.zeros_like(r) if float(std) == 0.0 else centred / (std + eps)
        else:
            adv = centred
        out.append(adv.to(torch.float32))
    return out


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) under `logits` [..., V], gathered at `targets` [...]; computed in float32."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution per position, float32 [...]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum()


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `x` over positions where mask is 1; 0 (not NaN) for an empty mask."""
    return (x * mask).sum() / mask.sum().clamp_min(1)


def clipped_policy_loss(logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor,
                        mask: torch.Tensor, clip_eps: float = 0.2,
                        clip_eps_high: Optional[float] = None) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """Per-token PPO-clip loss [B, T] (not yet reduced) and detached statistics.

    `advantages` is per sequence [B] or per token [B, T]. Masked positions contribute 0. Returned stats
    (all over masked tokens): `clip_count` (tokens where the clipped branch was the active maximum),
    `ratio_sum`, `ratio_max`, `mismatch_sum` (behaviour - current log-prob, an estimate of KL(behaviour||current)).
    """
    if logp.shape != behaviour_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"shape mismatch: logp {tuple(logp.shape)}, behaviour {tuple(behaviour_logp.shape)}, "
                         f"mask {tuple(mask.shape)}")
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1)
    log_ratio = (logp - behaviour_logp.to(logp.dtype)) * mask  # 0 at padding: keeps exp() finite
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + hi)
    loss = torch.maximum(unclipped, clipped) * mask
    with torch.no_grad():
        was_clipped = (clipped > unclipped).to(logp.dtype) * mask
        masked_ratio = torch.where(mask > 0, ratio, torch.zeros_like(ratio))
        stats = {
            "clip_count": was_clipped.sum(),
            "ratio_sum": masked_ratio.sum(),
            "ratio_max": masked_ratio.max() if masked_ratio.numel() else torch.tensor(0.0),
            "mismatch_sum": (-log_ratio * mask).sum(),
        }
    return loss, stats


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(current || reference) [B, T], 0 at masked positions.

    k3 = exp(ref - cur) - (ref - cur) - 1 is unbiased for the KL under samples from the current policy,
    always >= 0, and exactly 0 when the two models agree (Schulman's "Approximating KL divergence").
    """
    d = (ref_logp - logp) * mask.to(logp.dtype)
    return (torch.exp(d) - d - 1.0) * mask.to(logp.dtype)


def grpo_token_loss(logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor, clip_eps: float = 0.2, clip_eps_high: Optional[float] = None,
                    ref_logp: Optional[torch.Tensor] = None, kl_coef: float = 0.0,
                    ) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """Summed GRPO loss over the masked tokens of one micro-batch, and summed statistics.

    The caller divides by the minibatch's total response tokens (token-mean over the whole minibatch, so
    gradient accumulation over micro-batches gives the same update as one big batch).
    """
    pg, stats = clipped_policy_loss(logp, behaviour_logp, advantages, mask, clip_eps, clip_eps_high)
    total = pg.sum()
    stats["pg_sum"] = pg.detach().sum()
    if ref_logp is not None and kl_coef != 0.0:
        kl = kl_k3(logp, ref_logp, mask)
        total = total + kl_coef * kl.sum()
        stats["kl_sum"] = kl.detach().sum()
    elif ref_logp is not None:
        stats["kl_sum"] = kl_k3(logp.detach(), ref_logp, mask).sum()
    else:
        stats["kl_sum"] = torch.zeros((), dtype=logp.dtype)
    return total, stats


def padding_bubble(lengths: Sequence[int]) -> Tuple[int, int]:
    """(padded tokens, real tokens) of one right-padded micro-batch: DESIGN.md section 5's training bubble."""
    if not lengths:
        return 0, 0
    real = int(sum(lengths))
    return int(max(lengths)) * len(lengths) - real, real
