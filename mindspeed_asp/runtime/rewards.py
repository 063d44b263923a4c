"""Rule-based rewards: a math-answer grader (the GSM8K / MATH style RLVR reward) and the demo task's reward.

The math reward extracts the final answer the way RLVR recipes do (`\\boxed{...}` first, then the GSM8K
`#### answer` marker, then the last number in the text), normalises numbers (commas, `$`, percent signs,
trailing units, LaTeX fractions, decimals vs fractions) and compares it to the ground truth. It returns 1/0
for correctness plus a format component (was the answer marked with `\\boxed` or `####`), combined by
`math_reward` with configurable weights.

The demo task's reward scores token ids, not text; it lives here as a pure function (`demo_reward`) so the
same rule is used by `DemoTask.reward` and anything that replays samples.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Optional, Sequence, Tuple

_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_HASH_RE = re.compile(r"####\s*(.+)")


@dataclass(frozen=True)
class MathGrade:
    """The grader's verdict: the extracted answer, where it came from, correctness and format."""

    answer: Optional[str]
    source: str  # "boxed", "hash", "last_number" or "none"
    correct: bool
    formatted: bool  # the answer was explicitly marked (\boxed or ####)


def last_boxed(text: str) -> Optional[str]:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), with nested braces; None if absent/unclosed."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        # "\boxed 5" (no braces) is valid LaTeX for a single token.
        m = re.match(r"\\(?:boxed|fbox)\s+(\S+)", text[start:])
        return m.group(1) if m else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


def extract_answer(text: str) -> Tuple[Optional[str], str]:
    """(answer, source): `\\boxed{}` wins, then `#### x`, then the last number; (None, "none") if nothing."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip(), "boxed"
    hashes = _HASH_RE.findall(text)
    if hashes:
        return hashes[-1].strip(), "hash"
    numbers = _NUMBER_RE.findall(text)
    if numbers:
        return numbers[-1], "last_number"
    return None, "none"


def _strip_latex(s: str) -> str:
    s = s.strip()
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\mathrm\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}", r"(\1)/(\2)", s)
    s = re.sub(r"\\[dt]?frac(\d)(\d)", r"\1/\2", s)
    s = s.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace("\\,", "")
    s = s.replace("\\%", "%").replace("\\$", "$").replace("^\\circ", "").replace("^{\\circ}", "")
    s = s.replace("$", "").replace("\\", "")
    return s.strip()


def parse_number(s: str) -> Optional[Fraction]:
    """Exact value of a numeric answer ("1,234", "-0.5", "3/4", "(3)/(4)", "12 dollars"), else None.

    A percent sign is dropped, not divided by 100 ("50%" equals "50"), as the MATH normalisation does.
    """
    s = _strip_latex(s).rstrip(".").strip()
    s = s.replace(",", "").replace(" ", "")
    s = s.rstrip("%")
    m = re.fullmatch(r"\(?(-?\d*\.?\d+)\)?(?:/\(?(-?\d*\.?\d+)\)?)?([a-zA-Z]*)", s)
    if not m:
        return None
    try:
        value = Fraction(m.group(1))
        if m.group(2) is not None:
            den = Fraction(m.group(2))
            if den == 0:
                return None
            value /= den
    except (ValueError, ZeroDivisionError):
        return None
    return value


def normalize_answer(s: str) -> str:
    """Canonical text of an answer: exact fraction for numbers, else LaTeX-stripped lower-case text."""
    num = parse_number(s)
    if num is not None:
        return str(num)
    t = _strip_latex(s).lower().rstrip(".")
    return re.sub(r"\s+", "", t)


def answers_match(pred: str, truth: str) -> bool:
    """Equal as exact numbers when both parse as numbers, else equal as normalised text."""
    a, b = parse_number(pred), parse_number(truth)
    if a is not None and b is not None:
        return a == b
    return normalize_answer(pred) == normalize_answer(truth)


def grade_math(response: str, ground_truth: str) -> MathGrade:
    """Grade a model response against the ground-truth answer (itself may be "#### 42" or "\\boxed{42}")."""
    truth, tsrc = extract_answer(ground_truth)
    if tsrc not in ("boxed", "hash"):
        truth = ground_truth.strip()  # a bare ground truth is the answer itself, whatever it looks like
    answer, source = extract_answer(response)
    correct = answer is not None and answers_match(answer, truth)
    return MathGrade(answer=answer, source=source, correct=correct, formatted=source in ("boxed", "hash"))


def math_reward(response: str, ground_truth: str, correct_score: float = 1.0,
                format_score: float = 0.0) -> float:
    """`correct_score` if the final answer is right, else `format_score` if it was marked, else 0.

    With the defaults this is the plain 1/0 RLVR reward; set `format_score` (e.g. 0.1) to reward marking
    the answer, as verl's GSM8K scorer does.
    """
    g = grade_math(response, ground_truth)
    if g.correct:
        return float(correct_score)
    return float(format_score) if g.formatted else 0.0


# ---------------------------------------------------------------------------------------------- demo task
def demo_reward(response_token_ids: Sequence[int], target_len: int, eos_token_id: int,
                answer_tokens: Iterable[int], token_weight: float = 0.5) -> float:
    """The demo task's reward in [0, 1]: token score and stopping score (docs/trainer.md explains why).

    - token score: share of the response tokens before EOS that belong to `answer_tokens`;
    - stopping score: 0 unless the response stopped with EOS; then 1 - |len - target| / target, floored at 0,
      where len counts the tokens before EOS. A response truncated at max_new_tokens never scores here.
    Everything after the first EOS is ignored (engines may or may not return the EOS token itself).
    """
    if target_len < 1:
        raise ValueError("target_len must be >= 1")
    toks = [int(t) for t in response_token_ids]
    stopped = eos_token_id in toks
    body = toks[:toks.index(eos_token_id)] if stopped else toks
    allowed = answer_tokens if isinstance(answer_tokens, (set, frozenset, range)) else set(answer_tokens)
    token_score = (sum(1 for t in body if t in allowed) / len(body)) if body else 0.0
    stop_score = max(0.0, 1.0 - abs(len(body) - target_len) / target_len) if stopped else 0.0
    return token_weight * token_score + (1.0 - token_weight) * stop_score
