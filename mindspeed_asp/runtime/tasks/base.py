"""The interface every task of the standalone runtime implements (`data.task`: demo, replay, dataset).

Why one interface: the driver only needs the prompts (indexed by prompt index: gid = epoch * P + index), the
generation limits of each group, a reward per sample, the EOS id, the dataset file of the run directory and
the PromptSet a plan file must match. A task that imposes response lengths (replay) does it through
`limits()`, so the driver, the planner and the trainer stay the same for every task.

`Task` is a structural `typing.Protocol`: a task class need not inherit from it (runtime/tasks/dataset.py does
not), it has to have these members.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol, Sequence, Tuple, Union, runtime_checkable

import numpy as np

from mindspeed_asp.core.problem import PromptSet

PathLike = Union[str, Path]


@dataclass(frozen=True)
class GenerationLimits:
    """How many tokens one group generates (a group = the n samples of one prompt in one epoch).

    `max_new_tokens` caps every sample, `min_tokens` is vLLM's minimum (stop tokens and EOS are masked until
    it is reached), `ignore_eos` lets a sample run past EOS. `sample_lengths` (optional, one entry per sample)
    imposes each sample's exact length: sample i runs min_tokens = max_tokens = sample_lengths[i]. Why per
    sample: vLLM's limits are per request and a group's n samples are n requests (runtime/instance.py), and the
    spread inside a group is part of a long-tailed workload's shape; one value per group would flatten it. With
    `sample_lengths`, `max_new_tokens` and `min_tokens` must bound it (the group's cap is what the dispatcher
    and the KV bookkeeping read).
    """

    max_new_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    sample_lengths: Optional[Tuple[int, ...]] = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0 <= self.min_tokens <= self.max_new_tokens:
            raise ValueError(f"min_tokens must be in 0 .. max_new_tokens={self.max_new_tokens}, got {self.min_tokens}")
        if self.sample_lengths is not None:
            lengths = tuple(int(x) for x in self.sample_lengths)
            object.__setattr__(self, "sample_lengths", lengths)
            if not lengths:
                raise ValueError("sample_lengths must hold one length per sample, got none")
            bad = [x for x in lengths if not self.min_tokens <= x <= self.max_new_tokens or x < 1]
            if bad:
                raise ValueError(f"sample length {bad[0]} outside max(1, min_tokens={self.min_tokens}) .. "
                                 f"max_new_tokens={self.max_new_tokens}")

    @classmethod
    def exact(cls, lengths: Sequence[int]) -> "GenerationLimits":
        """Each sample generates exactly its length: min = max = the length, EOS ignored."""
        lengths = tuple(int(x) for x in lengths)
        if not lengths:
            raise ValueError("exact limits need at least one sample length")
        return cls(max_new_tokens=max(lengths), min_tokens=min(lengths), ignore_eos=True, sample_lengths=lengths)

    def request_fields(self) -> Dict[str, Any]:
        """The GroupRequest keywords (runtime/requests.py) these limits set: `GroupRequest(..., **fields)`."""
        return {"max_new_tokens": self.max_new_tokens, "min_tokens": self.min_tokens, "ignore_eos": self.ignore_eos,
                "sample_lengths": None if self.sample_lengths is None else list(self.sample_lengths)}


@runtime_checkable
class Task(Protocol):
    """What the driver asks of a task; see the module doc."""

    eos_token_id: int

    def prompts(self) -> List[Tuple[str, List[int], int]]:
        """(prompt_id, prompt token ids, the prompt's cap on new tokens) per prompt, in dataset order."""
        ...

    def limits(self, prompt_index: int, epoch: int) -> GenerationLimits:
        """The generation limits of prompt `prompt_index`'s group in `epoch`."""
        ...

    def reward(self, prompt_id: str, token_ids: Sequence[int]) -> float:
        """Reward of one response (token ids, with or without the final EOS)."""
        ...

    def to_jsonl(self, path: PathLike) -> str:
        """Write the prompts the run trains on (the run directory's dataset.jsonl); returns the path."""
        ...

    def prompt_set(self, n: int) -> PromptSet:
        """The PromptSet of the prompts, n samples each: the dataset a plan file must have been built for."""
        ...


def prompt_set_of(prompts: Sequence[Tuple[str, Sequence[int], int]], n: int, origin: str) -> PromptSet:
    """A PromptSet from `Task.prompts()` rows: ids and prompt token counts in order (what plans fingerprint)."""
    return PromptSet(prompt_ids=np.array([p[0] for p in prompts], dtype=object),
                     prompt_lens=np.array([len(p[1]) for p in prompts], dtype=np.int64), n=n, origin=origin)


def check_group(prompt_index: int, epoch: int, num_prompts: int) -> None:
    """Refuse a prompt index or epoch no group has (a driver bug would otherwise read another prompt's row)."""
    if not 0 <= int(prompt_index) < num_prompts:
        raise IndexError(f"prompt index {prompt_index} outside 0 .. {num_prompts - 1}")
    if int(epoch) < 0:
        raise IndexError(f"epoch must be >= 0, got {epoch}")
