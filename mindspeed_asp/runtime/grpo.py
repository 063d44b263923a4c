"""Pure GRPO math: group-normalised advantages, the clipped surrogate loss, the KL penalty, entropy.

Kept free of models and optimizers so every formula can be checked by hand on tiny tensors
(tests/runtime/test_grpo.py) and reused by any trainer (the reference PyTorch trainer here, or a Megatron actor).

Conventions (the ones verl / TRL use for GRPO):
- advantage of sample i in a group: (r_i - mean(r)) / (std(r) + eps), with the unbiased std; a group whose
  rewards are all equal (or a group of one) carries no signal and gets advantage 0 for every sample;
- ratio = exp(logp_current - logp_behaviour) per response token, where logp_behaviour is what the rollout
  engine reported when it sampled the token (so off-policy samples are importance-corrected);
- per-token loss = max(-A * ratio, -A * clip(ratio, 1 - eps_low, 1 + eps_high)) (PPO's pessimistic bound);
- KL to a frozen reference uses the k3 estimator exp(ref - cur) - (ref - cur) - 1 (non-negative, 0 when equal).

The decoupled objective (AReaL's "decoupled PPO", `decoupled_policy_loss`) separates the two roles the
behaviour log-prob plays above: the PPO trust region is taken around the proximal policy (the trainer's
weights before this update), and the gap between the proximal and the behaviour policy (a stale sampler)
is corrected by a truncated importance weight min(pi_prox / pi_behav, cap), detached. The reference trainer
and the MindSpeed-RL loss patch both call this one function.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
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


IW_MODES = ("token", "sequence")


@dataclass
class OffPolicyTerms:
    """Detached per-token quantities of one decoupled-loss evaluation, kept for the logs.

    All tensors share one shape ([B, T] as `decoupled_policy_loss` returns them, 1-D after `flat()` or
    `concat()`); values where `mask` is False carry no meaning. `lags` (int, per token) is filled by the
    caller, who knows each row's policy version; None when unknown.
    """

    mask: torch.Tensor  # bool: valid response tokens
    absdiff: torch.Tensor  # |logp_prox - logp_behav| (0 where the behaviour log-prob was not reported)
    weights: torch.Tensor  # importance weight applied, after the cap
    capped: torch.Tensor  # bool: the untruncated weight exceeded the cap
    clipped: torch.Tensor  # bool: PPO's clipped branch was the active maximum
    ratio: torch.Tensor  # exp(logp - logp_prox)
    unreported: torch.Tensor  # bool: the behaviour log-prob was NaN/inf and was taken as proximal
    lags: Optional[torch.Tensor] = None

    def with_row_lags(self, row_lags: Sequence[int]) -> "OffPolicyTerms":
        """A copy whose `lags` give every token its row's lag (`row_lags` has one entry per row)."""
        lag = torch.as_tensor(list(row_lags), dtype=torch.long, device=self.mask.device)
        if lag.numel() != self.mask.shape[0]:
            raise ValueError(f"{lag.numel()} row lags for {self.mask.shape[0]} rows")
        lag = lag.view(-1, *([1] * (self.mask.dim() - 1))).expand_as(self.mask)
        return OffPolicyTerms(**{**self._tensors(), "lags": lag})

    def flat(self) -> "OffPolicyTerms":
        """1-D tensors over the valid tokens only, on the CPU (micro-batches of any width concatenate)."""
        keep = self.mask.bool()
        out = {k: (None if v is None else v[keep].detach().cpu()) for k, v in self._tensors().items()}
        return OffPolicyTerms(**out)

    @staticmethod
    def concat(parts: Sequence["OffPolicyTerms"]) -> "OffPolicyTerms":
        """The valid tokens of several evaluations (e.g. the micro-batches of one update) as one."""
        if not parts:
            raise ValueError("concat needs at least one OffPolicyTerms")
        flats = [p.flat() for p in parts]
        with_lags = all(f.lags is not None for f in flats)
        out = {}
        for f in fields(OffPolicyTerms):
            if f.name == "lags" and not with_lags:
                out[f.name] = None
            else:
                out[f.name] = torch.cat([getattr(p, f.name) for p in flats])
        return OffPolicyTerms(**out)

    def _tensors(self) -> Dict[str, Optional[torch.Tensor]]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _check_iw(iw_cap: float, iw_mode: str) -> None:
    if iw_mode not in IW_MODES:
        raise ValueError(f"iw_mode must be one of {IW_MODES}, got {iw_mode!r}")
    if not (iw_cap >= 1.0):  # also refuses NaN
        raise ValueError(f"iw_cap must be >= 1 (a cap below 1 would down-weight on-policy tokens), got {iw_cap!r}")


def importance_weights(prox_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor,
                       iw_cap: float = 2.0, iw_mode: str = "token") -> Tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance weights min(pi_prox / pi_behav, iw_cap) [B, T], detached, and where the cap bit.

    `token`: one weight per token from its own log-ratio. `sequence`: one weight per row, exp of the sum of
    the log-ratios over the row's valid tokens, broadcast to its tokens. Padding gets weight 1, never capped.
    Behaviour log-probs must be finite here (`decoupled_policy_loss` replaces unreported ones first).
    """
    _check_iw(iw_cap, iw_mode)
    valid = mask > 0
    with torch.no_grad():
        d = torch.where(valid, prox_logp.detach() - behaviour_logp.detach(), torch.zeros_like(prox_logp))
        if iw_mode == "sequence":
            d = d.sum(-1, keepdim=True).expand_as(d)
        raw = torch.exp(d)  # may be inf for a very stale row: the cap takes it
        capped = (raw > iw_cap) & valid
        w = torch.where(valid, raw.clamp(max=iw_cap), torch.ones_like(raw))
    return w, capped


def decoupled_policy_loss(logp: torch.Tensor, prox_logp: torch.Tensor, behaviour_logp: torch.Tensor,
                          advantages: torch.Tensor, mask: torch.Tensor, clip_eps: float = 0.2,
                          clip_eps_high: Optional[float] = None, iw_cap: float = 2.0, iw_mode: str = "token",
                          current: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, OffPolicyTerms]:
    """Per-token decoupled PPO loss [B, T] (not reduced, 0 at padding) and the detached terms for the logs.

    loss_t = w_t * max(-A * r_t, -A * clip(r_t, 1 - eps, 1 + eps_high)), r_t = exp(logp - logp_prox),
    w_t = min(exp(logp_prox - logp_behav), iw_cap) detached (per token or per sequence, `iw_mode`).
    Gradients flow through `logp` only. `current` (bool, optional) marks tokens generated by the weights the
    trainer holds now: their behaviour policy *is* the proximal one, so their behaviour log-prob is replaced by
    the proximal one (weight exactly 1). A NaN/inf behaviour log-prob (an engine that did not report the
    token) is treated the same way and counted in `unreported`. With behaviour == proximal every weight is
    exactly 1.0 and the loss equals `clipped_policy_loss(logp, prox_logp, ...)` bit for bit.
    """
    if not (logp.shape == prox_logp.shape == behaviour_logp.shape == mask.shape):
        raise ValueError(f"shape mismatch: logp {tuple(logp.shape)}, proximal {tuple(prox_logp.shape)}, "
                         f"behaviour {tuple(behaviour_logp.shape)}, mask {tuple(mask.shape)}")
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    valid = mask > 0
    m = mask.to(logp.dtype)
    prox = prox_logp.detach().to(logp.dtype)
    behaviour = behaviour_logp.detach().to(logp.dtype)
    unreported = ~torch.isfinite(behaviour) & valid
    take_prox = ~torch.isfinite(behaviour)
    if current is not None:
        take_prox = take_prox | current.to(torch.bool)
    behaviour = torch.where(take_prox, prox, behaviour)
    w, capped = importance_weights(prox, behaviour, valid, iw_cap, iw_mode)
    adv = advantages.to(logp.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1)
    ratio = torch.exp(torch.where(valid, logp - prox, torch.zeros_like(logp)))  # 0 at padding keeps exp finite
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + hi)
    loss = w * torch.maximum(unclipped, clipped) * m
    with torch.no_grad():
        terms = OffPolicyTerms(
            mask=valid, absdiff=torch.where(valid, (prox - behaviour).abs(), torch.zeros_like(prox)),
            weights=w, capped=capped, clipped=(clipped > unclipped) & valid, ratio=ratio.detach(),
            unreported=unreported)
    return loss, terms


def offpolicy_stats(terms: OffPolicyTerms) -> Dict[str, float]:
    """Logging summary over the valid tokens: how far behaviour and proximal policies are apart, what the
    importance weights did, how often PPO clipped; per lag when `terms.lags` is set.

    Keys (the caller adds its prefix): behav_prox_absdiff_mean, behav_prox_absdiff_max, iw_mean, iw_max,
    iw_frac_capped, clip_frac, behav_unreported_frac, tokens, and iw_mean_lag{k} for every lag k present.
    All zeros (iw 1.0) for an empty mask.
    """
    f = terms.flat()
    n = int(f.mask.numel())
    if n == 0:
        return {"behav_prox_absdiff_mean": 0.0, "behav_prox_absdiff_max": 0.0, "iw_mean": 1.0, "iw_max": 1.0,
                "iw_frac_capped": 0.0, "clip_frac": 0.0, "behav_unreported_frac": 0.0, "tokens": 0}
    w = f.weights.double()
    out: Dict[str, float] = {
        "behav_prox_absdiff_mean": float(f.absdiff.double().mean()),
        "behav_prox_absdiff_max": float(f.absdiff.max()),
        "iw_mean": float(w.mean()),
        "iw_max": float(w.max()),
        "iw_frac_capped": float(f.capped.double().mean()),
        "clip_frac": float(f.clipped.double().mean()),
        "behav_unreported_frac": float(f.unreported.double().mean()),
        "tokens": n,
    }
    if f.lags is not None:
        for k in sorted(int(x) for x in torch.unique(f.lags)):
            out[f"iw_mean_lag{k}"] = float(w[f.lags == k].mean())
    return out


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
                    prox_logp: Optional[torch.Tensor] = None, iw_cap: float = 2.0, iw_mode: str = "token",
                    current: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """Summed GRPO loss over the masked tokens of one micro-batch, and summed statistics.

    The caller divides by the minibatch's total response tokens (token-mean over the whole minibatch, so
    gradient accumulation over micro-batches gives the same update as one big batch). Without `prox_logp`
    this is the standard objective (ratio against the behaviour log-probs); with it, the decoupled one
    (`decoupled_policy_loss`), and stats["offpolicy"] holds its `OffPolicyTerms`.
    """
    if prox_logp is None:
        pg, stats = clipped_policy_loss(logp, behaviour_logp, advantages, mask, clip_eps, clip_eps_high)
    else:
        pg, terms = decoupled_policy_loss(logp, prox_logp, behaviour_logp, advantages, mask, clip_eps,
                                          clip_eps_high, iw_cap, iw_mode, current)
        valid = terms.mask
        ratio = torch.where(valid, terms.ratio, torch.zeros_like(terms.ratio))
        stats = {
            "clip_count": terms.clipped.sum().to(logp.dtype),
            "ratio_sum": ratio.sum(),
            "ratio_max": ratio.max() if ratio.numel() else torch.tensor(0.0),
            "mismatch_sum": torch.where(valid & ~terms.unreported, behaviour_logp.to(logp.dtype) - logp.detach(),
                                        torch.zeros_like(ratio)).sum(),
            "offpolicy": terms,
        }
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

