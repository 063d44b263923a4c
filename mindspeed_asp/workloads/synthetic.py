"""Seeded synthetic RL response lengths (docs/design.md section 9), for planning and simulation without data.

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

Defaults are the RL reasoning regime (median 2k tokens, cap 16k); `SyntheticRLWorkload.small(...)` is the
CPU demo regime (median 48, cap 384: tens to hundreds of tokens), same shape.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np

from mindspeed_asp.scheduler.history import LengthHistory
from mindspeed_asp.types import PromptSet


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


class SyntheticRLWorkload:
    """Seeded length generator for `num_prompts` groups of `n` samples over `epochs` epochs."""

    def __init__(self, num_prompts: int, n: int = 8, epochs: int = 4, seed: int = 0,
                 median_tokens: float = 2048.0, max_new_tokens: int = 16384, sigma_between: float = 1.0,
                 sigma_within: Sequence[float] = (0.3, 0.8), rho: float = 0.9, trend: float = 0.03,
                 prompt_len_median: float = 256.0, prompt_len_sigma: float = 0.5,
                 prompt_len_coupling: float = 0.3, sources: Optional[Sequence[str]] = None) -> None:
        if num_prompts < 1 or n < 1 or epochs < 1:
            raise ValueError("num_prompts, n and epochs must be >= 1")
        if not 0.0 <= rho < 1.0:
            raise ValueError("rho must be in [0, 1)")
        lo, hi = float(sigma_within[0]), float(sigma_within[1])
        if not 0.0 <= lo <= hi:
            raise ValueError("sigma_within must be (lo, hi) with 0 <= lo <= hi")
        self.num_prompts, self.n, self.epochs, self.seed = int(num_prompts), int(n), int(epochs), int(seed)
        self.median_tokens, self.max_new_tokens = float(median_tokens), int(max_new_tokens)
        self.sigma_between, self.sigma_within, self.rho, self.trend = sigma_between, (lo, hi), rho, trend
        G = self.num_prompts
        rng = np.random.default_rng([self.seed, 0])
        z = np.empty((self.epochs, G))
        z[0] = rng.normal(0.0, sigma_between, G)
        innov = np.sqrt(1.0 - rho ** 2) * sigma_between
        for e in range(1, self.epochs):
            z[e] = rho * z[e - 1] + innov * rng.normal(0.0, 1.0, G)
        self._z = z
        self.within_sigma = rng.uniform(lo, hi, G)
        coupled = prompt_len_coupling * z[0] / max(sigma_between, 1e-9) + \
            np.sqrt(max(1.0 - prompt_len_coupling ** 2, 0.0)) * rng.normal(0.0, 1.0, G)
        plen = np.maximum(1, np.rint(prompt_len_median * np.exp(prompt_len_sigma * coupled))).astype(np.int64)
        width = len(str(G - 1))
        ids = np.array([f"syn-{i:0{width}d}" for i in range(G)], dtype=object)
        src = None
        if sources:
            src = np.array(list(sources), dtype=object)[rng.integers(0, len(sources), G)]
        self.prompts = PromptSet(prompt_ids=ids, prompt_lens=plen, n=self.n, sources=src,
                                 origin=f"synthetic:prompts={G},n={self.n},seed={self.seed}")

    @classmethod
    def small(cls, num_prompts: int, n: int = 8, epochs: int = 4, seed: int = 0, **kw) -> "SyntheticRLWorkload":
        """The CPU demo regime: median 48 tokens, cap 384, short prompts (same shape as the default)."""
        kw.setdefault("median_tokens", 48.0)
        kw.setdefault("max_new_tokens", 384)
        kw.setdefault("prompt_len_median", 24.0)
        return cls(num_prompts, n=n, epochs=epochs, seed=seed, **kw)

    def log_median(self, epoch: int) -> np.ndarray:
        """Latent log median per prompt at `epoch` (the quantity the estimators try to recover)."""
        self._check_epoch(epoch)
        return np.log(self.median_tokens) + self.trend * epoch + self._z[epoch]

    def lengths(self, epoch: int) -> np.ndarray:
        """True response lengths of `epoch`, int64 [G, n], capped at max_new_tokens."""
        self._check_epoch(epoch)
        rng = np.random.default_rng([self.seed, 1, epoch])
        eta = rng.normal(0.0, 1.0, (self.num_prompts, self.n))
        raw = np.exp(self.log_median(epoch)[:, None] + self.within_sigma[:, None] * eta)
        return np.clip(np.rint(raw), 1, self.max_new_tokens).astype(np.int64)

    def history(self, upto_epoch: int) -> LengthHistory:
        """Length history of epochs 0 .. upto_epoch-1 (what is known when planning epoch `upto_epoch`)."""
        if not 0 <= upto_epoch <= self.epochs:
            raise ValueError(f"upto_epoch must be in [0, {self.epochs}]")
        hist = LengthHistory()
        for e in range(upto_epoch):
            hist.add_epoch(self.prompts.prompt_ids, e, self.lengths(e))
        return hist

    def describe(self, epoch: Optional[int] = None) -> Dict[str, float]:
        """Statistics of one epoch (default: the last): tail shares, max/mean, p99/median, truncation."""
        e = self.epochs - 1 if epoch is None else epoch
        L = self.lengths(e)
        out = tail_statistics(L)
        out.update({
            "epoch": float(e),
            "groups": float(self.num_prompts),
            "n": float(self.n),
            "truncated_frac": float(np.mean(L >= self.max_new_tokens)),
            "group_max_over_median": float(np.median(L.max(axis=1) / np.maximum(np.median(L, axis=1), 1.0))),
            "mean_epoch0": float(self.lengths(0).mean()),
        })
        return out

    def _check_epoch(self, epoch: int) -> None:
        if not 0 <= epoch < self.epochs:
            raise ValueError(f"epoch {epoch} outside [0, {self.epochs})")
