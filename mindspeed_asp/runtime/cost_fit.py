"""Measure vLLM step times on this machine for the cost model (`asp fit-cost`).

Why: the offline pass and the simulator price a decode step as `a + b*active + c*KV (+ p*prefill)`
(docs/design.md#cost-model); the parameters must come from the engine users actually run, never from
guesses in code. This module only measures: it drives a real in-process vLLM engine through a sweep of
(batch, context) and records the wall time of every engine step with its active sequences, KV tokens and
prefill tokens. The fit, the cost file and its checks are `mindspeed_asp.cost_model`'s, shared with the
planner, the simulator and the benchmarks.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from mindspeed_asp.cost_model import fit_cost_model


@dataclass
class StepSample:
    """One engine step: how many sequences it ran, KV tokens they held, prompt tokens it prefilled."""

    active: int
    kv_tokens: int
    prefill_tokens: int
    seconds: float
    batch: int = 0
    context: int = 0


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
    """Sweep (batch, context) on a fresh engine, fit (`cost_model.fit_cost_model`), and return the JSON document
    `asp fit-cost` writes: the cost file plus the engine settings and every measured step."""
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
    from mindspeed_asp.runtime.platform import current_platform

    plat = current_platform()
    source = (f"asp fit-cost: {Path(model_path).name} on {plat.kind}, "
              f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")
    cols = np.array([[s.active, s.kv_tokens, s.prefill_tokens, s.seconds] for s in samples], dtype=np.float64)
    fit = fit_cost_model(cols[:, 0], cols[:, 1], cols[:, 3], cols[:, 2], source=source)
    return {
        **fit.to_json(),
        "engine": {"model": str(model_path), "dtype": dtype, "platform": plat.kind,
                   "max_model_len": max_model_len, "startup_seconds": startup,
                   "batches": batches, "contexts": contexts, "decode_steps": decode_steps},
        "samples": [asdict(s) for s in samples],
    }
