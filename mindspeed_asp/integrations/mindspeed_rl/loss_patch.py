"""The decoupled PPO objective inside MindSpeed-RL's GRPO actor loss, for ASP's asynchronous pool.

MindSpeed-RL's GRPO loss clips the ratio against `old_log_prob`, which it recomputes with the trainer's
weights before the update (the proximal policy), and never reads the log-probs the sampler reported. With
ASP's separate rollout pool a sample may come from weights one or two versions older, so its gradient is
uncorrected. Two patches fix that, with the same function the reference trainer uses
(`mindspeed_asp.runtime.grpo.decoupled_policy_loss`; the formula exists once):

1. `BaseWorker.dispatch_transfer_dock_data`: the actor update's own request (stage `actor_train`, asking
   for the update's columns) also fetches ASP's columns `rollout_log_prob` (behaviour log-probs, written by
   the asynchronous trainer) and `policy_version`; every other dispatch is MindSpeed-RL's, unchanged.
2. `GRPOActorLossFunc.compute_loss`: while ASP's pool is active, when the micro-batch holds
   `rollout_log_prob`, each token's loss is w * max(-A r, -A clip(r)) with r against `old_log_prob` and
   w = min(pi_old / pi_rollout, iw_cap); KL and entropy terms, the aggregation and the stats are
   MindSpeed-RL's. Otherwise (no ASP config, stock mode, the synchronous colocated plan, `objective:
   standard`), without the column, or with `forward_only`, the original runs unchanged, bit for bit.

`objective` / `iw_cap` / `iw_mode` come from the run's `asp:` section (defaults decoupled / 2.0 / token;
`objective: standard` leaves both targets stock). The per-lag stats need the
trainer's policy version in the actor process: the asynchronous trainer calls `set_trainer_version(v)` there
(e.g. when it pushes version v); until then they are skipped.
"""
from __future__ import annotations

import os
from functools import lru_cache
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from mindspeed_asp.integrations.mindspeed_rl.data_patches import POLICY_VERSION, ROLLOUT_LOG_PROB

DEFAULT_OBJECTIVE = "decoupled"
DEFAULT_IW_CAP = 2.0
DEFAULT_IW_MODE = "token"
ASP_TRAIN_COLUMNS = (ROLLOUT_LOG_PROB, POLICY_VERSION)

_TRAINER_VERSION: Optional[int] = None


def set_trainer_version(version: Optional[int]) -> None:
    """Record, in this (actor) process, the policy version the next update trains from (None = unknown)."""
    global _TRAINER_VERSION
    _TRAINER_VERSION = None if version is None else int(version)


def trainer_version() -> Optional[int]:
    return _TRAINER_VERSION


class LossSettings(NamedTuple):
    """What the patches need from the run's config."""

    active: bool  # ASP's asynchronous pool runs and the objective is decoupled: the patches act
    objective: str
    iw_cap: float
    iw_mode: str


@lru_cache(maxsize=4)
def _settings(config_path: Optional[str]) -> LossSettings:
    """The settings of the run's config, cached per path (read once per process, not once per micro-batch)."""
    from mindspeed_asp.integrations.mindspeed_rl.config_section import topology_from_env
    topo = topology_from_env() if config_path else None
    if topo is None:
        return LossSettings(False, DEFAULT_OBJECTIVE, DEFAULT_IW_CAP, DEFAULT_IW_MODE)
    objective = str(getattr(topo.asp, "objective", DEFAULT_OBJECTIVE))
    return LossSettings(bool(topo.separate_pool) and objective == "decoupled", objective,
                        float(getattr(topo.asp, "iw_cap", DEFAULT_IW_CAP)),
                        str(getattr(topo.asp, "iw_mode", DEFAULT_IW_MODE)))


def asp_settings() -> LossSettings:
    """The patches' settings from env ASP_MSRL_CONFIG; inactive (decoupled, 2.0, token) without it."""
    from mindspeed_asp.integrations.mindspeed_rl.config_section import CONFIG_ENV
    return _settings(os.environ.get(CONFIG_ENV) or None)


def clear_settings_cache() -> None:
    """Forget the cached config (tests, or a process that switches runs)."""
    _settings.cache_clear()


# ---------------------------------------------------------------------------- target 1: the columns
#: Columns only the actor update asks for (ActorHybridWorkerBase.update: GRPO and DAPO, with or without
#: old_log_prob); a dispatch asking for all of them is the update's own request.
UPDATE_REQUEST_COLUMNS = ("responses", "advantages")


def is_update_request(stage: str, columns: Any) -> bool:
    """True for the actor update's own dispatch: stage `actor_train` asking for the update's columns."""
    return stage == "actor_train" and all(c in columns for c in UPDATE_REQUEST_COLUMNS)


def dispatch_transfer_dock_data_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    """The actor update also fetches the behaviour log-probs and policy versions when ASP's pool is active.

    Scope: only the update's own request (`is_update_request`), never another `actor_train` dispatch.
    Decision, from `broadcast_data_hccl` (base_worker.py): every rank of a TP/CP/PP group loops over its *own*
    `experience_columns` (shape, dtype, length and ndim broadcasts, then the data), so adding columns is
    consistent for TP > 1 when every rank of the group runs this wrapper with the same config. They do: the
    hook and `ASP_MSRL_CONFIG` reach every Megatron worker through the runtime env. For the update call the
    extra collectives are therefore no contract break, only more of them. Adding them to *every*
    `actor_train` dispatch was one: a caller that asked for other columns (the peer's unit test pins
    `broadcast.call_count == 3` for `experience_columns=[]`; any other consumer of the stage) got a different
    collective sequence and would wait in the dock for columns that only ASP's asynchronous trainer writes.
    """
    def dispatch_transfer_dock_data(self, experience_consumer_stage, experience_columns, experience_count,
                                    tp_size=1, cp_size=1, cp_algo=None, use_vllm=False, indexes=None,
                                    get_n_samples=True, enable_partial_rollout=False, is_generate=False):
        if is_update_request(experience_consumer_stage, experience_columns) and asp_settings().active:
            experience_columns = list(experience_columns) + [
                c for c in ASP_TRAIN_COLUMNS if c not in experience_columns]
        return orig(self, experience_consumer_stage, experience_columns, experience_count, tp_size, cp_size,
                    cp_algo, use_vllm=use_vllm, indexes=indexes, get_n_samples=get_n_samples,
                    enable_partial_rollout=enable_partial_rollout, is_generate=is_generate)
    dispatch_transfer_dock_data.__wrapped__ = orig  # type: ignore[attr-defined]
    return dispatch_transfer_dock_data


# ---------------------------------------------------------------------------- target 2: the loss
def fit_width(values: Any, like: Any) -> Any:
    """`values` [B, T'] as a float tensor shaped like `like` [B, T] on its device: cut, or padded with NaN
    (a NaN behaviour log-prob counts as not reported: weight 1)."""
    import torch
    v = values.to(device=like.device, dtype=like.dtype)
    if v.dim() == 1:
        v = v.unsqueeze(0)
    t = like.shape[-1]
    if v.shape[-1] >= t:
        return v[..., :t]
    pad = torch.full((*v.shape[:-1], t - v.shape[-1]), float("nan"), dtype=v.dtype, device=v.device)
    return torch.cat([v, pad], dim=-1)


def row_lags(batch: Dict[str, Any], version: Optional[int]) -> Optional[List[int]]:
    """Per-row lag (trainer version - policy version of the row), or None when either is unknown."""
    if version is None or POLICY_VERSION not in batch or batch[POLICY_VERSION] is None:
        return None
    pv = batch[POLICY_VERSION]
    pv = pv.reshape(pv.shape[0], -1)[:, 0] if pv.dim() > 0 else pv.reshape(1)
    return [int(version) - int(x) for x in pv.tolist()]


def decoupled_compute_loss(self: Any, output: Any, batch: Dict[str, Any], **kwargs: Any) -> Tuple[Any, Dict]:
    """GRPOActorLossFunc.compute_loss (forward_only=False) with the decoupled objective; see the module doc."""
    import torch
    import mindspeed_rl.utils.torch_functional as F
    from mindspeed_rl.utils.compute import compute_kl_penalty
    from mindspeed_rl.utils.utils import MsProbe, generate_mask

    from mindspeed_asp.runtime.grpo import decoupled_policy_loss, offpolicy_stats

    log_probs, entropy = self.compute_log_probs(output=output, batch=batch, skip_entropy=(self.entropy_coeff == 0),
                                                **kwargs)
    if "responses" not in batch:
        raise ValueError("The responses is None")
    mask = generate_mask(batch["responses"], batch["response_length"]).to(log_probs.device)
    old_log_prob = batch.get("old_log_prob")
    advantages = batch.get("advantages")
    ref_log_prob = batch.get("ref_log_prob")
    # MindSpeed-RL skips the old-log-prob pass when one update consumes the batch; then the proximal policy
    # is the current one, as in its own `_compute_grpo_policy_loss`.
    prox = log_probs.detach().clone() if old_log_prob is None else old_log_prob
    behaviour = fit_width(batch[ROLLOUT_LOG_PROB], log_probs)
    # MindSpeed-RL pads every column with the tokenizer's pad id, a positive number that is no log-prob: a
    # row shorter than its response would otherwise read it as one. Positive = not reported (weight 1).
    behaviour = torch.where(behaviour > 0, torch.full_like(behaviour, float("nan")), behaviour)
    lags = row_lags(batch, trainer_version())
    current = None
    if lags is not None:  # lag 0: generated by the weights old_log_prob was computed with
        current = torch.tensor(lags, device=log_probs.device).view(-1, 1).expand_as(log_probs) <= 0
    settings = asp_settings()

    pg_losses, terms = decoupled_policy_loss(log_probs, prox, behaviour, advantages, mask,
                                             clip_eps=self.clip_ratio, iw_cap=settings.iw_cap,
                                             iw_mode=settings.iw_mode,
                                             current=current)
    # From here on, MindSpeed-RL's `_compute_grpo_policy_loss` with the weighted per-token losses.
    negative_approx_kl = log_probs - prox
    ppo_kl = F.masked_mean(-negative_approx_kl, mask)
    entropy_loss = F.masked_mean(entropy, mask)
    pg_mean_loss = F.masked_mean(pg_losses, mask)
    pg_mean_clipfrac = F.masked_mean(terms.clipped.float(), mask)
    kl_losses = compute_kl_penalty(log_probs, ref_log_prob, self.kl_penalty)
    kl_mean_loss = F.masked_mean(kl_losses, mask)
    pg_loss = pg_mean_loss + kl_mean_loss * self.kl_ctrl.value - self.entropy_coeff * entropy_loss

    if kwargs.get("use_dynamic_bsz", False):
        policy_loss = pg_loss * (batch["responses"].size(0) / kwargs.get("actual_micro_batch_size", None))
    else:
        policy_loss = pg_loss
    MsProbe.save_data({"old_log_prob": old_log_prob, "log_prob": log_probs, "ref_log_prob": ref_log_prob,
                       "advantages": advantages, "loss": pg_loss, "kl_loss": kl_mean_loss})

    stats = {
        "actor/pg_loss": abs(pg_loss.detach().item()),
        "actor/pg_clipfrac": pg_mean_clipfrac.detach().item(),
        "actor/ppo_kl": ppo_kl.detach().item(),
        "actor/kl_loss": kl_mean_loss.detach().item(),
        "actor/entropy": entropy_loss.detach().item(),
    }
    if current is not None:  # the engine's log-probs against Megatron's on the same weights (lag-0 tokens)
        agree = mask.bool() & current & torch.isfinite(behaviour)
        if bool(agree.any()):
            stats["asp/engine_prox_absdiff_lag0"] = (behaviour - prox).abs()[agree].mean().item()
    if lags is not None:
        terms = terms.with_row_lags(lags)
    off = offpolicy_stats(terms)
    off.pop("tokens")
    stats.update({f"asp/{k}": v for k, v in off.items()})
    return policy_loss, stats


def compute_loss_wrapper(orig: Callable[..., Any]) -> Callable[..., Any]:
    """The decoupled objective while ASP's pool is active, for micro-batches that carry behaviour log-probs;
    the original otherwise.

    Gated on `asp_settings().active` and not on the column alone: the patched DataStrategy builders give the
    TransferDock a `rollout_log_prob` column in every mode, so without a config, in stock mode or under
    `objective: standard` a batch that carries it must still get the stock loss, bit for bit.
    """
    def compute_loss(self, output, batch, forward_only=False, non_loss_data=True, **kwargs):
        if forward_only or batch.get(ROLLOUT_LOG_PROB) is None or not asp_settings().active:
            return orig(self, output, batch, forward_only=forward_only, non_loss_data=non_loss_data, **kwargs)
        return decoupled_compute_loss(self, output, batch, **kwargs)
    compute_loss.__wrapped__ = orig  # type: ignore[attr-defined]
    return compute_loss


LOSS_PATCHES: List[Tuple[str, Callable[..., Any]]] = [
    ("mindspeed_rl.workers.base_worker.BaseWorker.dispatch_transfer_dock_data", dispatch_transfer_dock_data_wrapper),
    ("mindspeed_rl.models.loss.grpo_actor_loss_func.GRPOActorLossFunc.compute_loss", compute_loss_wrapper),
]
