"""Measure vLLM step times on this machine and fit the scheduler's cost model (`asp fit-cost`).

Why: the offline pass and the simulator price a decode step as `a + b*active + c*KV (+ p*prefill)`
(docs/design.md section 4); the parameters must come from the engine users actually run, never from
guesses in code. This module drives a real in-process vLLM engine through a sweep of (batch, context),
records the wall time of every engine step with its active sequences, KV tokens and prefill tokens, and
fits the four parameters by least squares. The fit is pure numpy (`fit_step_costs`) so it is testable
without an engine.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from mindspeed_asp.types import CostModel

COST_KEYS = ("a", "b", "c", "p")


@dataclass
class StepSample:
    """One engine step: how many sequences it ran, KV tokens they held, prompt tokens it prefilled."""

    active: int
    kv_tokens: int
    prefill_tokens: int
    seconds: float
    batch: int = 0
    context: int = 0


def fit_step_costs(samples: Sequence[StepSample]) -> Dict[str, Any]:
    """Least-squares fit of seconds ~ a + b*active + c*kv + p*prefill.

    `numpy.linalg.lstsq` first; if it gives a negative coefficient (noise on a flat region, or no
    prefill rows) the fit is redone with non-negative least squares, because a negative per-token cost
    would make the simulator reward longer batches. Columns are scaled before solving so that a, b, c
    and p, which differ by orders of magnitude, are equally well conditioned.
    """
    if len(samples) < 4:
        raise ValueError(f"need at least 4 step samples to fit 4 parameters, got {len(samples)}")
    X = np.array([[1.0, s.active, s.kv_tokens, s.prefill_tokens] for s in samples], dtype=np.float64)
    y = np.array([s.seconds for s in samples], dtype=np.float64)
    scale = np.maximum(np.abs(X).max(axis=0), 1e-12)
    Xs = X / scale
    coef_s, *_ = np.linalg.lstsq(Xs, y, rcond=None)
    method = "lstsq"
    if (coef_s < 0).any():
        from scipy.optimize import nnls

        coef_s, _ = nnls(Xs, y)
        method = "nnls (lstsq gave a negative coefficient)"
    coef = coef_s / scale
    pred = X @ coef
    resid = y - pred
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
    return {
        "a": float(coef[0]), "b": float(coef[1]), "c": float(coef[2]), "p": float(coef[3]),
        "method": method,
        "residuals": {
            "rmse_s": float(np.sqrt((resid ** 2).mean())),
            "max_abs_s": float(np.abs(resid).max()),
            "mean_rel": float(np.mean(np.abs(resid) / np.maximum(y, 1e-9))),
            "r2": r2,
            "n": int(len(y)),
        },
    }


def read_cost_json(path: str) -> CostModel:
    """The simulator's CostModel from a file written by `asp fit-cost` (one reader for plan, simulate and
    runtime: `sim.cost_fit.load_cost_json`); names the file and key on bad input."""
    from mindspeed_asp.sim.cost_fit import load_cost_json

    return load_cost_json(path)


def build_engine(model_path: str, max_batch: int, max_model_len: int, max_batched_tokens: int,
                 dtype: str = "float32", gpu_memory_utilization: float = 0.05, seed: int = 0,
                 tensor_parallel_size: int = 1) -> Any:
    """An in-process vLLM engine sized so one step can prefill a whole sweep point (no chunking)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    args = EngineArgs(model=model_path, skip_tokenizer_init=True, enforce_eager=True, dtype=dtype,
                      max_model_len=max_model_len, max_num_seqs=max_batch,
                      max_num_batched_tokens=max_batched_tokens, enable_prefix_caching=False,
                      gpu_memory_utilization=gpu_memory_utilization, seed=seed,
                      tensor_parallel_size=tensor_parallel_size, disable_log_stats=True)
    return LLMEngine.from_engine_args(args)


def measure_point(engine: Any, batch: int, context: int, decode_steps: int, vocab: int,
                  rng: np.random.Generator, tag: str) -> List[StepSample]:
    """Run `batch` sequences with `context`-token prompts: one prefill step, then `decode_steps` steps."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=decode_steps + 1, ignore_eos=True, temperature=1.0, seed=0)
    for i in range(batch):
        prompt = rng.integers(2, vocab, size=context).tolist()
        engine.add_request(f"{tag}-{i}", {"prompt_token_ids": prompt}, params)
    out: List[StepSample] = []
    k = 0
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        engine.step()
        dt = time.perf_counter() - t0
        if k == 0:
            out.append(StepSample(batch, batch * context, batch * context, dt, batch, context))
        elif k <= decode_steps:
            out.append(StepSample(batch, batch * (context + k), 0, dt, batch, context))
        k += 1
    return out


def measure_and_fit(model_path: str, batches: Sequence[int], contexts: Sequence[int], decode_steps: int = 16,
                    max_model_len: Optional[int] = None, dtype: str = "float32",
                    gpu_memory_utilization: float = 0.05, warmup: int = 1, seed: int = 0,
                    progress: Optional[Callable[[int], None]] = None) -> Dict[str, Any]:
    """Sweep (batch, context) on a fresh engine, fit, and return the JSON document `asp fit-cost` writes."""
    batches = sorted(set(int(b) for b in batches))
    contexts = sorted(set(int(c) for c in contexts))
    need_len = max(contexts) + decode_steps + 2
    max_model_len = max(max_model_len or 0, need_len)
    t_start = time.perf_counter()
    engine = build_engine(model_path, max(batches), max_model_len,
                          max(max(batches) * max(contexts), 2048), dtype, gpu_memory_utilization, seed)
    startup = time.perf_counter() - t_start
    vocab = int(engine.model_config.get_vocab_size())
    rng = np.random.default_rng(seed)
    for w in range(warmup):  # first steps pay one-off allocation costs
        measure_point(engine, min(batches), min(contexts), min(decode_steps, 4), vocab, rng, f"warm{w}")
    samples: List[StepSample] = []
    for b in batches:
        for c in contexts:
            samples.extend(measure_point(engine, b, c, decode_steps, vocab, rng, f"b{b}c{c}"))
            if progress:
                progress(1)
    fit = fit_step_costs(samples)
    from mindspeed_asp.runtime.platform import current_platform

    plat = current_platform()
    return {
        "a": fit["a"], "b": fit["b"], "c": fit["c"], "p": fit["p"],
        "source": f"asp fit-cost: {Path(model_path).name} on {plat.kind}, "
                  f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
        "fit": {"method": fit["method"], "model": "seconds = a + b*active + c*kv_tokens + p*prefill_tokens"},
        "residuals": fit["residuals"],
        "engine": {"model": str(model_path), "dtype": dtype, "platform": plat.kind,
                   "max_model_len": max_model_len, "startup_seconds": startup,
                   "batches": batches, "contexts": contexts, "decode_steps": decode_steps},
        "samples": [asdict(s) for s in samples],
    }
