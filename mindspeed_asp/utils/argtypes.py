"""argparse types that refuse non-finite and out-of-range numbers at parse time, naming the option.

Python's float() accepts 'nan' and 'inf', and numpy then plans with them (a NaN trainer ratio makes a planning
pass loop forever, an infinite one stalls the simulator); int() accepts any size, and numpy overflows on it
later. Every numeric option of every command uses one of these, so the refusal is one line, before any work.
"""
from __future__ import annotations

import argparse
import math
from typing import Callable, Optional

# the bounds (counts, seeds, token lengths) and why they are what they are: mindspeed_asp/core/limits.py
from mindspeed_asp.core.limits import MAX_COUNT, MAX_LENGTH, MAX_SEED

__all__ = ["MAX_COUNT", "MAX_LENGTH", "MAX_SEED", "any_float", "bounded_int", "finite_float", "length_float",
           "length_int", "nonneg_float", "nonneg_int", "positive_float", "positive_int", "seed_int"]


def _range_text(lo: Optional[float], hi: Optional[float], lo_open: bool, hi_open: bool) -> str:
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo:g}")
    if hi is not None:
        parts.append(f"{'<' if hi_open else '<='} {hi:g}")
    return " and ".join(parts)


def finite_float(lo: Optional[float] = None, hi: Optional[float] = None, lo_open: bool = False,
                 hi_open: bool = False) -> Callable[[str], float]:
    """A float type that refuses nan/inf and values outside [lo, hi] (an end excluded with lo_/hi_open)."""
    want = "a finite number" + (f" {_range_text(lo, hi, lo_open, hi_open)}" if lo is not None or hi is not None
                                else "")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {want}, got {text!r}") from None
        if not math.isfinite(value) or (lo is not None and (value <= lo if lo_open else value < lo)) \
                or (hi is not None and (value >= hi if hi_open else value > hi)):
            raise argparse.ArgumentTypeError(f"must be {want}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def bounded_int(lo: int = 0, hi: int = MAX_COUNT) -> Callable[[str], int]:
    """An int type that refuses values outside [lo, hi]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer between {lo} and {hi}, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be an integer between {lo} and {hi}, got {text!r}")
        return value

    parse.__name__ = "integer"
    return parse


#: The common cases.
positive_int = bounded_int(1)
nonneg_int = bounded_int(0)
seed_int = bounded_int(0, MAX_SEED)
#: a token length or generation cap (1 .. MAX_LENGTH tokens)
length_int = bounded_int(1, MAX_LENGTH)
length_float = finite_float(0.0, float(MAX_LENGTH), lo_open=True)
positive_float = finite_float(0.0, lo_open=True)
nonneg_float = finite_float(0.0)
any_float = finite_float()
