"""Domain types shared by the estimators, the planners, the plan file, the simulator and the runtime.

They are plain dataclasses over numpy arrays (one row per prompt group) so a 10^5-group epoch is planned
without Python-object overhead. Nothing here imports torch or Ray.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np


@dataclass(frozen=True)
class PromptSet:
    """The epoch's prompts: one row per prompt group (each prompt is sampled `n` times).

    `prompt_ids` are strings (MindSpeed-RL carries integer indexes; they are stringified), `prompt_lens`
    are prompt token counts. `sources` optionally names the data source of each prompt (cold-start feature).
    """

    prompt_ids: np.ndarray  # dtype object (str), shape [G]
    prompt_lens: np.ndarray  # int64, shape [G]
    n: int = 8
    sources: Optional[np.ndarray] = None  # dtype object (str), shape [G]
    origin: str = ""  # file the prompts came from, for error messages and provenance

    def __post_init__(self) -> None:
        if len(self.prompt_ids) != len(self.prompt_lens):
            raise ValueError("prompt_ids and prompt_lens differ in length")
        if self.n < 1:
            raise ValueError("n (samples per prompt) must be >= 1")

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def fingerprint(self) -> str:
        """Identity of the dataset a plan was built for: ids, prompt lengths and n, in order."""
        h = hashlib.sha256()
        h.update(f"n={self.n};G={len(self)};".encode())
        h.update("\x1f".join(map(str, self.prompt_ids)).encode())
        h.update(np.asarray(self.prompt_lens, dtype=np.int64).tobytes())
        return h.hexdigest()[:16]

    def subset(self, index: np.ndarray) -> "PromptSet":
        return PromptSet(
            prompt_ids=self.prompt_ids[index],
            prompt_lens=self.prompt_lens[index],
            n=self.n,
            sources=None if self.sources is None else self.sources[index],
            origin=self.origin,
        )


@dataclass(frozen=True)
class ResidualPool:
    """Each group's observed log-length residuals around its predicted log median, grouped by row (CSR).

    Why: the planner scores plans on sampled length scenarios, and a log-normal around the median loses
    what a prompt's own history shows: bimodal lengths (right answers short, wrong ones long), a spike at
    the cap, correlated long samples. Resampling the prompt's drift-adjusted past samples keeps them.
    Group g's residuals are `resid[offsets[g]:offsets[g + 1]]` (empty for a prompt without history);
    `capped` marks samples that were truncated at max_new_tokens (their true length was at least that);
    `weight` is each sample's recency weight (the estimator's decay ** age, as for the median).
    """

    offsets: np.ndarray  # int64 [G + 1]
    resid: np.ndarray  # float64 [R]
    capped: np.ndarray  # bool [R]
    weight: np.ndarray  # float64 [R], > 0

    def __post_init__(self) -> None:
        R = len(self.resid)
        if self.offsets.ndim != 1 or len(self.offsets) < 1 or int(self.offsets[-1]) != R \
                or len(self.capped) != R or len(self.weight) != R:
            raise ValueError(f"residual pool offsets must end at len(resid)={R} = len(capped) = len(weight)")

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    def subset(self, rows: np.ndarray) -> "ResidualPool":
        """The pool of `rows` (same order)."""
        rows = np.asarray(rows, dtype=np.int64)
        counts = self.counts[rows]
        offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        idx = np.repeat(self.offsets[:-1][rows] - offsets[:-1], counts) + np.arange(int(offsets[-1]),
                                                                                    dtype=np.int64)
        return ResidualPool(offsets=offsets, resid=self.resid[idx], capped=self.capped[idx],
                            weight=self.weight[idx])

    def _group_sum(self, values: np.ndarray) -> np.ndarray:
        cum = np.concatenate(([0.0], np.cumsum(values, dtype=np.float64)))
        return cum[self.offsets[1:]] - cum[self.offsets[:-1]]

    def capped_share(self) -> np.ndarray:
        """Recency-weighted share of each group's pooled samples that were truncated (0 for an empty pool)."""
        total = self._group_sum(self.weight)
        return self._group_sum(self.weight * self.capped) / np.where(total > 0, total, 1.0)

    def draw(self, rows: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Pool indices drawn for `rows` by recency weight: u [..., len(rows), n] uniform in [0, 1)."""
        cum = np.concatenate(([0.0], np.cumsum(self.weight, dtype=np.float64)))
        lo, hi = cum[self.offsets[rows]], cum[self.offsets[rows + 1]]
        target = lo[:, None] + u * (hi - lo)[:, None]
        idx = np.searchsorted(cum, target, side="right") - 1
        return np.clip(idx, self.offsets[rows][:, None], self.offsets[rows + 1][:, None] - 1)


@dataclass(frozen=True)
class LengthEstimate:
    """Predicted response lengths per group (tokens), as the planners consume them.

    `median` is the typical sample length, `group_max` the chosen upper quantile of the max of n samples
    (a group finishes with its longest sample), `sigma` the within-group log-spread, `p_trunc` the
    probability that a sample hits max_new_tokens, `has_history` False where the cold-start fallback
    was used. `samples` optionally holds per-sample predictions [G, n] (the oracle fills the truth);
    `pool` optionally the history's residuals around each median (scenario sampling resamples them).
    """

    median: np.ndarray  # float64 [G]
    group_max: np.ndarray  # float64 [G]
    sigma: np.ndarray  # float64 [G]
    p_trunc: np.ndarray  # float64 [G]
    has_history: np.ndarray  # bool [G]
    estimator: str = ""
    params: Dict[str, float] = field(default_factory=dict)
    samples: Optional[np.ndarray] = None  # float64 [G, n]
    pool: Optional[ResidualPool] = None

    def __len__(self) -> int:
        return len(self.median)

    def subset(self, rows: np.ndarray) -> "LengthEstimate":
        """The estimate restricted to `rows` (same order), every per-group field with it."""
        return LengthEstimate(median=self.median[rows], group_max=self.group_max[rows], sigma=self.sigma[rows],
                              p_trunc=self.p_trunc[rows], has_history=self.has_history[rows],
                              estimator=self.estimator, params=dict(self.params),
                              samples=None if self.samples is None else self.samples[rows],
                              pool=None if self.pool is None else self.pool.subset(rows))

    def sample_lengths(self, n: int) -> np.ndarray:
        """Per-sample predicted lengths [G, n]: the given samples, or the median repeated."""
        if self.samples is not None:
            return self.samples
        return np.repeat(self.median[:, None], n, axis=1)


@dataclass(frozen=True)
class CostModel:
    """Decode step cost under continuous batching: a + b*active + c*KV (+ p*prefill tokens), seconds.

    `table_active`/`table_kv`/`table_time`, when set, replace the linear form by interpolation in a
    measured table (vLLM's step time is flat up to a knee, then compute bound).
    """

    a: float = 5.7e-3
    b: float = 2.0e-5
    c: float = 1.8e-7
    p: float = 0.0
    source: str = "default (Llama-2-7B/H100-like; fit your own with `asp fit-cost`)"

    def step_time(self, active: np.ndarray, kv_tokens: np.ndarray, prefill_tokens: np.ndarray = 0.0):
        return self.a + self.b * active + self.c * kv_tokens + self.p * prefill_tokens

    def sequence_work(self, length: np.ndarray, prompt_len: np.ndarray, slots: int) -> np.ndarray:
        """Cross-instance work of sequences (docs/design.md#cost-model): the a-term is the share of steps."""
        length = np.asarray(length, dtype=np.float64)
        prompt_len = np.asarray(prompt_len, dtype=np.float64)
        return (self.a * length / slots + self.b * length
                + self.c * (prompt_len * length + length * (length - 1) / 2.0) + self.p * prompt_len)

    def solo_time(self, length: np.ndarray, prompt_len: np.ndarray) -> np.ndarray:
        """Time of a sequence run alone: sum over its steps of a + b + c*(P + k)."""
        length = np.asarray(length, dtype=np.float64)
        prompt_len = np.asarray(prompt_len, dtype=np.float64)
        return (self.a + self.b) * length + self.c * (prompt_len * length + length * (length - 1) / 2.0) \
            + self.p * prompt_len


@dataclass(frozen=True)
class InstanceSpec:
    """Shape of one inference instance: B slots, KV budget in tokens (None = unbounded)."""

    slots: int = 64
    kv_budget: Optional[int] = None


@dataclass(frozen=True)
class PlanningProblem:
    """One window (iteration) of groups to place on `instances` instances.

    Indices in an `Assignment` refer to rows of `prompts`/`estimate`.
    """

    prompts: PromptSet
    estimate: LengthEstimate
    instances: int
    spec: InstanceSpec
    minibatch: int  # M, groups per trainer minibatch
    cost: CostModel
    max_new_tokens: int
    rho: float = 1.0  # trainer work / rollout time, for regime-dependent ordering
    seed: int = 0
    max_lag: int = 1  # the lag bound the plan will run under (asp.max_lag); planners score candidates with it
    work_stealing: bool = True  # whether idle instances steal not-started groups at run time


@dataclass
class Assignment:
    """A planner's answer: per instance the ordered group indices, and a minibatch tag per group.

    `minibatch[g] = -1` means untagged: the trainer takes groups in arrival order.
    `shared` means the groups are not pinned to instances: they wait in one queue in `shared_order()` and
    the instance with the fewest groups in flight takes the next (least-loaded dispatch, as the runtime's
    async mode, in the plan's order). The orders then hold that queue dealt round-robin, position by
    position, so a shared plan has the same shape (file, checks) as a pinned one.
    `isolated` lists the groups the plan isolated (dominant groups): while one of them runs, its instance
    steals nothing (`policy.may_steal`).
    """

    orders: List[np.ndarray]
    minibatch: np.ndarray
    planner: str
    params: Dict[str, float] = field(default_factory=dict)
    shared: bool = False
    isolated: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def shared_order(self) -> np.ndarray:
        """The groups in the order a shared queue hands them out (`policy.shared_queue_order`)."""
        from mindspeed_asp.core.policy import shared_queue_order

        return np.asarray(shared_queue_order([np.asarray(o).tolist() for o in self.orders]), dtype=np.int64)

    def validate(self, num_groups: int) -> None:
        """Every group placed exactly once; raises ValueError otherwise."""
        allg = np.concatenate([np.asarray(o, dtype=np.int64) for o in self.orders]) if self.orders else \
            np.zeros(0, dtype=np.int64)
        if len(allg) != num_groups or len(np.unique(allg)) != num_groups or \
                (num_groups and (allg.min() < 0 or allg.max() >= num_groups)):
            raise ValueError(f"planner {self.planner!r} did not place each of {num_groups} groups exactly once")
        iso = np.asarray(self.isolated, dtype=np.int64)
        if len(iso) and (iso.min() < 0 or iso.max() >= num_groups or len(np.unique(iso)) != len(iso)):
            raise ValueError(f"planner {self.planner!r}: isolated groups must be distinct indices in "
                             f"0..{num_groups - 1}")
