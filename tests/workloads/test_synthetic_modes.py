"""The synthetic generator's named modes (long_cot, chat, summarisation, tiny_decode) and their spec strings."""
import hashlib

import numpy as np
import pytest

from mindspeed_asp.errors import InputError
from mindspeed_asp.workloads.spec import workload_from_spec
from mindspeed_asp.workloads.synthetic import MODES, ParameterError, SyntheticRLWorkload, mode_defaults

SEEDS = (0, 1, 2)


def _digest(wl: SyntheticRLWorkload) -> str:
    h = hashlib.sha256()
    for e in range(wl.epochs):
        h.update(wl.lengths(e).tobytes())
    h.update(wl.prompts.prompt_lens.tobytes())
    h.update(wl.within_sigma.tobytes())
    h.update("|".join(wl.prompts.prompt_ids).encode())
    return h.hexdigest()[:16]


# Digests of the default and small streams: they must not move (tests and recorded benchmark figures depend on
# them).
@pytest.mark.parametrize("make,expected", [
    (lambda: SyntheticRLWorkload(300, n=8, epochs=3, seed=0), "1e20952659c4c693"),
    (lambda: SyntheticRLWorkload(300, n=8, epochs=3, seed=7), "90cd8647b608b631"),
    (lambda: SyntheticRLWorkload.small(300, n=4, epochs=3, seed=1), "c90acfd94a955a79"),
    (lambda: SyntheticRLWorkload(300, n=4, epochs=3, seed=1, mode="small"), "c90acfd94a955a79"),
    (lambda: SyntheticRLWorkload(50, n=2, epochs=2, seed=3, sources=["a", "b", "c"], trend=-0.1),
     "b81686cf1076bafb"),
], ids=["rl0", "rl7", "small1", "mode-small1", "sources"])
def test_default_and_small_streams_are_unchanged(make, expected):
    assert _digest(make()) == expected


def _epochs(mode: str, seed: int, G: int = 1024):
    wl = SyntheticRLWorkload(G, n=8, epochs=4, seed=seed, mode=mode)
    return wl, [wl.describe(e) for e in range(wl.epochs)]


@pytest.mark.parametrize("seed", SEEDS)
def test_long_cot_bimodal_capped_and_drifting_down(seed):
    wl, d = _epochs("long_cot", seed)
    cap = wl.max_new_tokens
    assert cap == 16384
    for e, s in enumerate(d):
        assert 3000 <= s["mean"] <= 5000, (e, s)
        assert 0.05 <= s["truncated_frac"] <= 0.15, (e, s)
        assert 1800 <= s["correct_median"] <= 3000, (e, s)  # correct answers: ~2k
        assert 2.5 <= s["wrong_median"] / s["correct_median"] <= 5.0, (e, s)  # wrong ones: much longer
        L, ok = wl.lengths(e), wl.correct(e)
        # the spike: many samples exactly at the cap, few just below it
        assert np.sum(L == cap) > 5 * np.sum((L >= 0.97 * cap) & (L < cap))
        assert np.mean(L[ok] == cap) < 0.01 < np.mean(L[~ok] == cap)  # the wrong answers make the spike
    # the policy learns: more correct, shorter, fewer truncations, every epoch
    assert all(b["correct_frac"] > a["correct_frac"] for a, b in zip(d, d[1:]))
    assert all(b["mean"] < a["mean"] for a, b in zip(d, d[1:]))
    assert d[-1]["truncated_frac"] < 0.8 * d[0]["truncated_frac"]
    assert d[-1]["mean"] < 0.85 * d[0]["mean"]
    # prompt difficulty: the per-prompt probability of a correct answer spans easy and hard prompts
    p = wl.p_correct(0)
    assert np.mean(p < 0.3) > 0.05 and np.mean(p > 0.9) > 0.1
    assert np.all(wl.p_correct(3) > p)


@pytest.mark.parametrize("seed", SEEDS)
def test_chat_short_with_a_moderate_tail(seed):
    wl, d = _epochs("chat", seed)
    assert wl.max_new_tokens == 2048
    for s in d:
        assert 200 <= s["median"] <= 300 and 250 <= s["mean"] <= 450, s
        assert 3.0 <= s["p99_over_median"] <= 8.0, s
        assert s["truncated_frac"] < 0.01, s
    assert 100 <= np.median(wl.prompts.prompt_lens) <= 250


@pytest.mark.parametrize("seed", SEEDS)
def test_summarisation_medium_tight_long_prompts(seed):
    wl, d = _epochs("summarisation", seed)
    assert 1024 <= wl.max_new_tokens <= 2048
    for e, s in enumerate(d):
        assert 400 <= s["median"] <= 600, s
        logs = np.log(wl.lengths(e))
        assert np.median(logs.std(axis=1, ddof=1)) < 0.2  # low within-group spread
        assert s["truncated_frac"] < 0.005, s
    assert 1000 <= np.median(wl.prompts.prompt_lens) <= 2000


@pytest.mark.parametrize("seed", SEEDS)
def test_tiny_decode_median_13_with_a_dominant_longest_sequence(seed):
    wl, d = _epochs("tiny_decode", seed)
    assert wl.max_new_tokens == 2048
    for s in d:
        assert 10 <= s["median"] <= 16, s
        assert 1000 <= s["max"] <= 2048, s
        assert s["max_over_mean"] > 30, s  # one sequence decodes far longer than the typical share of a slot
        assert s["truncated_frac"] < 0.001, s


def test_modes_are_seeded_order_independent_and_distinct():
    for mode in MODES:
        a = SyntheticRLWorkload(200, n=4, epochs=3, seed=5, mode=mode)
        b = SyntheticRLWorkload(200, n=4, epochs=3, seed=5, mode=mode)
        c = SyntheticRLWorkload(200, n=4, epochs=3, seed=6, mode=mode)
        late = b.lengths(2)  # asked first
        assert np.array_equal(a.lengths(2), late) and np.array_equal(a.lengths(0), b.lengths(0))
        assert np.array_equal(a.prompts.prompt_lens, b.prompts.prompt_lens)
        assert not np.array_equal(a.lengths(0), c.lengths(0))
    lc = SyntheticRLWorkload(200, n=4, epochs=3, seed=5, mode="long_cot")
    assert np.array_equal(lc.correct(1), SyntheticRLWorkload(200, n=4, epochs=3, seed=5, mode="long_cot").correct(1))
    # a preset mode draws from its own stream, not a rescaled copy of the default one
    chat = SyntheticRLWorkload(200, n=4, epochs=1, seed=5, mode="chat")
    ref = SyntheticRLWorkload(200, n=4, epochs=1, seed=5, median_tokens=256.0, max_new_tokens=2048,
                              sigma_between=0.6, sigma_within=(0.3, 0.6), trend=0.0, prompt_len_median=150.0,
                              prompt_len_sigma=0.8)
    assert not np.array_equal(chat.lengths(0), ref.lengths(0))


def test_explicit_parameters_override_the_mode_and_bad_ones_name_the_key():
    wl = SyntheticRLWorkload(300, n=8, epochs=2, seed=0, mode="long_cot", max_new_tokens=8192, loop=0.0,
                             p_correct=0.95)
    assert wl.max_new_tokens == 8192 and wl.lengths(0).max() <= 8192
    assert wl.describe(0)["correct_frac"] > 0.75
    assert mode_defaults("chat")["p_correct"] is None and mode_defaults("long_cot")["loop"] == 0.22
    with pytest.raises(ParameterError, match="unknown mode") as exc:
        SyntheticRLWorkload(10, mode="poetry")
    assert exc.value.key == "mode"
    with pytest.raises(ParameterError) as exc:
        SyntheticRLWorkload(10, mode="chat", p_correct=0.5)
    assert exc.value.key == "p_correct"
    with pytest.raises(ParameterError) as exc:
        SyntheticRLWorkload(10, mode="long_cot", loop=1.5)
    assert exc.value.key == "loop"
    with pytest.raises(ValueError, match="long_cot only"):
        SyntheticRLWorkload(10, mode="chat").correct(0)


@pytest.mark.parametrize("mode", ["long_cot", "chat", "summarisation", "tiny_decode"])
def test_spec_strings_reach_every_mode(mode):
    wl = workload_from_spec(f"synthetic:mode={mode},prompts=128,n=8,seed=2")
    ref = SyntheticRLWorkload(128, n=8, epochs=4, seed=2, mode=mode)
    assert np.array_equal(wl.truth, ref.lengths(3)) and wl.history.epochs() == [0, 1, 2]
    assert wl.max_new_tokens == ref.max_new_tokens
    assert np.array_equal(wl.prompts.prompt_lens, ref.prompts.prompt_lens)


def test_spec_overrides_and_the_older_regime_spelling():
    wl = workload_from_spec("synthetic:mode=long_cot,prompts=64,n=4,cap=4096,p_correct=0.5,learn=0.1,"
                            "wrong_ratio=2,loop=0.05,prompt_len=900,epochs=1")
    ref = SyntheticRLWorkload(64, n=4, epochs=2, seed=0, mode="long_cot", max_new_tokens=4096, p_correct=0.5,
                              learn=0.1, wrong_ratio=2.0, loop=0.05, prompt_len_median=900.0)
    assert np.array_equal(wl.truth, ref.lengths(1)) and wl.max_new_tokens == 4096
    small = workload_from_spec("synthetic:prompts=32,regime=small,cap=200")
    assert np.array_equal(small.truth, SyntheticRLWorkload.small(32, epochs=4, max_new_tokens=200).lengths(3))
    assert np.array_equal(workload_from_spec("synthetic:prompts=32,mode=small").truth,
                          workload_from_spec("synthetic:prompts=32,regime=small").truth)


@pytest.mark.parametrize("spec,key,match", [
    ("synthetic:mode=poetry,prompts=8", "mode", "unknown mode 'poetry'"),
    ("synthetic:mode=chat,prompts=8,p_correct=0.5", "p_correct", "long_cot only"),
    ("synthetic:prompts=8,loop=0.1", "loop", "long_cot only"),
    ("synthetic:mode=long_cot,prompts=8,colour=1", "colour", "unknown workload option"),
    ("synthetic:mode=chat,regime=small,prompts=8", "regime", "contradicts"),
    ("synthetic:mode=long_cot,prompts=8,p_correct=1.5", "p_correct", r"\(0, 1\)"),
    ("synthetic:mode=long_cot,prompts=8,learn=fast", "learn", "bad value"),
    ("synthetic:mode=tiny_decode,prompts=8,cap=0", "cap", "max_new_tokens must be >= 1"),
    ("synthetic:mode=chat,prompts=0", "prompts", ">= 1"),
])
def test_spec_errors_name_the_key(spec, key, match):
    with pytest.raises(InputError, match=match) as exc:
        workload_from_spec(spec)
    assert exc.value.key == key
