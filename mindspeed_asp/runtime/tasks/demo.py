"""The CPU demo task: "answer with answer-tokens, and stop after about L of them" (docs/design.md#workloads-and-tasks).

Why this task. It has to be learnable by a tiny random-initialised model (vocab 512) within a few dozen GRPO
steps on CPU, and its response lengths have to vary per prompt with a long tail *and* move as the policy
learns, so the length history and re-planning matter. Each prompt carries a target length L drawn from a
lognormal (median `median_target`, sigma `sigma`: a long tail, max/median about 4-8), encoded as one
"length token" right after BOS, followed by a few filler tokens (so prompt lengths vary too). The reward
(`rewards.demo_reward`) has two parts:

- a token score, the share of response tokens from a fixed answer alphabet (`answer_vocab` ids): a dense,
  easy signal (shift the output distribution), so the mean reward rises within a few steps;
- a stopping score, 1 - |len - L| / L if the response ended with EOS, else 0: it pulls each prompt's length
  toward its own L, which the model can learn as a prompt-conditioned stop rate.

A random policy almost never emits EOS (about 1/vocab per token), so at first every response runs to its
prompt's `max_new_tokens` = min(cap, 2 L + 8): lengths are long-tailed across prompts from step 0 because the
caps are. As training proceeds the policy learns to stop, lengths shrink toward (a noisy version of) L and
spread within each group: exactly the drift an offline plan built from last epoch's lengths has to track.

Token ids (no tokenizer; vLLM runs with token-id prompts): 0 = BOS, 1 = EOS (the tiny model's reserved ids),
then the answer alphabet, the filler band, and the length tokens at the top of the vocabulary.

The task interface (runtime/tasks/base.py): every group of a prompt, in every epoch, generates up to the
prompt's cap and stops at EOS (`limits`); the lengths are the policy's own.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple, Union

import numpy as np

from mindspeed_asp.utils.atomic import atomic_open
from mindspeed_asp.runtime.rewards import demo_reward
from mindspeed_asp.runtime.tasks.base import GenerationLimits, check_group, prompt_set_of
from mindspeed_asp.runtime.tiny_model import BOS_TOKEN_ID, EOS_TOKEN_ID, FIRST_FREE_TOKEN_ID
from mindspeed_asp.core.problem import PromptSet

SCHEMA = "mindspeed_asp.demo_task/1"


@dataclass(frozen=True)
class DemoPrompt:
    prompt_id: str
    prompt_token_ids: Tuple[int, ...]
    max_new_tokens: int
    target_len: int


class DemoTask:
    """A seeded set of `num_prompts` demo prompts with their rule-based reward.

    `max_new_tokens` is the global cap (the run config's `data.max_new_tokens`); each prompt's own cap is
    min(max_new_tokens, 2 * target + 8) and targets are clipped to [min_target, (max_new_tokens - 8) // 2].
    """

    def __init__(self, num_prompts: int, seed: int = 0, vocab_size: int = 512, max_new_tokens: int = 128,
                 median_target: float = 16.0, sigma: float = 0.8, min_target: int = 2,
                 filler_len: Tuple[int, int] = (2, 12), answer_vocab: int = 32, token_weight: float = 0.5,
                 eos_token_id: int = EOS_TOKEN_ID, bos_token_id: int = BOS_TOKEN_ID) -> None:
        if num_prompts < 1:
            raise ValueError("num_prompts must be >= 1")
        max_target = (max_new_tokens - 8) // 2
        if max_target < min_target:
            raise ValueError(f"max_new_tokens={max_new_tokens} is too small: need at least {2 * min_target + 8}")
        if not (0.0 <= token_weight <= 1.0):
            raise ValueError("token_weight must be in [0, 1]")
        lo, hi = filler_len
        if not (0 <= lo <= hi):
            raise ValueError("filler_len must be (min, max) with 0 <= min <= max")
        self.num_len_tokens = max_target - min_target + 1
        self.answer_lo = FIRST_FREE_TOKEN_ID
        self.answer_hi = self.answer_lo + answer_vocab  # exclusive
        self.len_base = vocab_size - self.num_len_tokens
        if self.len_base - self.answer_hi < 8:
            raise ValueError(f"vocab_size={vocab_size} too small for {answer_vocab} answer tokens and "
                             f"{self.num_len_tokens} length tokens (lower max_new_tokens or answer_vocab)")
        self.num_prompts, self.seed, self.vocab_size = num_prompts, seed, vocab_size
        self.max_new_tokens, self.min_target, self.max_target = max_new_tokens, min_target, max_target
        self.median_target, self.sigma, self.token_weight = median_target, sigma, token_weight
        self.eos_token_id, self.bos_token_id = eos_token_id, bos_token_id
        self.answer_tokens = range(self.answer_lo, self.answer_hi)
        rng = np.random.default_rng(seed)
        targets = np.exp(rng.normal(math.log(median_target), sigma, size=num_prompts))
        targets = np.clip(np.rint(targets), min_target, max_target).astype(int)
        fillers = rng.integers(lo, hi + 1, size=num_prompts)
        self._prompts: List[DemoPrompt] = []
        for i in range(num_prompts):
            t = int(targets[i])
            body = rng.integers(self.answer_hi, self.len_base, size=int(fillers[i])).tolist()
            ids = (bos_token_id, self.len_base + t - min_target, *body)
            self._prompts.append(DemoPrompt(f"demo-{i:05d}", tuple(int(x) for x in ids),
                                            min(max_new_tokens, 2 * t + 8), t))
        self._by_id: Dict[str, DemoPrompt] = {p.prompt_id: p for p in self._prompts}

    def __len__(self) -> int:
        return self.num_prompts

    def prompts(self) -> List[Tuple[str, List[int], int]]:
        """(prompt_id, prompt_token_ids, max_new_tokens) per prompt, in dataset order."""
        return [(p.prompt_id, list(p.prompt_token_ids), p.max_new_tokens) for p in self._prompts]

    def limits(self, prompt_index: int, epoch: int) -> GenerationLimits:
        """The prompt's cap, stopping at EOS, in every epoch (the policy decides the length)."""
        check_group(prompt_index, epoch, self.num_prompts)
        return GenerationLimits(max_new_tokens=self._prompts[prompt_index].max_new_tokens)

    @property
    def origin(self) -> str:
        return f"demo task (num_prompts={self.num_prompts}, seed={self.seed})"

    def prompt_set(self, n: int) -> PromptSet:
        """The PromptSet a plan file for this task must match (ids and prompt lengths, n samples each)."""
        return prompt_set_of(self.prompts(), n, self.origin)

    def prompt(self, prompt_id: str) -> DemoPrompt:
        try:
            return self._by_id[str(prompt_id)]
        except KeyError:
            raise KeyError(f"unknown demo prompt id {prompt_id!r}") from None

    def target_len(self, prompt_id: str) -> int:
        return self.prompt(prompt_id).target_len

    def reward(self, prompt_id: str, response_token_ids: Sequence[int]) -> float:
        """Reward in [0, 1] of one response (token ids, with or without the final EOS)."""
        return demo_reward(response_token_ids, self.prompt(prompt_id).target_len, self.eos_token_id,
                           self.answer_tokens, self.token_weight)

    def optimal_response(self, prompt_id: str) -> List[int]:
        """A response with reward 1 (target answer tokens then EOS): documents and tests the reward's top."""
        t = self.prompt(prompt_id).target_len
        return [self.answer_lo + (k % (self.answer_hi - self.answer_lo)) for k in range(t)] + [self.eos_token_id]

    def to_jsonl(self, path: Union[str, Path]) -> str:
        """Write the dataset, one JSON object per prompt: prompt_id, prompt_len, prompt_token_ids (what
        `asp plan` reads), plus max_new_tokens, target_len and source for humans and the demo driver."""
        path = Path(path)
        with atomic_open(path) as fh:
            for p in self._prompts:
                fh.write(json.dumps({"prompt_id": p.prompt_id, "prompt_len": len(p.prompt_token_ids),
                                     "prompt_token_ids": list(p.prompt_token_ids),
                                     "max_new_tokens": p.max_new_tokens, "target_len": p.target_len,
                                     "source": "demo"}) + "\n")
        return str(path)

    def describe(self) -> Dict[str, object]:
        """Summary of the task's length distribution, for logs and docs."""
        t = np.array([p.target_len for p in self._prompts])
        caps = np.array([p.max_new_tokens for p in self._prompts])
        return {"schema": SCHEMA, "num_prompts": self.num_prompts, "seed": self.seed,
                "target_median": float(np.median(t)), "target_max": int(t.max()),
                "target_max_over_mean": float(t.max() / t.mean()), "max_new_tokens_max": int(caps.max()),
                "eos_token_id": self.eos_token_id, "answer_tokens": [self.answer_lo, self.answer_hi]}
