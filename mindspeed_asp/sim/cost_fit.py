"""Least-squares fit of the decode step cost `a + b*active + c*kv + p*prefill` from measured step timings.

Why a fit: docs/design.md section 4 forbids guessing cost parameters in code; `asp fit-cost` measures a short
sweep of engine steps (active sequences, resident KV tokens, prefill tokens, seconds) and this module turns
it into a CostModel. Non-negative least squares keeps every coefficient physical (a negative KV cost would
reward long contexts). Timings are read from CSV or JSON Lines with the offending file and line named.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Union

import numpy as np

from mindspeed_asp.atomic import write_json
from mindspeed_asp.errors import InputError
from mindspeed_asp.textfile import read_text
from mindspeed_asp.jsonl import iter_jsonl_objects
from mindspeed_asp.types import CostModel

COLUMNS = ("active", "kv_tokens", "prefill_tokens", "step_time")
PathLike = Union[str, Path]


@dataclass(frozen=True)
class CostFit:
    """A fitted CostModel with its quality: r2 and rmse (seconds), number of timings and relative error."""

    cost: CostModel
    r2: float
    rmse: float
    samples: int
    mean_abs_rel_error: float

    def to_json(self) -> Dict[str, object]:
        c = self.cost
        return {"a": c.a, "b": c.b, "c": c.c, "p": c.p, "source": c.source, "r2": self.r2, "rmse": self.rmse,
                "samples": self.samples, "mean_abs_rel_error": self.mean_abs_rel_error}


def fit_cost_model(active: np.ndarray, kv_tokens: np.ndarray, step_time: np.ndarray,
                   prefill_tokens: Optional[np.ndarray] = None, source: str = "fit") -> CostFit:
    """Fit (a, b, c, p) >= 0 by non-negative least squares; p is fitted only when prefill varies."""
    from scipy.optimize import nnls

    active = np.asarray(active, dtype=np.float64)
    kv = np.asarray(kv_tokens, dtype=np.float64)
    y = np.asarray(step_time, dtype=np.float64)
    pf = np.zeros_like(y) if prefill_tokens is None else np.asarray(prefill_tokens, dtype=np.float64)
    if not (len(active) == len(kv) == len(y) == len(pf)):
        raise ValueError("active, kv_tokens, step_time and prefill_tokens must have the same length")
    if len(y) < 3:
        raise ValueError(f"need at least 3 step timings to fit a cost model, got {len(y)}")
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("step times must be finite and > 0")
    use_p = bool(np.ptp(pf) > 0)
    cols = [np.ones_like(y), active, kv] + ([pf] if use_p else [])
    X = np.stack(cols, axis=1)
    scale = np.maximum(np.abs(X).max(axis=0), 1e-30)  # condition the columns
    coef, _ = nnls(X / scale, y)
    coef = coef / scale
    pred = X @ coef
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    cost = CostModel(a=float(coef[0]), b=float(coef[1]), c=float(coef[2]), p=float(coef[3]) if use_p else 0.0,
                     source=source)
    return CostFit(cost=cost, r2=r2, rmse=float(np.sqrt(ss_res / len(y))), samples=len(y),
                   mean_abs_rel_error=float(np.mean(np.abs(pred - y) / y)))


def load_step_timings(path: PathLike) -> Dict[str, np.ndarray]:
    """Read step timings (CSV with a header, or JSON Lines) with columns active, kv_tokens, step_time and
    optional prefill_tokens."""
    path = Path(path)
    if not path.is_file():
        raise InputError("file not found", path=str(path))
    rows = []
    if path.suffix.lower() == ".csv":
        with io.StringIO(read_text(path), newline="") as fh:  # names a line that is not UTF-8
            reader = csv.DictReader(fh)
            missing = {"active", "kv_tokens", "step_time"} - set(reader.fieldnames or [])
            if missing:
                raise InputError(f"missing column(s) {', '.join(sorted(missing))}", path=str(path), line=1)
            for lineno, rec in enumerate(reader, start=2):
                rows.append((lineno, rec))
    else:
        rows.extend(iter_jsonl_objects(path))
    out = {k: np.zeros(len(rows)) for k in COLUMNS}
    for i, (lineno, rec) in enumerate(rows):
        for k in COLUMNS:
            v = rec.get(k)
            if v in (None, "") and k == "prefill_tokens":
                v = 0
            if v in (None, ""):
                raise InputError("missing value", path=str(path), line=lineno, key=k)
            try:
                out[k][i] = float(v)
            except (TypeError, ValueError):
                raise InputError(f"not a number: {v!r}", path=str(path), line=lineno, key=k) from None
            if not np.isfinite(out[k][i]) or out[k][i] < 0 or (k == "step_time" and out[k][i] <= 0):
                raise InputError(f"invalid value {v!r}", path=str(path), line=lineno, key=k)
    if not rows:
        raise InputError("no step timings in file", path=str(path))
    return out


def save_cost_json(fit: CostFit, path: PathLike) -> None:
    write_json(path, fit.to_json(), indent=2)  # temp file + rename: an old cost file survives a failed write


def load_cost_json(path: PathLike) -> CostModel:
    """A CostModel from JSON with keys a, b, c (and optional p, source), as `asp fit-cost` writes it."""
    path = Path(path)
    if not path.is_file():
        raise InputError("cost file not found", path=str(path))
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON ({exc.msg})", path=str(path), line=exc.lineno) from None
    if not isinstance(data, dict):
        raise InputError("expected a JSON object", path=str(path))
    vals = {}
    for k in ("a", "b", "c", "p"):
        if k not in data and k != "p":
            raise InputError("missing key", path=str(path), key=k)
        v = data.get(k, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):  # NaN fails too
            raise InputError(f"must be a finite number >= 0, got {v!r}", path=str(path), key=k)
        vals[k] = float(v)
    return CostModel(source=str(data.get("source", path)), **vals)
