"""Requests, results and engine settings exchanged between the dispatcher, the instances and the trainer.

Plain dataclasses (picklable by Ray, no torch) so the driver, the instance actors and the trainer agree
on one shape. Times are `time.time()` seconds (wall clock, comparable across processes on one host).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Hashable, List, NamedTuple, Optional, Tuple


class RequestId(NamedTuple):
    """Which group a request generates and which try it is (0 first; +1 per re-dispatch or regenerate).

    The runtime driver uses it as `group_id`, so a result names its group and attempt as typed fields; a
    tuple, so it pickles through Ray and hashes as a dict key inside the instance and the sample queue.
    """

    gid: int
    attempt: int = 0


@dataclass
class GroupRequest:
    """One prompt group: `n` samples of the same token-id prompt. `minibatch` is the plan's tag.

    `group_id` is opaque to the instance (echoed in the result): the runtime driver sends a `RequestId`,
    the MindSpeed-RL adapter the str of its int gid.

    Lengths: every sample runs at most `max_new_tokens` and at least `min_tokens` (vLLM masks EOS and stop
    tokens until then). `sample_lengths`, one per sample, imposes exact lengths instead: sample i runs
    min_tokens = max_tokens = sample_lengths[i] (the replay task, runtime/tasks/replay.py: a group's samples
    differ in length, and vLLM's limits are per request); `min_tokens` .. `max_new_tokens` must bound them.
    """

    group_id: Hashable
    prompt_id: str
    prompt_token_ids: List[int]
    n: int
    max_new_tokens: int
    temperature: float = 1.0
    seed: Optional[int] = None  # sample i uses seed + i, so a group is reproducible
    ignore_eos: bool = False
    stop_token_ids: List[int] = field(default_factory=list)
    minibatch: int = -1
    min_tokens: int = 0
    sample_lengths: Optional[List[int]] = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"group {self.group_id}: n must be >= 1")
        if self.max_new_tokens < 1:
            raise ValueError(f"group {self.group_id}: max_new_tokens must be >= 1")
        if not 0 <= self.min_tokens <= self.max_new_tokens:
            raise ValueError(f"group {self.group_id}: min_tokens must be in 0 .. max_new_tokens="
                             f"{self.max_new_tokens}, got {self.min_tokens}")
        if self.sample_lengths is not None:
            self.sample_lengths = [int(x) for x in self.sample_lengths]
            if len(self.sample_lengths) != self.n:
                raise ValueError(f"group {self.group_id}: {len(self.sample_lengths)} sample_lengths for n={self.n} "
                                 "samples")
            bad = [x for x in self.sample_lengths if x < max(1, self.min_tokens) or x > self.max_new_tokens]
            if bad:
                raise ValueError(f"group {self.group_id}: sample length {bad[0]} outside max(1, min_tokens="
                                 f"{self.min_tokens}) .. max_new_tokens={self.max_new_tokens}")
        if not self.prompt_token_ids:
            raise ValueError(f"group {self.group_id}: empty prompt")

    def sample_limits(self, i: int) -> Tuple[int, int]:
        """(min_tokens, max_tokens) of sample i: its imposed length twice, else the group's bounds."""
        if self.sample_lengths is not None:
            return self.sample_lengths[i], self.sample_lengths[i]
        return self.min_tokens, self.max_new_tokens


@dataclass
class SampleResult:
    """One generated sample: tokens, the behaviour log-prob of each, and the policy versions that made it.

    `min_version` is the oldest weight version that produced any of its tokens (what the lag audit
    uses), `max_version` the newest; they differ when a weight update landed mid-generation.
    `token_versions` holds the version of each token.
    """

    token_ids: List[int]
    logprobs: List[float]
    min_version: int
    max_version: int
    finish_reason: str
    token_versions: List[int] = field(default_factory=list)


@dataclass
class GroupResult:
    """A finished group as an instance returns it, with its timings (enqueued, admitted, finished)."""

    group_id: Hashable  # the request's group_id, unchanged
    prompt_id: str
    instance: int
    samples: List[SampleResult]
    prompt_token_ids: List[int]
    t_enqueued: float
    t_started: float
    t_finished: float
    stolen: bool = False
    minibatch: int = -1

    @property
    def min_version(self) -> int:
        return min(s.min_version for s in self.samples)

    @property
    def response_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.samples)


@dataclass
class EngineConfig:
    """How an instance builds its vLLM engine. `slots` is B (vLLM's max_num_seqs).

    `extra` goes to vLLM's EngineArgs unchanged (e.g. {"max_num_batched_tokens": 4096}); the key
    `logprobs_mode` defaults to "processed_logprobs" (log-probs of the distribution actually sampled,
    i.e. after temperature), which is what an importance ratio needs.
    """

    model_path: str
    slots: int = 64
    max_model_len: int = 2048
    dtype: str = "float32"
    gpu_memory_utilization: float = 0.05
    seed: int = 0
    enforce_eager: bool = True
    tensor_parallel_size: int = 1
    extra: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)
