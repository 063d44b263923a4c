"""Resolve a workload string (`--workload` / `--trace`) into prompts, history and next-epoch truth.

Forms:

- ``synthetic:prompts=512,n=8,seed=0`` with optional ``epochs=3`` (history epochs; the truth is the epoch
  after them), ``mode=reasoning|small|long_cot|chat|summarisation|tiny_decode`` (the generator's named
  regimes, workloads/synthetic.py; ``regime=small`` is the older spelling of ``mode=small``), and overrides of
  the mode's values: ``median=``, ``cap=``, ``trend=``, ``rho=``, ``sigma_between=``, ``prompt_len=`` (median
  prompt tokens), and for long_cot only ``p_correct=``, ``learn=``, ``wrong_ratio=``, ``wrong_trend=``,
  ``loop=``, ``difficulty_sd=``.
- ``alpaca:<path>`` with optional ``?target=t0.7`` (held-out column; ``target=all`` gives [G, 4] truth and
  no history) and ``?prompt_len=0``.
- ``splitwise:<path>`` with optional ``?n=8`` (requests per group).
- ``history:<path>`` (a history file or a runtime rollout log) with optional ``?epoch=E`` (the truth; default
  the latest), ``n=8``, ``dataset=<prompts.jsonl>``: back-tests on a real run, the epochs before E being the
  history.

Every trace's max_new_tokens comes from the file (the cap it declares, else its longest length;
workloads/traces.py); ``cap=`` overrides it (``alpaca:a.json?cap=4096``) and may not be below a length in the
trace.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Tuple

import numpy as np

from mindspeed_asp.errors import InputError
from mindspeed_asp.core.limits import LENGTH_BOUND_TEXT, MAX_LENGTH
from mindspeed_asp.core.memory_budget import check_fits, planning_bytes, synthesis_bytes
from mindspeed_asp.scheduler.history import LengthHistory
from mindspeed_asp.core.problem import PromptSet

_SYNTH_KEYS = {"prompts": int, "n": int, "seed": int, "epochs": int, "median": float, "cap": int,
               "trend": float, "rho": float, "sigma_between": float, "regime": str, "mode": str,
               "prompt_len": float, "p_correct": float, "learn": float, "wrong_ratio": float,
               "wrong_trend": float, "loop": float, "difficulty_sd": float}
# spec key -> SyntheticRLWorkload keyword (the keys not listed keep their name)
_SYNTH_RENAME = {"median": "median_tokens", "cap": "max_new_tokens", "prompt_len": "prompt_len_median"}
_LONG_COT_KEYS = ("p_correct", "learn", "wrong_ratio", "wrong_trend", "loop", "difficulty_sd")


@dataclass
class ResolvedWorkload:
    """A workload ready for estimation or simulation; unpacks as (prompts, history, truth)."""

    prompts: PromptSet
    history: LengthHistory
    truth: np.ndarray  # int64 [G, n]: the lengths of the epoch being planned
    max_new_tokens: int
    name: str

    def __iter__(self) -> Iterator:
        return iter((self.prompts, self.history, self.truth))


def _parse_options(text: str, spec: str, allowed: Dict[str, type]) -> Dict[str, object]:
    out: Dict[str, object] = {}
    for item in filter(None, (p.strip() for p in text.replace("&", ",").split(","))):
        if "=" not in item:
            raise InputError(f"option {item!r} must look like key=value", key=spec)
        k, v = (s.strip() for s in item.split("=", 1))
        if k not in allowed:
            raise InputError(f"unknown workload option (allowed: {', '.join(sorted(allowed))})", key=k)
        try:
            out[k] = allowed[k](v)
        except ValueError:
            raise InputError(f"bad value {v!r} for {k}", key=k) from None
        if isinstance(out[k], float) and not np.isfinite(out[k]):
            raise InputError(f"must be a finite number, got {v!r}", key=k)
    return out


def _synthetic_mode(opts: Dict[str, object]) -> str:
    """The generator mode named by `mode=` (or its alias `regime=rl|small`), removed from `opts`."""
    from mindspeed_asp.workloads.synthetic import MODES

    mode = opts.pop("mode", None)
    regime = opts.pop("regime", None)
    if mode is not None and mode not in MODES:
        raise InputError(f"unknown mode {mode!r} (modes: {', '.join(MODES)})", key="mode")
    if regime is not None:
        if regime not in ("rl", "small"):
            raise InputError("regime must be 'rl' or 'small'", key="regime")
        as_mode = "reasoning" if regime == "rl" else "small"
        if mode is not None and mode != as_mode:
            raise InputError(f"regime={regime} contradicts mode={mode}; give mode= only", key="regime")
        mode = as_mode
    return str(mode or "reasoning")


def _resolved(trace, cap: Optional[int], spec: str) -> ResolvedWorkload:
    """A loaded trace as a workload, its cap taken from the file unless `cap=` overrides it."""
    if cap is None:
        return ResolvedWorkload(trace.prompts, trace.history, trace.truth, int(trace.max_new_tokens), spec)
    longest = int(max(trace.truth.max(initial=0), trace.history.max_length()))
    if cap < 1:
        raise InputError(f"cap must be >= 1, got {cap}", key="cap")
    if cap > MAX_LENGTH:
        raise InputError(f"cap must be <= {LENGTH_BOUND_TEXT}, got {cap}", key="cap")
    if cap < longest:
        raise InputError(f"cap={cap} is below the longest length in the trace ({longest})", key="cap")
    return ResolvedWorkload(trace.prompts, trace.history, trace.truth, int(cap), spec)


def _split_path(rest: str) -> Tuple[str, str]:
    if "?" in rest:
        path, opts = rest.split("?", 1)
        return path, opts
    return rest, ""


def workload_from_spec(spec: str) -> ResolvedWorkload:
    """Resolve `synthetic:...`, `alpaca:<path>`, `splitwise:<path>` or `history:<path>` (see module doc)."""
    if ":" not in spec:
        raise InputError("workload must look like synthetic:prompts=512,n=8,seed=0 | alpaca:<path> | "
                         "splitwise:<path> | history:<path>", key=spec)
    kind, rest = spec.split(":", 1)
    kind = kind.strip().lower()
    if kind == "synthetic":
        from mindspeed_asp.workloads.synthetic import ParameterError, SyntheticRLWorkload

        opts = _parse_options(rest, spec, _SYNTH_KEYS)
        mode = _synthetic_mode(opts)
        epochs = int(opts.pop("epochs", 3))
        if epochs < 0:
            raise InputError("epochs must be >= 0", key="epochs")
        prompts, n = int(opts.pop("prompts", 512)), int(opts.pop("n", 8))
        seed = int(opts.pop("seed", 0))
        if mode != "long_cot":
            for k in _LONG_COT_KEYS:
                if k in opts:
                    raise InputError(f"applies to mode=long_cot only (mode is {mode})", key=k)
        kw = {_SYNTH_RENAME.get(k, k): v for k, v in opts.items()}
        check_fits(synthesis_bytes(prompts, n, epochs + 1) + planning_bytes(prompts, n, 0, 0),
                   f"the workload {spec!r} ({prompts} prompts x n={n}, {epochs + 1} epochs)", key="prompts/n")
        try:
            wl = SyntheticRLWorkload(prompts, n=n, epochs=epochs + 1, seed=seed, mode=mode, **kw)
        except ParameterError as exc:
            back = {v: k for k, v in _SYNTH_RENAME.items()}
            back["num_prompts"] = "prompts"
            raise InputError(str(exc), key=back.get(exc.key, exc.key)) from None
        except ValueError as exc:
            raise InputError(str(exc), key=spec) from None
        return ResolvedWorkload(wl.prompts, wl.history(epochs), wl.lengths(epochs), wl.max_new_tokens, spec)
    if kind == "alpaca":
        from mindspeed_asp.workloads.traces import load_alpaca

        path, text = _split_path(rest)
        opts = _parse_options(text, spec, {"target": str, "prompt_len": int, "cap": int})
        target = opts.get("target", "t0.7")
        if not 0 <= int(opts.get("prompt_len", 0)) <= MAX_LENGTH:
            raise InputError(f"prompt_len must be in 0 .. {LENGTH_BOUND_TEXT}, got {opts['prompt_len']}",
                             key="prompt_len")
        trace = load_alpaca(path, target=None if target == "all" else str(target),
                            prompt_len=int(opts.get("prompt_len", 0)))
        return _resolved(trace, opts.get("cap"), spec)
    if kind == "splitwise":
        from mindspeed_asp.workloads.traces import load_splitwise

        path, text = _split_path(rest)
        opts = _parse_options(text, spec, {"n": int, "cap": int})
        return _resolved(load_splitwise(path, n=int(opts.get("n", 8))), opts.get("cap"), spec)
    if kind == "history":
        from mindspeed_asp.workloads.traces import load_history_trace

        path, text = _split_path(rest)
        opts = _parse_options(text, spec, {"epoch": int, "n": int, "dataset": str, "cap": int})
        trace = load_history_trace(path, epoch=opts.get("epoch"), n=opts.get("n"), dataset=opts.get("dataset"))
        return _resolved(trace, opts.get("cap"), spec)
    raise InputError(f"unknown workload kind {kind!r} (synthetic, alpaca, splitwise, history)", key=spec)
