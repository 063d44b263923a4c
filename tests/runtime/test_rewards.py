"""Rule-based rewards: math answer extraction, normalisation and grading; the demo task's token reward."""
import pytest

from mindspeed_asp.runtime.rewards import (answers_match, demo_reward, extract_answer, grade_math, last_boxed,
                                           math_reward, parse_number)


@pytest.mark.parametrize("text,answer,source", [
    ("so \\boxed{42}.", "42", "boxed"),
    ("first \\boxed{1} then \\boxed{\\frac{3}{4}}", "\\frac{3}{4}", "boxed"),
    ("nested \\boxed{\\sqrt{\\frac{1}{2}}} ok", "\\sqrt{\\frac{1}{2}}", "boxed"),
    ("Natalia sold 48 clips.\n#### 72", "72", "hash"),
    ("She has 3 apples and buys 4, so 7 in total.", "7", "last_number"),
    ("The value is -0.25", "-0.25", "last_number"),
    ("no digits here", None, "none"),
    ("unclosed \\boxed{12", "12", "last_number"),
])
def test_extract_answer(text, answer, source):
    assert extract_answer(text) == (answer, source)


def test_boxed_without_braces():
    assert last_boxed("\\boxed 5") == "5"
    assert last_boxed("nothing") is None


@pytest.mark.parametrize("a,b", [
    ("1,234", "1234"), ("0.5", "1/2"), ("\\frac{1}{2}", "0.5"), ("\\dfrac12", "1/2"), ("$12.00", "12"),
    ("50\\%", "50"), ("12 dollars", "12"), ("-3", "-3.0"), ("x^2 + 1", "x^2+1"), ("\\text{Paris}", "paris"),
])
def test_equivalent_answers(a, b):
    assert answers_match(a, b)


@pytest.mark.parametrize("a,b", [("0.5", "0.55"), ("12", "-12"), ("1/3", "0.33"), ("x+1", "x-1"), ("2", "")])
def test_different_answers(a, b):
    assert not answers_match(a, b)


def test_parse_number_refuses_non_numbers_and_zero_denominators():
    assert parse_number("1/0") is None
    assert parse_number("abc") is None
    assert parse_number("3/4") == pytest.approx(0.75)


def test_grade_and_reward_with_format_component():
    g = grade_math("Adding up gives \\boxed{18}.", "#### 18")
    assert g.correct and g.formatted and g.source == "boxed"
    assert math_reward("Adding up gives \\boxed{18}.", "#### 18") == 1.0
    # Right number but unmarked: correct (the last number), not formatted.
    g = grade_math("The total is 18", "18")
    assert g.correct and not g.formatted
    # Wrong but marked answer: only the format component.
    assert math_reward("\\boxed{17}", "18", format_score=0.1) == 0.1
    assert math_reward("\\boxed{17}", "18") == 0.0
    assert math_reward("I don't know", "18", format_score=0.1) == 0.0
    # The ground truth may itself be a boxed expression or a GSM8K solution.
    assert math_reward("#### 0.75", "so \\boxed{\\frac{3}{4}}") == 1.0
    assert math_reward("\\boxed{5}", "Step 1 gives 3.\n#### 5") == 1.0


def test_demo_reward_token_and_stop_components():
    answer = range(2, 34)
    eos = 1
    assert demo_reward([2, 3, 4, 5, eos], 4, eos, answer) == pytest.approx(1.0)
    # Same tokens, no EOS (truncated): only the token half.
    assert demo_reward([2, 3, 4, 5], 4, eos, answer) == pytest.approx(0.5)
    # Half the tokens outside the alphabet, stopped at the target.
    assert demo_reward([2, 300, 4, 301, eos], 4, eos, answer) == pytest.approx(0.5 * 0.5 + 0.5)
    # Stopped at 2 tokens for a target of 4: stop score 1 - 2/4.
    assert demo_reward([2, 3, eos], 4, eos, answer) == pytest.approx(0.5 + 0.5 * 0.5)
    # Far too long: the stop score floors at 0; tokens after EOS are ignored.
    assert demo_reward([2] * 9 + [eos], 4, eos, answer) == pytest.approx(0.5)
    assert demo_reward([2, 3, 4, 5, eos, 400, 400], 4, eos, answer) == pytest.approx(1.0)
    # An immediate EOS: no tokens to score, stop score 0 for any target >= 1.
    assert demo_reward([eos], 4, eos, answer) == 0.0
    assert demo_reward([2, 3, eos], 4, eos, answer, token_weight=1.0) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        demo_reward([2], 0, eos, answer)
