"""A time model of the trainer: seconds per minibatch, and the alpha that makes a workload hit a chosen rho.

Only time: which groups a minibatch holds and when it may start are the policy's (mindspeed_asp/core/policy.py,
applied by sim/pipeline.py).

Why tokens: a GRPO/PPO update's forward+backward cost grows with the tokens it processes (prompt and
response), so a minibatch of M groups takes `alpha * tokens + overhead` seconds. rho, the ratio of trainer
work to rollout time, decides which dispatch order is best (docs/design.md#arrival-smoothing), so benchmarks
set alpha from rho instead of guessing it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass(frozen=True)
class TrainerModel:
    """Streaming trainer: minibatch of `minibatch` groups takes `alpha * tokens + overhead` seconds.

    `micro_batch` (samples per micro-batch, None = the whole rank share) and `dp` (data-parallel ranks) are
    used only for the training padding metrics; they do not change the time model.
    """

    alpha: float
    overhead: float
    minibatch: int
    micro_batch: Optional[int] = None
    dp: int = 1

    def __post_init__(self) -> None:
        if self.alpha < 0 or self.overhead < 0:
            raise ValueError("TrainerModel.alpha and overhead must be >= 0")
        if self.minibatch < 1:
            raise ValueError("TrainerModel.minibatch must be >= 1 group")
        if self.dp < 1 or (self.micro_batch is not None and self.micro_batch < 1):
            raise ValueError("TrainerModel.dp and micro_batch must be >= 1")

    def train_time(self, tokens: float) -> float:
        """Seconds for one minibatch update over `tokens` prompt+response tokens."""
        return self.alpha * float(tokens) + self.overhead

    def num_minibatches(self, groups: int) -> int:
        return -(-int(groups) // self.minibatch)


def group_tokens(lengths: np.ndarray, prompt_lens: np.ndarray) -> np.ndarray:
    """Tokens a group contributes to training: n prompts plus all n responses, [G]."""
    lengths = np.asarray(lengths, dtype=np.float64)
    return lengths.sum(axis=1) + lengths.shape[1] * np.asarray(prompt_lens, dtype=np.float64)


def alpha_for_rho(rho: float, total_tokens: float, reference_time: float, num_minibatches: int,
                  overhead: float = 0.0) -> float:
    """alpha such that the total train time `alpha * total_tokens + K * overhead` equals rho * reference_time.

    The reference is a rollout makespan of the workload, by convention its lower bound R_LB (so rho does not
    depend on the planner being measured). Raises when the overheads alone already exceed the target.
    """
    if rho < 0 or reference_time <= 0 or total_tokens <= 0:
        raise ValueError("rho must be >= 0, reference_time and total_tokens > 0")
    budget = rho * reference_time - num_minibatches * overhead
    if budget < 0:
        raise ValueError(f"overhead {overhead} s x {num_minibatches} minibatches exceeds rho * reference "
                         f"({rho} x {reference_time:.3g} s)")
    return budget / float(total_tokens)


def trainer_for_rho(rho: float, lengths: np.ndarray, prompt_lens: np.ndarray, reference_time: float,
                    minibatch: int, overhead: float = 0.0, **kw) -> TrainerModel:
    """A TrainerModel whose total work over this window is rho * reference_time."""
    tok = float(group_tokens(lengths, prompt_lens).sum())
    k = -(-len(prompt_lens) // minibatch)
    return TrainerModel(alpha=alpha_for_rho(rho, tok, reference_time, k, overhead), overhead=overhead,
                        minibatch=minibatch, **kw)
