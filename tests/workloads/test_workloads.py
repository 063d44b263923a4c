"""Workloads: synthetic generator statistics and seeding, trace loaders, prompt datasets, workload specs."""
import json

import numpy as np
import pytest

from mindspeed_asp.errors import InputError
from mindspeed_asp.workloads.prompts import load_prompt_set, save_prompt_set
from mindspeed_asp.workloads.spec import workload_from_spec
from mindspeed_asp.workloads.synthetic import SyntheticRLWorkload, tail_statistics
from mindspeed_asp.workloads.traces import load_alpaca, load_splitwise

from factories import shared_data

DATA = shared_data()
ALPACA = DATA / "alpaca-train-10k-length.json"
SPLITWISE = DATA / "splitwise_conv.csv"


# ----------------------------------------------------------------------------- synthetic
@pytest.mark.parametrize("make", [lambda: SyntheticRLWorkload(4000, n=8, epochs=4, seed=7),
                                  lambda: SyntheticRLWorkload.small(4000, n=8, epochs=4, seed=8)],
                         ids=["rl", "small"])
def test_synthetic_statistics_within_design_bounds(make):
    wl = make()
    for e in range(wl.epochs):
        d = wl.describe(e)
        assert 0.30 <= d["tail_time_share"] <= 0.50, d
        assert 0.30 <= d["tail_token_share"] <= 0.50, d
        assert 4.0 <= d["max_over_mean"] <= 70.0, d
        assert 0.0 < d["truncated_frac"] < 0.1  # a truncation spike, not a wall
    L = wl.lengths(0)
    assert L.max() == wl.max_new_tokens and L.min() >= 1
    # the spike: far more samples exactly at the cap than just below it
    assert np.sum(L == wl.max_new_tokens) > 5 * np.sum((L >= 0.97 * wl.max_new_tokens) & (L < wl.max_new_tokens))
    # within-group log spread in [0.3, 0.8]; between-prompt spread of latent medians ~ sigma_between
    assert 0.3 <= wl.within_sigma.min() and wl.within_sigma.max() <= 0.8
    assert np.std(wl.log_median(0)) == pytest.approx(1.0, abs=0.05)


def test_synthetic_regimes():
    rl = SyntheticRLWorkload(2000, epochs=1, seed=0).describe(0)
    small = SyntheticRLWorkload.small(2000, epochs=1, seed=0).describe(0)
    assert 1500 < rl["median"] < 2800 and rl["max"] == 16384
    assert 30 < small["median"] < 70 and small["max"] == 384


def test_synthetic_is_seeded_and_order_independent():
    a = SyntheticRLWorkload(500, n=4, epochs=3, seed=42)
    b = SyntheticRLWorkload(500, n=4, epochs=3, seed=42)
    c = SyntheticRLWorkload(500, n=4, epochs=3, seed=43)
    late = b.lengths(2)  # asked first
    assert np.array_equal(a.lengths(2), late)
    assert np.array_equal(a.lengths(0), b.lengths(0))
    assert np.array_equal(a.prompts.prompt_lens, b.prompts.prompt_lens)
    assert a.prompts.fingerprint() == b.prompts.fingerprint()
    assert not np.array_equal(a.lengths(0), c.lengths(0))
    with pytest.raises(ValueError):
        a.lengths(3)


def test_synthetic_drift_and_history():
    wl = SyntheticRLWorkload(3000, n=8, epochs=4, seed=1, trend=0.1, rho=0.9)
    med = [np.median(np.log(wl.lengths(e))) for e in range(4)]
    steps = np.diff(med)
    assert np.all(np.abs(steps - 0.1) < 0.05)
    # AR(1): latent medians correlate across epochs with about rho
    r = np.corrcoef(wl.log_median(0), wl.log_median(1))[0, 1]
    assert 0.85 < r < 0.95
    h = wl.history(3)
    assert h.epochs() == [0, 1, 2]
    assert np.array_equal(h.epoch_matrix(wl.prompts.prompt_ids, 1, n=8), wl.lengths(1))


def test_tail_statistics_definition():
    x = np.array([1] * 9 + [10])
    s = tail_statistics(x)
    assert s["max_over_mean"] == pytest.approx(10 / 1.9)
    assert s["tail_token_share"] == pytest.approx(10 / 19)
    assert s["tail_time_share"] == pytest.approx((10 - np.quantile(x, 0.9)) / 10)


# ----------------------------------------------------------------------------- alpaca
@pytest.mark.skipif(not ALPACA.is_file(), reason=f"{ALPACA} not present")
def test_load_alpaca_real_file():
    prompts, hist, truth = load_alpaca(ALPACA, target="t0.7")
    assert len(prompts) == 10_000 and truth.shape == (10_000, 1) and prompts.n == 1
    assert hist.epochs() == [0, 1, 2] and len(hist) == 30_000
    assert truth.max() <= 512
    raw = json.loads(ALPACA.read_text())
    first = hist.lengths_for([raw[0]["id"]])[0]
    assert [first[e][0] for e in range(3)] == [raw[0]["L_t0.0"], raw[0]["L_t0.3"], raw[0]["L_t0.5"]]
    assert truth[0, 0] == raw[0]["L_t0.7"]
    p4, h4, t4 = load_alpaca(ALPACA, target=None)
    assert t4.shape == (10_000, 4) and len(h4) == 0 and p4.n == 4


def _alpaca_text(records):
    return "[\n" + ",\n".join("    " + json.dumps(r) for r in records) + "\n]\n"


GOOD = {"id": "1", "L_gt": 5, "L_t0.7": 10, "L_t0.5": 11, "L_t0.3": 12, "L_t0.0": 13}


def test_load_alpaca_small_file_and_target(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(_alpaca_text([GOOD, dict(GOOD, id="2", **{"L_t0.0": 99})]))
    prompts, hist, truth = load_alpaca(path, target="t0.0")
    assert truth[:, 0].tolist() == [13, 99]
    assert hist.lengths_for(["2"])[0][2].tolist() == [10]  # epochs ordered by temperature: t0.3, t0.5, t0.7
    with pytest.raises(InputError, match="target"):
        load_alpaca(path, target="t0.9")


@pytest.mark.parametrize("bad,key,match", [
    (dict(GOOD, id="2", **{"L_t0.5": -3}), "L_t0.5", "negative"),
    ({k: v for k, v in GOOD.items() if k != "L_t0.3"} | {"id": "2"}, "L_t0.3", "missing"),
    (dict(GOOD), "id", "duplicate"),
    (dict(GOOD, id="2", **{"L_t0.7": "long"}), "L_t0.7", "integer"),
])
def test_load_alpaca_errors_name_line(tmp_path, bad, key, match):
    path = tmp_path / "a.json"
    path.write_text(_alpaca_text([GOOD, bad]))  # second record starts on line 3
    with pytest.raises(InputError, match=match) as info:
        load_alpaca(path)
    assert info.value.line == 3 and info.value.key == key and f"{path}:3" in str(info.value)


def test_load_alpaca_bad_json_names_line(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('[\n  {"id": "1", "L_t0.0": 1, "L_t0.3": 1, "L_t0.5": 1, "L_t0.7": 1},\n'
                    '  {"id": "2", "L_t0.0": }\n]\n')
    with pytest.raises(InputError, match="invalid JSON") as info:
        load_alpaca(path)
    assert info.value.line == 3


# ----------------------------------------------------------------------------- splitwise
@pytest.mark.skipif(not SPLITWISE.is_file(), reason=f"{SPLITWISE} not present")
def test_load_splitwise_real_file():
    prompts, hist, truth = load_splitwise(SPLITWISE, n=8)
    assert truth.shape == (19_366 // 8, 8) and len(hist) == 0
    assert truth.max() == 1000 and truth.min() >= 0
    assert (prompts.prompt_lens > 0).all()


def test_load_splitwise_groups_and_errors(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n1,20,6\n2,30,7\n3,40,8\n4,50,9\n")
    prompts, _, truth = load_splitwise(path, n=2)
    assert truth.tolist() == [[5, 6], [7, 8]] and prompts.prompt_lens.tolist() == [15, 35]
    path.write_text("arrived_at,num_prefill_tokens\n0,10\n")
    with pytest.raises(InputError, match="missing column") as info:
        load_splitwise(path, n=1)
    assert info.value.key == "num_decode_tokens" and info.value.line == 1
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n1,20,-6\n")
    with pytest.raises(InputError, match="non-negative") as info:
        load_splitwise(path, n=1)
    assert f"{path}:3" in str(info.value)
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n1,x,6\n")
    with pytest.raises(InputError, match="not a number") as info:
        load_splitwise(path, n=1)
    assert info.value.line == 3


# ----------------------------------------------------------------------------- prompt datasets
def test_load_prompt_set(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt_id": "a", "prompt_len": 12, "source": "math"}\n\n'
                    '{"id": 7, "prompt_token_ids": [1, 2, 3]}\n')
    ps = load_prompt_set(path, n=4)
    assert ps.prompt_ids.tolist() == ["a", "7"] and ps.prompt_lens.tolist() == [12, 3] and ps.n == 4
    assert ps.sources.tolist() == ["math", ""] and ps.origin == str(path)
    out = tmp_path / "round.jsonl"
    save_prompt_set(ps, out)
    back = load_prompt_set(out, n=4)
    assert back.fingerprint() == ps.fingerprint()


@pytest.mark.parametrize("bad,key,match", [
    ('{"prompt_id": "b", "prompt_len": 3', None, "invalid JSON"),
    ('{"prompt_len": 3}', "prompt_id", "prompt id"),
    ('{"prompt_id": "b"}', "prompt_len", "missing prompt length"),
    ('{"prompt_id": "b", "prompt_len": -1}', "prompt_len", "negative"),
    ('{"prompt_id": "a", "prompt_len": 4}', "prompt_id", "duplicate"),
    ('{"prompt_id": "b", "prompt_token_ids": 5}', "prompt_token_ids", "list"),
    ('"just a string"', None, "JSON object"),
])
def test_load_prompt_set_errors_name_file_and_line(tmp_path, bad, key, match):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt_id": "a", "prompt_len": 3}\n{"prompt_id": "c", "prompt_len": 3}\n' + bad + "\n")
    with pytest.raises(InputError, match=match) as info:
        load_prompt_set(path)
    assert f"{path}:3" in str(info.value) and info.value.line == 3
    if key:
        assert info.value.key == key


def test_load_prompt_set_missing_or_empty(tmp_path):
    with pytest.raises(InputError, match="not found"):
        load_prompt_set(tmp_path / "none.jsonl")
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(InputError, match="no prompts"):
        load_prompt_set(tmp_path / "e.jsonl")


# ----------------------------------------------------------------------------- specs
def test_workload_from_spec_synthetic():
    wl = workload_from_spec("synthetic:prompts=64,n=4,seed=3,epochs=2")
    prompts, hist, truth = wl
    ref = SyntheticRLWorkload(64, n=4, epochs=3, seed=3)
    assert np.array_equal(truth, ref.lengths(2)) and hist.epochs() == [0, 1]
    assert wl.max_new_tokens == 16384 and prompts.n == 4
    small = workload_from_spec("synthetic:prompts=32,regime=small,cap=200")
    assert small.max_new_tokens == 200 and small.truth.max() <= 200 and small.truth.shape == (32, 8)


def test_workload_from_spec_traces(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(_alpaca_text([GOOD, dict(GOOD, id="2")]))
    wl = workload_from_spec(f"alpaca:{path}?target=t0.3")
    assert wl.truth[:, 0].tolist() == [12, 12] and wl.max_new_tokens == 13  # the longest length in the file
    assert workload_from_spec(f"alpaca:{path}?target=all").truth.shape == (2, 4)
    csv = tmp_path / "s.csv"
    csv.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n1,20,6\n")
    sw = workload_from_spec(f"splitwise:{csv}?n=2")
    assert sw.truth.tolist() == [[5, 6]] and sw.max_new_tokens == 6


@pytest.mark.parametrize("spec,match", [
    ("synthetic:prompts=10,bogus=1", "unknown workload option"),
    ("synthetic:prompts=ten", "bad value"),
    ("nope:x", "unknown workload kind"),
    ("no-colon", "workload must look like"),
    ("alpaca:/does/not/exist.json", "not found"),
])
def test_workload_from_spec_errors(spec, match):
    with pytest.raises(InputError, match=match):
        workload_from_spec(spec)


def test_history_spec_back_tests_a_rollout_log(tmp_path, capsys):
    """A runtime rollout log (split groups, extra keys) replayed as a workload: the last epoch is the truth."""
    wl = SyntheticRLWorkload.small(40, n=4, epochs=3, seed=4)
    log = tmp_path / "rollout.jsonl"
    with log.open("w") as fh:
        for e in range(3):
            L = wl.lengths(e)
            for i, pid in enumerate(wl.prompts.prompt_ids):
                if e == 2 and i == 0:
                    continue  # this prompt's last group never finished
                fh.write(json.dumps({"prompt_id": pid, "epoch": e, "response_lengths": L[i, :2].tolist(),
                                     "instance": 0}) + "\n")
                fh.write(json.dumps({"prompt_id": pid, "epoch": e, "response_lengths": L[i, 2:].tolist(),
                                     "instance": 1}) + "\n")
    ds = tmp_path / "prompts.jsonl"
    save_prompt_set(wl.prompts, ds)
    res = workload_from_spec(f"history:{log}?dataset={ds}&cap=384")
    assert res.truth.shape == (39, 4) and res.prompts.n == 4 and res.max_new_tokens == 384
    assert np.array_equal(res.truth, wl.lengths(2)[1:])
    assert np.array_equal(res.prompts.prompt_lens, wl.prompts.prompt_lens[1:])
    assert res.history.epochs() == [0, 1]
    assert "fewer than n=4" in capsys.readouterr().err
    early = workload_from_spec(f"history:{log}?epoch=1")
    assert early.truth.shape == (40, 4) and early.history.epochs() == [0]
    with pytest.raises(InputError, match="no epoch 7"):
        workload_from_spec(f"history:{log}?epoch=7")


# ----------------------------------------------------------------------------- length bounds
@pytest.mark.parametrize("value,match", [(0, "length 0 is out of range"), (10**12, "out of range"),
                                         (10**20, "10,000,000 tokens"), (7.0, None)])
def test_alpaca_lengths_are_range_checked(tmp_path, value, match):
    path = tmp_path / "a.json"
    path.write_text(_alpaca_text([GOOD, dict(GOOD, id="2", **{"L_t0.3": value})]))
    if match is None:  # an integral float is a length (JSON writers emit 7.0)
        assert load_alpaca(path, target="t0.3").truth[1, 0] == 7
        return
    with pytest.raises(InputError, match=match) as info:
        load_alpaca(path)
    assert info.value.line == 3 and info.value.key == "L_t0.3"


@pytest.mark.parametrize("row,key,match", [("1,20,0", "num_decode_tokens", "length 0 is out of range"),
                                           ("1,20,1e30", "num_decode_tokens", "out of range"),
                                           ("1,1e12,6", "num_prefill_tokens", "prompt length"),
                                           ("1,20,inf", "num_decode_tokens", "non-negative integer")])
def test_splitwise_lengths_are_range_checked(tmp_path, row, key, match):
    path = tmp_path / "s.csv"
    path.write_text(f"arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n{row}\n")
    with pytest.raises(InputError, match=match) as info:
        load_splitwise(path, n=1)
    assert info.value.line == 3 and info.value.key == key


def test_prompt_lengths_are_range_checked(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt_id": "a", "prompt_len": 0}\n{"prompt_id": "b", "prompt_len": 100000000000}\n')
    with pytest.raises(InputError, match="prompt length 100000000000 is out of range") as info:
        load_prompt_set(path)
    assert info.value.line == 2 and info.value.key == "prompt_len"


@pytest.mark.parametrize("spec,key", [
    ("synthetic:prompts=8,n=2,seed=4294967296", "seed"),
    ("synthetic:prompts=8,n=2,cap=100000000", "cap"),
    ("synthetic:prompts=8,n=2,median=1e9", "median"),
    ("synthetic:prompts=8,n=2,prompt_len=1e9", "prompt_len"),
])
def test_synthetic_workload_numbers_are_range_checked(spec, key):
    with pytest.raises(InputError) as info:
        workload_from_spec(spec)
    assert info.value.key == key
    assert workload_from_spec("synthetic:prompts=8,n=2,seed=4294967295").prompts.n == 2
