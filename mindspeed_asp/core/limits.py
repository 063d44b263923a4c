"""The ranges every number read from a file or the command line must lie in, and the checks that name the culprit.

Why one module: a count, a seed or a token length is read in many places (argparse types, config sections,
length histories, traces, datasets, plan files), and each reader must refuse the same values with the same
words, where the value is read, before numpy overflows on it or a far consumer (vLLM, the simulator) fails
with a message that names nothing.
"""
from __future__ import annotations

from typing import Any, Optional

from mindspeed_asp.errors import InputError

#: Upper bound for counts (instances, slots, prompts, tokens, ...): int32, what the planners' arrays hold.
MAX_COUNT = 2**31 - 1
#: Upper bound for seeds: 2**32 - 1. The tightest consumer sets it: vLLM seeds numpy's global generator with the
#: engine seed (`np.random.seed`, which takes 0 .. 2**32 - 1); torch takes up to 2**64 - 1 and numpy's
#: `default_rng` any non-negative integer.
MAX_SEED = 2**32 - 1
#: Upper bound for a token length (a response length, a prompt length, a generation cap): 10^7 tokens. Why:
#: ten times the longest context of any current model (about 10^6 tokens), so no real length is refused,
#: while sums over 10^5 groups x n samples of such lengths stay far inside int64 and float64's exact range.
MAX_LENGTH = 10**7
LENGTH_BOUND_TEXT = f"{MAX_LENGTH:,} tokens"
#: Upper bound for a timeout in seconds (run.*_timeout_s, asp.*_timeout_s): 7 days. Why: no engine start, step,
#: stall or weight sync of a real run waits that long, so a larger value is a slip (milliseconds written as
#: seconds, a stray digit) that would leave a hung run waiting for weeks; and Python's own waits refuse more than
#: threading.TIMEOUT_MAX with an OverflowError that names no key.
MAX_TIMEOUT_S = 7 * 24 * 3600


def length_value(value: Any, *, path: Optional[str] = None, line: Optional[int] = None, key: Optional[str] = None,
                 lo: int = 1, what: str = "length", integral_floats: bool = False) -> int:
    """`value` as a token length in lo .. MAX_LENGTH (an integer; a boolean is refused), or an InputError
    naming the file, line and key. `integral_floats` also takes 12.0 (CSV and JSON traces write floats)."""
    ok_type = isinstance(value, int) or (integral_floats and isinstance(value, float))
    if isinstance(value, bool) or not ok_type or (isinstance(value, float) and not value.is_integer()):
        raise InputError(f"{what} must be an integer, got {value!r}", path=path, line=line, key=key)
    if not lo <= value <= MAX_LENGTH:
        raise InputError(length_range_message(value, lo, what), path=path, line=line, key=key)
    return int(value)


def length_range_message(value: Any, lo: int = 1, what: str = "length") -> str:
    """Why a length outside lo .. MAX_LENGTH is refused, in the words every reader uses."""
    bound = f"a {what} is {lo} .. {LENGTH_BOUND_TEXT}" + (" (a response has at least one token)" if lo == 1 else "")
    if value < 0:
        return f"negative {what} {short_repr(value)} ({bound})"
    return f"{what} {short_repr(value)} is out of range: {bound}"


def short_repr(value: Any) -> str:
    """A value as a message shows it: a number of more than 24 digits is shortened to its first 12."""
    text = str(int(value)) if isinstance(value, float) and value.is_integer() else repr(value)
    return text if len(text) <= 24 else f"{text[:12]}...({len(text)} characters)"
