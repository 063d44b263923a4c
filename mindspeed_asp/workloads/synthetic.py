"""Seeded synthetic RL response lengths (docs/design.md#workloads-and-tasks), for planning and simulation without data.

Model, per prompt i, epoch e and sample s (all logs natural):

    x_i(e)   = log(median_tokens) + trend * e + z_i(e)                  latent log median
    z_i(0)   ~ N(0, sigma_between^2),  z_i(e+1) = rho * z_i(e) + sqrt(1 - rho^2) * sigma_between * eps
    s_i      ~ Uniform(sigma_within_lo, sigma_within_hi)                 within-group log spread (fixed)
    L_ise    = min(cap, max(1, round(exp(x_i(e) + s_i * eta))))          eta ~ N(0, 1)

The AR(1) term keeps the spread across prompts stationary while each prompt's median wanders, `trend` is
the global drift (RL lengths grow or shrink as the policy trains), and the cap produces the truncation spike.
Prompt lengths are lognormal, weakly correlated with the prompt's latent median (`prompt_len_coupling`), so
a cold-start estimator has a little signal. Each epoch's draws come from their own seeded stream, so
`lengths(e)` is the same whatever else was asked for first.

Named modes (`mode=`; `MODES` lists them, `mode_defaults(mode)` gives the parameters; docs/simulator.md section
"Workloads" has the measured shapes):

- ``reasoning`` (the default): median 2k tokens, cap 16k, lengths growing 3%/epoch. ``small`` is the CPU demo
  regime of the same shape (median 48, cap 384); `SyntheticRLWorkload.small(...)` is the same thing.
- ``long_cot``: long chain-of-thought RL with a verifier. Each sample is correct with the prompt's probability
  p_i(e) = sigmoid(a_i + learn * e), a_i ~ N(logit(p_correct), difficulty_sd^2) (the prompt's difficulty).
  Correct answers are lognormal around x_i(e); wrong ones around x_i(e) + log(wrong_ratio) + wrong_trend * e
  with their own, wider spread, and a wrong answer runs into a repetition loop up to the cap with probability
  `loop`: a visible spike at the cap. The policy learns, so lengths drift down (p_i rises, trend < 0, wrong
  answers shrink faster). `correct(e)` gives each sample's correctness.
- ``chat``: short answers (median ~250 tokens), moderate tail, cap 2048, no drift.
- ``summarisation``: medium answers with a tight spread (median ~480, cap 1536), long prompts (~1.4k tokens).
- ``tiny_decode``: code completion (median ~13 tokens, heavy tail to ~2k, cap 2048): the longest group's solo
  time, not the total work, bounds the rollout.

The default and ``small`` draw exactly the random numbers they always did (same seed, same lengths); every other
mode draws from streams salted with the mode, so adding a mode never changes another mode's lengths.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from mindspeed_asp.core.limits import LENGTH_BOUND_TEXT, MAX_LENGTH, MAX_SEED
from mindspeed_asp.scheduler.history import LengthHistory
from mindspeed_asp.core.problem import PromptSet

_BASE: Dict[str, object] = {
    "median_tokens": 2048.0, "max_new_tokens": 16384, "sigma_between": 1.0, "sigma_within": (0.3, 0.8),
    "rho": 0.9, "trend": 0.03, "prompt_len_median": 256.0, "prompt_len_sigma": 0.5, "prompt_len_coupling": 0.3,
}
# parameters only the long_cot mode has (None elsewhere)
_LONG_COT: Dict[str, object] = {
    "p_correct": 0.7, "difficulty_sd": 1.5, "learn": 0.25, "wrong_ratio": 3.2, "wrong_trend": -0.03,
    "sigma_wrong": (0.35, 0.6), "loop": 0.22,
}
_PRESETS: Dict[str, Dict[str, object]] = {
    "reasoning": {},
    "small": {"median_tokens": 48.0, "max_new_tokens": 384, "prompt_len_median": 24.0},
    "long_cot": {"median_tokens": 2000.0, "max_new_tokens": 16384, "sigma_between": 0.35,
                 "sigma_within": (0.25, 0.45), "trend": -0.02, "prompt_len_median": 200.0, **_LONG_COT},
    "chat": {"median_tokens": 256.0, "max_new_tokens": 2048, "sigma_between": 0.6, "sigma_within": (0.3, 0.6),
             "trend": 0.0, "prompt_len_median": 150.0, "prompt_len_sigma": 0.8},
    "summarisation": {"median_tokens": 480.0, "max_new_tokens": 1536, "sigma_between": 0.3,
                      "sigma_within": (0.08, 0.2), "trend": 0.0, "prompt_len_median": 1400.0,
                      "prompt_len_sigma": 0.25, "prompt_len_coupling": 0.5},
    "tiny_decode": {"median_tokens": 13.0, "max_new_tokens": 2048, "sigma_between": 1.0,
                    "sigma_within": (0.6, 1.0), "trend": 0.0, "prompt_len_median": 600.0,
                    "prompt_len_sigma": 0.7},
}
MODES: Tuple[str, ...] = tuple(_PRESETS)
# salt of the random streams of the modes added after the default ones (their draws never overlap)
_SALT = {"reasoning": (), "small": (), "long_cot": (101,), "chat": (102,), "summarisation": (103,),
         "tiny_decode": (104,)}


class ParameterError(ValueError):
    """A bad generator parameter; `key` names it (the spec parser maps it back to its option)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def mode_defaults(mode: str) -> Dict[str, object]:
    """Every generator parameter of `mode` (long_cot-only ones are None in other modes)."""
    if mode not in _PRESETS:
        raise ParameterError("mode", f"unknown mode {mode!r} (modes: {', '.join(MODES)})")
    out = dict(_BASE)
    out.update({k: None for k in _LONG_COT})
    out.update(_PRESETS[mode])
    return out


def tail_statistics(lengths: np.ndarray) -> Dict[str, float]:
    """Shape statistics of one epoch's lengths (any shape; flattened).

    `tail_time_share` = (max - p90) / max: the share of the rollout time spent after 90% of the requests are
    done when all requests decode together at one token per step (the Seer/DESIGN "last 10% of requests take
    30-50% of the rollout time"); `tail_token_share` = share of all tokens in the longest 10% of requests.
    """
    x = np.sort(np.asarray(lengths, dtype=np.float64).reshape(-1))
    mx = float(x[-1])
    mean = float(x.mean())
    p90 = float(np.quantile(x, 0.9))
    k = max(1, int(round(0.1 * len(x))))
    return {
        "mean": mean,
        "median": float(np.median(x)),
        "p90": p90,
        "p99": float(np.quantile(x, 0.99)),
        "max": mx,
        "max_over_mean": mx / mean if mean > 0 else float("nan"),
        "p99_over_median": float(np.quantile(x, 0.99) / max(np.median(x), 1.0)),
        "tail_time_share": (mx - p90) / mx if mx > 0 else 0.0,
        "tail_token_share": float(x[-k:].sum() / x.sum()) if x.sum() > 0 else 0.0,
    }


def _spread(value: Sequence[float], key: str) -> Tuple[float, float]:
    lo, hi = float(value[0]), float(value[1])
    if not 0.0 <= lo <= hi:
        raise ParameterError(key, f"{key} must be (lo, hi) with 0 <= lo <= hi")
    return lo, hi


class SyntheticRLWorkload:
    """Seeded length generator for `num_prompts` groups of `n` samples over `epochs` epochs.

    `mode` picks a named regime (module doc); any parameter given explicitly overrides the mode's value.
    """

    def __init__(self, num_prompts: int, n: int = 8, epochs: int = 4, seed: int = 0,
                 median_tokens: Optional[float] = None, max_new_tokens: Optional[int] = None,
                 sigma_between: Optional[float] = None, sigma_within: Optional[Sequence[float]] = None,
                 rho: Optional[float] = None, trend: Optional[float] = None,
                 prompt_len_median: Optional[float] = None, prompt_len_sigma: Optional[float] = None,
                 prompt_len_coupling: Optional[float] = None, sources: Optional[Sequence[str]] = None,
                 mode: str = "reasoning", p_correct: Optional[float] = None, difficulty_sd: Optional[float] = None,
                 learn: Optional[float] = None, wrong_ratio: Optional[float] = None,
                 wrong_trend: Optional[float] = None, sigma_wrong: Optional[Sequence[float]] = None,
                 loop: Optional[float] = None) -> None:
        given = {k: v for k, v in locals().items() if k in _BASE or k in _LONG_COT}
        p = mode_defaults(mode)
        for k, v in given.items():
            if v is None:
                continue
            if k in _LONG_COT and p[k] is None:
                raise ParameterError(k, f"{k} applies to mode long_cot only (mode is {mode!r})")
            p[k] = v
        for key, value in (("num_prompts", num_prompts), ("n", n), ("epochs", epochs)):
            if value < 1:
                raise ParameterError(key, f"{key} must be >= 1, got {value}")
        if not 0.0 <= float(p["rho"]) < 1.0:
            raise ParameterError("rho", "rho must be in [0, 1)")
        if float(p["median_tokens"]) <= 0:
            raise ParameterError("median_tokens", "median_tokens must be > 0")
        if int(p["max_new_tokens"]) < 1:
            raise ParameterError("max_new_tokens", "max_new_tokens must be >= 1")
        # token lengths: mindspeed_asp/core/limits.py
        for key in ("median_tokens", "max_new_tokens", "prompt_len_median"):
            if float(p[key]) > MAX_LENGTH:
                raise ParameterError(key, f"{key} must be <= {LENGTH_BOUND_TEXT}, got {p[key]}")
        if not 0 <= int(seed) <= MAX_SEED:
            raise ParameterError("seed", f"seed must be in 0 .. {MAX_SEED}, got {seed}")
        lo, hi = _spread(p["sigma_within"], "sigma_within")
        self.mode, self.params = mode, p
        self.num_prompts, self.n, self.epochs, self.seed = int(num_prompts), int(n), int(epochs), int(seed)
        self.median_tokens, self.max_new_tokens = float(p["median_tokens"]), int(p["max_new_tokens"])
        sigma_between, rho = float(p["sigma_between"]), float(p["rho"])
        self.sigma_between, self.sigma_within, self.rho, self.trend = sigma_between, (lo, hi), rho, float(p["trend"])
        self._salt = _SALT[mode]
        G = self.num_prompts
        rng = np.random.default_rng([self.seed, 0, *self._salt])
        z = np.empty((self.epochs, G))
        z[0] = rng.normal(0.0, sigma_between, G)
        innov = np.sqrt(1.0 - rho ** 2) * sigma_between
        for e in range(1, self.epochs):
            z[e] = rho * z[e - 1] + innov * rng.normal(0.0, 1.0, G)
        self._z = z
        self.within_sigma = rng.uniform(lo, hi, G)
        coupling = float(p["prompt_len_coupling"])
        coupled = coupling * z[0] / max(sigma_between, 1e-9) + \
            np.sqrt(max(1.0 - coupling ** 2, 0.0)) * rng.normal(0.0, 1.0, G)
        plen = np.maximum(1, np.rint(float(p["prompt_len_median"]) *
                                     np.exp(float(p["prompt_len_sigma"]) * coupled))).astype(np.int64)
        width = len(str(G - 1))
        ids = np.array([f"syn-{i:0{width}d}" for i in range(G)], dtype=object)
        src = None
        if sources:
            src = np.array(list(sources), dtype=object)[rng.integers(0, len(sources), G)]
        origin = f"synthetic:prompts={G},n={self.n},seed={self.seed}"
        self.prompts = PromptSet(prompt_ids=ids, prompt_lens=plen, n=self.n, sources=src,
                                 origin=origin if not self._salt else f"{origin},mode={mode}")
        self.difficulty: Optional[np.ndarray] = None
        self.wrong_sigma: Optional[np.ndarray] = None
        if mode == "long_cot":
            self._init_long_cot(rng)

    def _init_long_cot(self, rng: np.random.Generator) -> None:
        """Per-prompt difficulty (logit of p_correct at epoch 0) and wrong-answer spread, after the common draws."""
        p = self.params
        pc, loop = float(p["p_correct"]), float(p["loop"])
        if not 0.0 < pc < 1.0:
            raise ParameterError("p_correct", "p_correct must be in (0, 1)")
        if not 0.0 <= loop <= 1.0:
            raise ParameterError("loop", "loop must be in [0, 1]")
        if float(p["wrong_ratio"]) <= 0:
            raise ParameterError("wrong_ratio", "wrong_ratio must be > 0")
        if float(p["difficulty_sd"]) < 0:
            raise ParameterError("difficulty_sd", "difficulty_sd must be >= 0")
        wlo, whi = _spread(p["sigma_wrong"], "sigma_wrong")
        G = self.num_prompts
        self.difficulty = np.log(pc / (1.0 - pc)) + float(p["difficulty_sd"]) * rng.normal(0.0, 1.0, G)
        self.wrong_sigma = rng.uniform(wlo, whi, G)

    @classmethod
    def small(cls, num_prompts: int, n: int = 8, epochs: int = 4, seed: int = 0, **kw) -> "SyntheticRLWorkload":
        """The CPU demo regime: median 48 tokens, cap 384, short prompts (same shape as the default)."""
        kw.setdefault("median_tokens", 48.0)
        kw.setdefault("max_new_tokens", 384)
        kw.setdefault("prompt_len_median", 24.0)
        return cls(num_prompts, n=n, epochs=epochs, seed=seed, **kw)

    def log_median(self, epoch: int) -> np.ndarray:
        """Latent log median per prompt at `epoch` (the quantity the estimators try to recover).

        In long_cot mode this is the level of the prompt's correct answers; wrong ones sit log(wrong_ratio)
        (plus wrong_trend * epoch) above it.
        """
        self._check_epoch(epoch)
        return np.log(self.median_tokens) + self.trend * epoch + self._z[epoch]

    def p_correct(self, epoch: int) -> np.ndarray:
        """long_cot: each prompt's probability that a sample is correct at `epoch`, [G]."""
        self._check_epoch(epoch)
        if self.difficulty is None:
            raise ValueError(f"p_correct exists in mode long_cot only (mode is {self.mode!r})")
        return 1.0 / (1.0 + np.exp(-(self.difficulty + float(self.params["learn"]) * epoch)))

    def _draw(self, epoch: int) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        self._check_epoch(epoch)
        rng = np.random.default_rng([self.seed, 1, epoch, *self._salt])
        eta = rng.normal(0.0, 1.0, (self.num_prompts, self.n))
        if self.difficulty is None:
            raw = np.exp(self.log_median(epoch)[:, None] + self.within_sigma[:, None] * eta)
            return np.clip(np.rint(raw), 1, self.max_new_tokens).astype(np.int64), None
        p = self.params
        correct = rng.random((self.num_prompts, self.n)) < self.p_correct(epoch)[:, None]
        looped = (rng.random((self.num_prompts, self.n)) < float(p["loop"])) & ~correct
        shift = np.log(float(p["wrong_ratio"])) + float(p["wrong_trend"]) * epoch
        logs = self.log_median(epoch)[:, None] + np.where(
            correct, self.within_sigma[:, None] * eta, shift + self.wrong_sigma[:, None] * eta)
        L = np.clip(np.rint(np.exp(logs)), 1, self.max_new_tokens).astype(np.int64)
        L[looped] = self.max_new_tokens
        return L, correct

    def lengths(self, epoch: int) -> np.ndarray:
        """True response lengths of `epoch`, int64 [G, n], capped at max_new_tokens."""
        return self._draw(epoch)[0]

    def correct(self, epoch: int) -> np.ndarray:
        """long_cot: whether each sample of `epoch` is correct, bool [G, n] (aligned with `lengths(epoch)`)."""
        ok = self._draw(epoch)[1]
        if ok is None:
            raise ValueError(f"correctness exists in mode long_cot only (mode is {self.mode!r})")
        return ok

    def history(self, upto_epoch: int) -> LengthHistory:
        """Length history of epochs 0 .. upto_epoch-1 (what is known when planning epoch `upto_epoch`)."""
        if not 0 <= upto_epoch <= self.epochs:
            raise ValueError(f"upto_epoch must be in [0, {self.epochs}]")
        hist = LengthHistory()
        for e in range(upto_epoch):
            hist.add_epoch(self.prompts.prompt_ids, e, self.lengths(e))
        return hist

    def describe(self, epoch: Optional[int] = None) -> Dict[str, float]:
        """Statistics of one epoch (default: the last): tail shares, max/mean, p99/median, truncation.

        long_cot adds the share of correct samples and the median of correct and of wrong ones.
        """
        e = self.epochs - 1 if epoch is None else epoch
        L, ok = self._draw(e)
        out = tail_statistics(L)
        out.update({
            "epoch": float(e),
            "groups": float(self.num_prompts),
            "n": float(self.n),
            "truncated_frac": float(np.mean(L >= self.max_new_tokens)),
            "group_max_over_median": float(np.median(L.max(axis=1) / np.maximum(np.median(L, axis=1), 1.0))),
            "mean_epoch0": float(self.lengths(0).mean()),
        })
        if ok is not None:
            out.update({
                "correct_frac": float(ok.mean()),
                "correct_median": float(np.median(L[ok])) if ok.any() else float("nan"),
                "wrong_median": float(np.median(L[~ok])) if (~ok).any() else float("nan"),
            })
        return out

    def _check_epoch(self, epoch: int) -> None:
        if not 0 <= epoch < self.epochs:
            raise ValueError(f"epoch {epoch} outside [0, {self.epochs})")
