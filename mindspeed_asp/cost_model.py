"""The decode-step cost model's one home: the fit rule, the cost file and the config section.

Why one module: the planner, the simulator, the runtime's re-planner, `asp fit-cost` and the benchmarks must
price a step with the same numbers, fitted by the same rule and read with the same checks
(docs/design.md#cost-model). `CostModel` itself is a domain type (`mindspeed_asp.core.problem`); this module makes
and stores one. Measuring a real engine is elsewhere (`runtime/cost_fit.py`): it needs vLLM, this needs numpy
and scipy only.

The fit: `seconds = a + b*active + c*kv_tokens + p*prefill_tokens` by non-negative least squares on
column-scaled data. Non-negative because a negative per-token cost would make the planner prefer longer
batches; scaled because a, b, c and p differ by orders of magnitude. Where the unconstrained least-squares
answer is non-negative, NNLS returns exactly it. `p` is fitted only when the prefill tokens vary.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional, Tuple, Union

import numpy as np

from mindspeed_asp.utils.atomic import write_json
from mindspeed_asp.errors import InputError
from mindspeed_asp.core.limits import short_repr
from mindspeed_asp.utils.jsonl import iter_jsonl_objects, loads
from mindspeed_asp.utils.textfile import read_text
from mindspeed_asp.core.problem import CostModel

if TYPE_CHECKING:
    from mindspeed_asp.config import CostSection

PathLike = Union[str, Path]
FORMULA = "seconds = a + b*active + c*kv_tokens + p*prefill_tokens"
COEFFICIENTS = ("a", "b", "c", "p")
TIMING_COLUMNS = ("active", "kv_tokens", "prefill_tokens", "step_time")


@dataclass(frozen=True)
class CostFit:
    """A fitted CostModel and how well it explains the timings it came from (seconds; `mean_rel` relative)."""

    cost: CostModel
    r2: float
    rmse_s: float
    max_abs_s: float
    mean_rel: float
    samples: int
    method: str = "nnls"
    #: coefficients the timings cannot determine, each with why (the fit then puts their cost elsewhere)
    unidentified: Tuple[str, ...] = ()

    def to_json(self) -> Dict[str, object]:
        """The cost-file document: a, b, c, p and source (what `load_cost_json` reads), the fit and residuals."""
        c = self.cost
        return {"a": c.a, "b": c.b, "c": c.c, "p": c.p, "source": c.source,
                "fit": {"method": self.method, "model": FORMULA},
                "residuals": {"rmse_s": self.rmse_s, "max_abs_s": self.max_abs_s, "mean_rel": self.mean_rel,
                              "r2": self.r2, "n": self.samples},
                "unidentified": list(self.unidentified)}


def fit_cost_model(active: np.ndarray, kv_tokens: np.ndarray, step_time: np.ndarray,
                   prefill_tokens: Optional[np.ndarray] = None, source: str = "fit") -> CostFit:
    """Fit (a, b, c, p) >= 0 to step timings; ValueError on too few or invalid timings."""
    from scipy.optimize import nnls

    y = np.asarray(step_time, dtype=np.float64)
    active = np.asarray(active, dtype=np.float64)
    kv = np.asarray(kv_tokens, dtype=np.float64)
    pf = np.zeros_like(y) if prefill_tokens is None else np.asarray(prefill_tokens, dtype=np.float64)
    if not (len(active) == len(kv) == len(y) == len(pf)):
        raise ValueError("active, kv_tokens, step_time and prefill_tokens must have the same length")
    use_p = bool(len(pf) and np.ptp(pf) > 0)
    cols = [np.ones_like(y), active, kv] + ([pf] if use_p else [])
    if len(y) < len(cols):
        raise ValueError(f"need at least {len(cols)} step timings to fit {len(cols)} parameters, got {len(y)}")
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("step times must be finite and > 0")
    X = np.stack(cols, axis=1)
    scale = np.maximum(np.abs(X).max(axis=0), 1e-30)  # condition the columns
    coef, _ = nnls(X / scale, y)
    coef = coef / scale
    resid = y - X @ coef
    ss_res = float(np.sum(resid ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    cost = CostModel(a=float(coef[0]), b=float(coef[1]), c=float(coef[2]), p=float(coef[3]) if use_p else 0.0,
                     source=source)
    return CostFit(cost=cost, r2=1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
                   rmse_s=float(np.sqrt(ss_res / len(y))), max_abs_s=float(np.abs(resid).max()),
                   mean_rel=float(np.mean(np.abs(resid) / y)), samples=len(y),
                   unidentified=_unidentified(active, kv, X / scale))


def _unidentified(active: np.ndarray, kv: np.ndarray, X: np.ndarray) -> Tuple[str, ...]:
    """Which of b, c the timings cannot pin down, and why. Why: timings at one batch size (or one context)
    still fit well, but the coefficient of the column that never moved is arbitrary, and a plan priced with it
    at other batch sizes is wrong; the user should hear which sweep to widen."""
    out = []
    if np.ptp(active) == 0:
        out.append(f"b: every timing has active = {active[0]:g} (time more batch sizes)")
    if np.ptp(kv) == 0:
        out.append(f"c: every timing has kv_tokens = {kv[0]:g} (time more contexts)")
    if not out and np.linalg.matrix_rank(X) < X.shape[1]:
        out.append("b, c: kv_tokens moves in step with active (time several contexts at each batch size)")
    return tuple(out)


def load_step_timings(path: PathLike) -> Dict[str, np.ndarray]:
    """Step timings from CSV (with a header) or JSON Lines: columns active, kv_tokens, step_time and optional
    prefill_tokens; a bad value is refused with its file, line and column."""
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
            rows.extend(enumerate(reader, start=2))
    else:
        rows.extend(iter_jsonl_objects(path))
    if not rows:
        raise InputError("no step timings in file", path=str(path))
    out = {k: np.zeros(len(rows)) for k in TIMING_COLUMNS}
    for i, (lineno, rec) in enumerate(rows):
        for k in TIMING_COLUMNS:
            v = rec.get(k)
            if v in (None, "") and k == "prefill_tokens":
                v = 0
            if v in (None, ""):
                raise InputError("missing value", path=str(path), line=lineno, key=k)
            try:
                if isinstance(v, bool):  # JSON true is not a count or a time
                    raise TypeError
                out[k][i] = float(v)
            except (TypeError, ValueError, OverflowError):  # OverflowError: an integer beyond float's range
                raise InputError(f"not a number: {short_repr(v)}", path=str(path), line=lineno, key=k) from None
            if not np.isfinite(out[k][i]) or out[k][i] < 0 or (k == "step_time" and out[k][i] <= 0):
                raise InputError(f"invalid value {v!r}", path=str(path), line=lineno, key=k)
    return out


def fit_timings_file(path: PathLike) -> CostFit:
    """Fit the step timings of one file (see `load_step_timings`); too few timings name the file."""
    t = load_step_timings(path)
    try:
        return fit_cost_model(t["active"], t["kv_tokens"], t["step_time"], t["prefill_tokens"],
                              source=f"fitted from {path}")
    except ValueError as exc:
        raise InputError(str(exc), path=str(path)) from None


def save_cost_json(fit: CostFit, path: PathLike, key: Optional[str] = None) -> Path:
    """Write the cost file atomically (temp file + rename: an old cost file survives a failed write)."""
    return write_json(path, fit.to_json(), key=key, indent=2)


def load_cost_json(path: PathLike, key: Optional[str] = None) -> CostModel:
    """A CostModel from a cost file (keys a, b, c, optional p and source), as `asp fit-cost` writes it.

    Every coefficient must be a finite number >= 0 and every key given once (json alone keeps the last of two
    `"a"`s silently); errors name the file, line and key (`key` names the flag or config key that gave the path
    when the file itself is missing)."""
    path = Path(path)
    if not path.is_file():
        raise InputError("cost file not found", path=str(path), key=key)
    data = loads(read_text(path), path)  # invalid JSON or a key given twice: named with its line
    if not isinstance(data, dict):
        raise InputError("expected a JSON object", path=str(path))
    vals = {}
    for k in COEFFICIENTS:
        if k not in data and k != "p":
            raise InputError("missing key", path=str(path), key=k)
        v = data.get(k, 0.0)
        # NaN and inf fail the comparison, and so does an integer beyond float's range (10**400)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1e308:
            raise InputError(f"must be a finite number >= 0, got {short_repr(v)}", path=str(path), key=k)
        vals[k] = float(v)
    return CostModel(source=str(data.get("source", path)), **vals)


def cost_from_section(section: "CostSection", origin: str = "asp.cost section") -> CostModel:
    """The cost model of an `asp.cost` config section: its fitted file wins over the inline numbers."""
    if section.file:
        return load_cost_json(section.file, key="asp.cost.file")
    return CostModel(a=section.a, b=section.b, c=section.c, p=section.p, source=origin)
