"""The `replay` task: token-id prompts for the tiny model whose response lengths are imposed by a workload.

Why: the demo task's lengths are the tiny policy's own (short, and drifting as it learns to stop), so a CPU
run never sees the long tail a real RL workload has (long chain-of-thought answers, loops to the cap). The
replay task keeps the trainer's work real (GRPO on the model's own tokens, the demo's token score as
reward) but makes every sample generate exactly the length a length source draws for it, so scheduling,
re-planning and the length history meet a real workload's shape on two cores.

Length sources (`data.replay`, exactly one):

- `kind`: a synthetic regime of workloads/synthetic.py (`long_cot`, `chat`, `summarisation`, `tiny_decode`,
  `reasoning`, `small`), `num_prompts` groups of `n` samples seeded by `data.replay.seed`. The generator's
  per-prompt latent (an AR(1) log median across epochs, a fixed within-group spread and, for long_cot, a fixed
  difficulty) persists across epochs while every epoch is a fresh draw, so last epoch's lengths predict the
  next ones the way they do on real data; its drift (long_cot learns: wrong answers and loops get rarer) is
  kept. The generator is built for `REPLAY_EPOCHS` epochs (a constant, so a longer run does not change the
  lengths of its first epochs); run epoch e replays generator epoch e mod REPLAY_EPOCHS.
- `trace`: a length file. `.parquet`/`.jsonl`/`.ndjson`: a length history or a runtime rollout log
  (scheduler/history.py); `.json`: the alpaca length trace (its four columns are one epoch of 4 samples);
  `.csv`: the Splitwise trace (groups of n consecutive requests). Run prompt i replays trace prompt
  perm[i mod G_trace] (a permutation seeded by `data.replay.seed`) for the whole run; run epoch e draws its n
  samples from that prompt's samples at trace epoch E[e mod len(E)] (its pooled samples if it lacks that
  epoch): without replacement when there are at least n (a group of exactly n is replayed as it was), else
  with replacement.

Scaling to a CPU budget: a raw length L becomes min(cap, max(1, round(L * scale))), cap = `data.max_new_tokens`,
except that a raw length at the source's cap (a truncated sample: long_cot's loops, a trace's declared cap or
else its longest length) becomes the run's cap, so the cap share stays what the source had. `scale` defaults to
cap / source cap; a scale that maps the source cap above `data.max_new_tokens` is refused, because it would cut
more samples to the cap than the source had. A smaller scale shortens the body and keeps the spike at the
cap: p99/median grows by source_cap * scale / cap.

Enforcement: `limits()` returns `GenerationLimits.exact(lengths)`: sample i of the group runs with vLLM's
min_tokens = max_tokens = its length and ignore_eos (runtime/instance.py), so EOS and stop tokens are masked
until the length is reached and every sample ends exactly there (finish reason "length"). The behaviour
log-probs are those of the masked distribution (`processed_logprobs`); the tiny model gives EOS about
1/vocab of its mass, so the importance ratio moves by that much.

Reward: the demo's token score (runtime/rewards.py `demo_reward` with token weight 1): the share of response
tokens from the answer alphabet. The stopping score would be meaningless, the length being imposed.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from mindspeed_asp.utils.atomic import atomic_open
from mindspeed_asp.errors import ConfigError, InputError
from mindspeed_asp.core.limits import MAX_LENGTH
from mindspeed_asp.runtime.rewards import demo_reward
from mindspeed_asp.runtime.tasks.base import GenerationLimits, check_group, prompt_set_of
from mindspeed_asp.runtime.tiny_model import BOS_TOKEN_ID, DEFAULT_SHAPE, EOS_TOKEN_ID, FIRST_FREE_TOKEN_ID
from mindspeed_asp.core.problem import PromptSet

PathLike = Union[str, Path]
SCHEMA = "mindspeed_asp.replay_task/1"
#: epochs the synthetic generator is built for; run epoch e replays e mod REPLAY_EPOCHS (module doc)
REPLAY_EPOCHS = 32
#: synthetic regimes a replay may name (workloads/synthetic.py MODES; tests check the two agree)
KINDS = ("long_cot", "chat", "summarisation", "tiny_decode", "reasoning", "small")
#: length files by suffix
TRACE_SUFFIXES = (".parquet", ".pq", ".jsonl", ".ndjson", ".json", ".csv")
#: epochs of draws kept in memory (the driver asks for groups of at most a few epochs at a time)
_CACHE_EPOCHS = 4


def scale_lengths(raw: np.ndarray, source_cap: int, scale: float, cap: int) -> np.ndarray:
    """Raw lengths scaled to the run: min(cap, max(1, round(L * scale))), a raw length at the source cap at `cap`."""
    raw = np.asarray(raw, dtype=np.int64)
    body = np.clip(np.rint(raw.astype(np.float64) * scale), 1, cap).astype(np.int64)
    return np.where(raw >= source_cap, cap, body)


class _SyntheticLengths:
    """Raw lengths from the synthetic generator (module doc, `kind`)."""

    def __init__(self, kind: str, num_prompts: int, n: int, seed: int) -> None:
        from mindspeed_asp.core.memory_budget import check_fits, synthesis_bytes
        from mindspeed_asp.workloads.synthetic import ParameterError, SyntheticRLWorkload

        check_fits(synthesis_bytes(num_prompts, n, 2) + 8.0 * num_prompts * REPLAY_EPOCHS,
                   f"the replay lengths ({num_prompts} prompts x n={n})", key="data.num_prompts")
        try:
            self.workload = SyntheticRLWorkload(num_prompts, n=n, epochs=REPLAY_EPOCHS, seed=seed, mode=kind)
        except ParameterError as exc:
            raise ConfigError(str(exc), key="data.replay.kind") from None
        self.cap = int(self.workload.max_new_tokens)
        self.name = f"synthetic {kind} (seed {seed})"

    def epoch(self, epoch: int) -> np.ndarray:
        return self.workload.lengths(epoch % REPLAY_EPOCHS)


class _TraceLengths:
    """Raw lengths resampled from a length file (module doc, `trace`)."""

    def __init__(self, path: PathLike, num_prompts: int, n: int, seed: int) -> None:
        self.path, self.n, self.seed, self.num_prompts = str(path), int(n), int(seed), int(num_prompts)
        p = Path(path)
        suffix = p.suffix.lower()
        if suffix not in TRACE_SUFFIXES:
            raise ConfigError(f"a length trace must end in {', '.join(TRACE_SUFFIXES)}: {self.path!r}",
                              key="data.replay.trace")
        if not p.is_file():
            raise ConfigError(f"length trace {self.path!r} not found", key="data.replay.trace")
        try:
            self.pools, self.epochs, self.cap = self._read(p, suffix)
        except ConfigError:
            raise
        except InputError as exc:  # the readers name the file, line and column; say which setting read it
            err = ConfigError(f"{exc} (the length trace of data.replay.trace)")
            err.path, err.line, err.key = exc.path, exc.line, exc.key
            raise err from None
        if not self.pools:
            raise ConfigError(f"no lengths in {self.path}", key="data.replay.trace")
        self.order = np.random.default_rng([self.seed, 3]).permutation(len(self.pools))
        self.name = f"trace {self.path} (seed {seed})"

    def _read(self, p: Path, suffix: str) -> Tuple[List[Dict[int, np.ndarray]], List[int], int]:
        from mindspeed_asp.workloads.traces import load_alpaca, load_splitwise, read_history_any, trace_cap

        if suffix == ".json":
            trace = load_alpaca(p, target=None)
            return [{0: row.copy()} for row in trace.truth], [0], int(trace.max_new_tokens)
        if suffix == ".csv":
            trace = load_splitwise(p, n=self.n)
            return [{0: row.copy()} for row in trace.truth], [0], int(trace.max_new_tokens)
        hist = read_history_any(p)
        if hist.num_samples == 0:
            raise InputError("no lengths in file", path=str(p))
        pools = hist.lengths_for(hist.prompt_ids())
        cap, _ = trace_cap(hist.max_length(), hist.declared_cap, str(p))
        return pools, hist.epochs(), int(cap)

    def epoch(self, epoch: int) -> np.ndarray:
        trace_epoch = self.epochs[epoch % len(self.epochs)]
        out = np.empty((self.num_prompts, self.n), dtype=np.int64)
        for i in range(self.num_prompts):
            pools = self.pools[int(self.order[i % len(self.pools)])]
            pool = pools.get(trace_epoch)
            if pool is None or len(pool) == 0:
                pool = np.concatenate(list(pools.values()))
            rng = np.random.default_rng([self.seed, 2, epoch, i])
            out[i] = rng.choice(pool, size=self.n, replace=len(pool) < self.n)
        return out


class ReplayTask:
    """`num_prompts` seeded token-id prompts whose groups generate lengths drawn from a length source.

    Exactly one of `kind` (a synthetic regime) and `trace` (a length file) names the source; `seed` seeds the
    lengths, `prompt_seed` the prompts (the run's `data.seed`, as for the demo task). `max_new_tokens` is the
    run's cap (`data.max_new_tokens`), `scale` the factor raw lengths are scaled by (None: cap / source cap).
    """

    def __init__(self, num_prompts: int, n: int, max_new_tokens: int, kind: Optional[str] = None,
                 trace: Optional[PathLike] = None, scale: Optional[float] = None, seed: int = 0,
                 prompt_seed: int = 0, vocab_size: int = int(DEFAULT_SHAPE["vocab_size"]),
                 prompt_len: Tuple[int, int] = (2, 12), answer_vocab: int = 32,
                 eos_token_id: int = EOS_TOKEN_ID, bos_token_id: int = BOS_TOKEN_ID) -> None:
        if num_prompts < 1 or n < 1:
            raise ValueError("num_prompts and n must be >= 1")
        if not 1 <= max_new_tokens <= MAX_LENGTH:
            raise ConfigError(f"max_new_tokens must be in 1 .. {MAX_LENGTH}, got {max_new_tokens}",
                              key="data.max_new_tokens")
        if (kind is None) == (trace is None):
            raise ConfigError("give exactly one length source: data.replay.kind (a synthetic regime) or "
                              "data.replay.trace (a length file)", key="data.replay")
        if kind is not None and kind not in KINDS:
            raise ConfigError(f"unknown kind {kind!r} (kinds: {', '.join(KINDS)})", key="data.replay.kind")
        if scale is not None and not (np.isfinite(scale) and scale > 0):
            raise ConfigError(f"scale must be a number > 0, got {scale!r}", key="data.replay.scale")
        lo, hi = prompt_len
        if not 0 <= lo <= hi:
            raise ValueError("prompt_len must be (min, max) with 0 <= min <= max")
        self.answer_lo = FIRST_FREE_TOKEN_ID
        self.answer_hi = self.answer_lo + answer_vocab  # exclusive
        if vocab_size - self.answer_hi < 8:
            raise ConfigError(f"a vocabulary of {vocab_size} is too small for {answer_vocab} answer tokens and a "
                              "band of prompt tokens", key="model.path")
        self.num_prompts, self.n, self.max_new_tokens = int(num_prompts), int(n), int(max_new_tokens)
        self.seed, self.prompt_seed, self.vocab_size = int(seed), int(prompt_seed), int(vocab_size)
        self.eos_token_id, self.bos_token_id = int(eos_token_id), int(bos_token_id)
        self.answer_tokens = range(self.answer_lo, self.answer_hi)
        self.kind, self.trace = kind, None if trace is None else str(trace)
        self.source: Any = (_SyntheticLengths(kind, self.num_prompts, self.n, self.seed) if kind is not None
                            else _TraceLengths(trace, self.num_prompts, self.n, self.seed))
        self.source_cap = int(self.source.cap)
        self.scale = float(scale) if scale is not None else self.max_new_tokens / self.source_cap
        if round(self.source_cap * self.scale) > self.max_new_tokens:
            raise ConfigError(
                f"scale {self.scale:g} maps the source's cap of {self.source_cap} tokens to "
                f"{round(self.source_cap * self.scale)}, above data.max_new_tokens={self.max_new_tokens}: the "
                "samples in between would be cut to the cap and the cap share would grow; use scale <= "
                f"{self.max_new_tokens / self.source_cap:.6g} or raise data.max_new_tokens", key="data.replay.scale")
        rng = np.random.default_rng([self.prompt_seed, 4])
        lens = rng.integers(lo, hi + 1, size=self.num_prompts)
        self._prompts: List[Tuple[str, Tuple[int, ...]]] = []
        for i in range(self.num_prompts):
            body = rng.integers(self.answer_hi, self.vocab_size, size=int(lens[i])).tolist()
            self._prompts.append((f"replay-{i:05d}", (self.bos_token_id, *(int(x) for x in body))))
        self._index = {pid: i for i, (pid, _) in enumerate(self._prompts)}
        self._cache: Dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return self.num_prompts

    # ------------------------------------------------------------------ the task interface
    def prompts(self) -> List[Tuple[str, List[int], int]]:
        """(prompt_id, prompt_token_ids, data.max_new_tokens) per prompt, in dataset order."""
        return [(pid, list(ids), self.max_new_tokens) for pid, ids in self._prompts]

    def epoch_lengths(self, epoch: int) -> np.ndarray:
        """The scaled lengths every group of `epoch` generates, int64 [num_prompts, n] (row = prompt index)."""
        if epoch < 0:
            raise IndexError(f"epoch must be >= 0, got {epoch}")
        got = self._cache.get(epoch)
        if got is None:
            got = scale_lengths(self.source.epoch(epoch), self.source_cap, self.scale, self.max_new_tokens)
            got.setflags(write=False)
            if len(self._cache) >= _CACHE_EPOCHS:
                self._cache.pop(min(self._cache))
            self._cache[epoch] = got
        return got

    def lengths(self, prompt_index: int, epoch: int) -> Tuple[int, ...]:
        """The n lengths the group of prompt `prompt_index` generates in `epoch`."""
        check_group(prompt_index, epoch, self.num_prompts)
        return tuple(int(x) for x in self.epoch_lengths(int(epoch))[int(prompt_index)])

    def limits(self, prompt_index: int, epoch: int) -> GenerationLimits:
        """Every sample exactly its drawn length: min_tokens = max_tokens = the length, EOS ignored."""
        return GenerationLimits.exact(self.lengths(prompt_index, epoch))

    def reward(self, prompt_id: str, token_ids: Sequence[int]) -> float:
        """The demo's token score in [0, 1]: the share of answer-alphabet tokens in the response."""
        if str(prompt_id) not in self._index:
            raise KeyError(f"unknown replay prompt id {prompt_id!r}")
        return demo_reward(token_ids, 1, self.eos_token_id, self.answer_tokens, token_weight=1.0)

    @property
    def origin(self) -> str:
        return f"replay task (num_prompts={self.num_prompts}, seed={self.prompt_seed}, lengths: {self.source.name})"

    def prompt_set(self, n: int) -> PromptSet:
        """The PromptSet a plan file for this task must match (ids and prompt lengths, n samples each)."""
        return prompt_set_of(self.prompts(), n, self.origin)

    def to_jsonl(self, path: PathLike) -> str:
        """Write the prompts: prompt_id, prompt_len, prompt_token_ids (what `asp plan` reads), the cap and the
        length source; the lengths themselves go to the run's rollout log as they are generated."""
        path = Path(path)
        with atomic_open(path) as fh:
            for pid, ids in self._prompts:
                fh.write(json.dumps({"prompt_id": pid, "prompt_len": len(ids), "prompt_token_ids": list(ids),
                                     "max_new_tokens": self.max_new_tokens, "source": "replay",
                                     "lengths": self.source.name, "scale": self.scale}) + "\n")
        return str(path)

    def describe(self, epochs: int = 1) -> Dict[str, Any]:
        """Shape of the lengths of epochs 0 .. epochs-1 (pooled, and the median per epoch): for logs, docs and
        the config checks (p99/median, the share at the cap)."""
        from mindspeed_asp.workloads.synthetic import tail_statistics

        mats = [self.epoch_lengths(e) for e in range(max(1, int(epochs)))]
        every = np.concatenate([m.reshape(-1) for m in mats])
        out: Dict[str, Any] = {"schema": SCHEMA, "num_prompts": self.num_prompts, "n": self.n,
                               "lengths": self.source.name, "source_cap": self.source_cap, "scale": self.scale,
                               "max_new_tokens": self.max_new_tokens, "epochs": len(mats)}
        out.update(tail_statistics(every))
        out["cap_share"] = float(np.mean(every >= self.max_new_tokens))
        out["epoch_median"] = [float(np.median(m)) for m in mats]
        out["epoch_p99_over_median"] = [tail_statistics(m)["p99_over_median"] for m in mats]
        out["epoch_cap_share"] = [float(np.mean(m >= self.max_new_tokens)) for m in mats]
        out["tokens_per_epoch"] = [int(m.sum()) for m in mats]
        return out


def model_vocab_size(model_path: Optional[str]) -> int:
    """The model's vocabulary from its config.json; the tiny model's when there is none yet (it is built later)."""
    if model_path:
        try:
            size = json.loads(Path(model_path, "config.json").read_text()).get("vocab_size")
        except (OSError, ValueError):
            size = None
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            return size
    return int(DEFAULT_SHAPE["vocab_size"])


def build_replay_task(cfg: Any, model_path: Optional[str]) -> ReplayTask:
    """The replay task of a run config (`data.task: replay`, section `data.replay`)."""
    section = cfg.data.replay
    return ReplayTask(cfg.data.num_prompts, cfg.data.n, cfg.data.max_new_tokens, kind=section.kind,
                      trace=section.trace, scale=section.scale, seed=section.seed, prompt_seed=cfg.data.seed,
                      vocab_size=model_vocab_size(model_path))
