"""LengthHistory: merge semantics, vectorised access, Parquet/JSONL round trips, rollout logs, bad input."""
import json
from pathlib import Path

import numpy as np
import pytest

from mindspeed_asp.errors import InputError
from mindspeed_asp.scheduler.history import LengthHistory


def _small() -> LengthHistory:
    h = LengthHistory()
    h.add("a", 0, [10, 20])
    h.add("b", 1, [5])
    h.add("a", 2, [7, 8, 9])
    h.add("a", 0, [30])  # same key again: merged
    return h


def test_add_merges_and_sorts_records():
    h = _small()
    pid, epoch, offsets, values = h.records()
    assert list(pid) == ["a", "a", "b"]
    assert list(epoch) == [0, 2, 1]
    assert values[offsets[0]:offsets[1]].tolist() == [10, 20, 30]
    assert h.epochs() == [0, 1, 2] and h.latest_epoch() == 2
    assert len(h) == 3 and h.num_samples == 7
    got = h.lengths_for(["b", "zz", "a"])
    assert got[1] == {}
    assert got[0][1].tolist() == [5]
    assert sorted(got[2]) == [0, 2] and got[2][2].tolist() == [7, 8, 9]


def test_add_rejects_bad_values():
    h = LengthHistory()
    with pytest.raises(ValueError):
        h.add("a", 0, [1, -2])
    with pytest.raises(ValueError):
        h.add("a", -1, [1])
    with pytest.raises(ValueError):
        h.add("a", 0, [])


def test_empty_history():
    h = LengthHistory()
    assert len(h) == 0 and h.latest_epoch() is None and h.epochs() == []
    view = h.gather(["x", "y"])
    assert view.num_groups == 2 and len(view.length) == 0


def test_gather_max_epochs_and_before_epoch():
    h = LengthHistory()
    ids = ["p0", "p1", "p2"]
    for e in range(5):
        h.add_epoch(ids, e, np.full((3, 2), 100 * e + 1) + np.arange(3)[:, None])
    h.add("other", 4, [1])
    view = h.gather(["p2", "missing", "p0"], max_epochs=2)
    assert view.num_groups == 3
    assert set(view.group.tolist()) == {0, 2}
    assert sorted(set(view.epoch[view.group == 0].tolist())) == [3, 4]
    assert view.length[(view.group == 0) & (view.epoch == 4)].tolist() == [403, 403]
    assert view.counts().tolist() == [4, 0, 4]
    past = h.gather(["p0"], max_epochs=2, before_epoch=3)
    assert sorted(set(past.epoch.tolist())) == [1, 2]
    mat = h.epoch_matrix(["p1", "missing"], 2, n=3)
    assert mat.tolist() == [[202, 202, -1], [-1, -1, -1]]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_round_trip(tmp_path, suffix):
    rng = np.random.default_rng(0)
    h = LengthHistory()
    ids = [f"q{i}" for i in range(50)]
    for e in range(3):
        h.add_epoch(ids, e, rng.integers(0, 4000, (50, 4)))
    h.add("odd", 7, [3, 2, 1])
    path = tmp_path / f"hist{suffix}"
    h.save(path)
    back = LengthHistory.load(path)
    for a, b in zip(h.records(), back.records()):
        assert np.array_equal(np.asarray(a).astype(str), np.asarray(b).astype(str))
    assert back.latest_epoch() == 7


def test_large_history_is_vectorised(tmp_path):
    """10^5 prompts x 3 epochs x n=4 build, save, load and gather (must stay quick: vectorised paths)."""
    G = 100_000
    ids = np.array([f"p{i}" for i in range(G)], dtype=object)
    rng = np.random.default_rng(1)
    h = LengthHistory()
    for e in range(3):
        h.add_epoch(ids, e, rng.integers(1, 8000, (G, 4)))
    path = tmp_path / "big.parquet"
    h.save(path)
    back = LengthHistory.load(path)
    view = back.gather(ids[::-1], max_epochs=2)
    assert len(back) == 3 * G and len(view.length) == 2 * 4 * G
    assert view.length[view.group == 0].tolist() == h.lengths_for([ids[-1]])[0][1].tolist() + \
        h.lengths_for([ids[-1]])[0][2].tolist()


def test_append_rollout_log_merges_groups(tmp_path):
    log = tmp_path / "rollout.jsonl"
    lines = [
        {"prompt_id": "a", "epoch": 0, "response_lengths": [5, 6], "instance": 1, "version": 3},
        {"prompt_id": 17, "epoch": 0, "response_lengths": [9]},
        {"prompt_id": "a", "epoch": 0, "response_lengths": [7]},
    ]
    log.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    h = LengthHistory()
    h.add("a", 0, [1])
    assert h.append_rollout_log(log) == 3
    got = h.lengths_for(["a", "17"])
    assert got[0][0].tolist() == [1, 5, 6, 7]
    assert got[1][0].tolist() == [9]


def _expect_line(path: Path, line: int, fn):
    with pytest.raises(InputError) as info:
        fn()
    assert f"{path}:{line}" in str(info.value)
    assert info.value.line == line
    return info.value


@pytest.mark.parametrize("bad,key", [
    ('{"prompt_id": "b", "epoch": 0, "response_lengths": [1, 2]', None),  # bad JSON
    ('{"prompt_id": "b", "response_lengths": [1]}', "epoch"),
    ('{"prompt_id": "b", "epoch": 0}', "response_lengths"),
    ('{"prompt_id": "b", "epoch": 0, "response_lengths": [4, -1]}', "response_lengths"),
    ('{"prompt_id": "b", "epoch": 0, "response_lengths": [4.5]}', "response_lengths"),
    ('{"epoch": 0, "response_lengths": [4]}', "prompt_id"),
    ('[1, 2]', None),
])
def test_rollout_log_errors_name_file_and_line(tmp_path, bad, key):
    log = tmp_path / "log.jsonl"
    log.write_text('{"prompt_id": "a", "epoch": 0, "response_lengths": [1]}\n\n' + bad + "\n")
    err = _expect_line(log, 3, lambda: LengthHistory().append_rollout_log(log))
    if key:
        assert err.key == key


def test_history_file_rejects_duplicate_key(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_text('{"prompt_id": "a", "epoch": 0, "lengths": [1]}\n'
                    '{"prompt_id": "b", "epoch": 0, "lengths": [1]}\n'
                    '{"prompt_id": "a", "epoch": 0, "lengths": [2]}\n')
    err = _expect_line(path, 3, lambda: LengthHistory.load(path))
    assert "duplicate" in str(err)


def test_parquet_errors_name_column_and_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "h.parquet"
    pq.write_table(pa.table({"prompt_id": ["a"], "epoch": [0]}), str(path))
    with pytest.raises(InputError, match="lengths"):
        LengthHistory.load(path)
    pq.write_table(pa.table({"prompt_id": ["a", "b"], "epoch": [0, 0], "lengths": [[1], [3, -4]]}), str(path))
    with pytest.raises(InputError, match=r"row 2: negative length"):
        LengthHistory.load(path)
    pq.write_table(pa.table({"prompt_id": ["a", "a"], "epoch": [1, 1], "lengths": [[1], [3]]}), str(path))
    with pytest.raises(InputError, match=r"row 2: duplicate"):
        LengthHistory.load(path)


def test_unknown_suffix_and_missing_file(tmp_path):
    with pytest.raises(InputError, match="parquet or .jsonl"):
        LengthHistory().save(tmp_path / "h.csv")
    with pytest.raises(InputError, match="not found"):
        LengthHistory.load(tmp_path / "none.parquet")


def test_select_epochs_and_max_length():
    h = _small()
    before = h.select_epochs(before=2)
    assert before.epochs() == [0, 1] and before.lengths_for(["a"])[0][0].tolist() == [10, 20, 30]
    only = h.select_epochs(only=2)
    assert only.epochs() == [2] and only.lengths_for(["a"])[0][2].tolist() == [7, 8, 9]
    assert h.max_length() == 30 and LengthHistory().max_length() == 0


@pytest.mark.parametrize("value,match", [
    ("0", "length 0 is out of range"),  # a response has at least one token; the simulator divides by it
    ("1000000000000", "length 1000000000000 is out of range"),  # 10^12: no real length
    ("99999999999999999999", "10,000,000 tokens"),  # beyond int64: refused before numpy overflows
    ("true", "must be an integer"),
])
@pytest.mark.parametrize("suffix,lengths_key", [("history", "lengths"), ("log", "response_lengths")])
def test_a_length_out_of_range_is_refused_naming_file_line_and_key(tmp_path, value, match, suffix, lengths_key):
    path = tmp_path / f"{suffix}.jsonl"
    path.write_text(f'{{"prompt_id": "a", "epoch": 0, "{lengths_key}": [5]}}\n'
                    f'{{"prompt_id": "b", "epoch": 0, "{lengths_key}": [4, {value}]}}\n')
    read = (lambda: LengthHistory.load(path)) if suffix == "history" else \
        (lambda: LengthHistory().append_rollout_log(path))
    with pytest.raises(InputError, match=match) as info:
        read()
    assert info.value.line == 2 and info.value.key == lengths_key and f"{path}:2" in str(info.value)


def test_the_length_bound_is_inclusive(tmp_path):
    from mindspeed_asp.core.limits import MAX_LENGTH

    path = tmp_path / "h.jsonl"
    path.write_text(f'{{"prompt_id": "a", "epoch": 0, "lengths": [1, {MAX_LENGTH}]}}\n')
    assert LengthHistory.load(path).max_length() == MAX_LENGTH


def test_parquet_lengths_and_epochs_out_of_range_name_the_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "h.parquet"
    for lengths, epoch, match in (([[1], [3, 0]], [0, 0], r"row 2: length 0 is out of range"),
                                  ([[10**12], [3]], [0, 0], r"row 1: length 1000000000000 is out of range"),
                                  ([[1], [3]], [0, 2**40], r"row 2: epoch 1099511627776 is out of range")):
        pq.write_table(pa.table({"prompt_id": ["a", "b"], "epoch": pa.array(epoch, type=pa.int64()),
                                 "lengths": lengths}), str(path))
        with pytest.raises(InputError, match=match):
            LengthHistory.load(path)


def test_a_declared_cap_and_an_epoch_out_of_range_are_refused(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_text('{"prompt_id": "a", "epoch": 0, "lengths": [5], "max_new_tokens": 100000000000}\n')
    with pytest.raises(InputError, match="max_new_tokens 100000000000 is out of range") as info:
        LengthHistory.load(path)
    assert info.value.key == "max_new_tokens" and info.value.line == 1
    path.write_text('{"prompt_id": "a", "epoch": 99999999999999999999, "lengths": [5]}\n')
    with pytest.raises(InputError, match="epoch 99999999999999999999 is out of range") as info:
        LengthHistory.load(path)
    assert info.value.key == "epoch"
