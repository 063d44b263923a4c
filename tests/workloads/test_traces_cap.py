"""Trace caps come from the data: the cap a file declares, else its longest length; `cap=` overrides."""
import json

import numpy as np
import pytest

from mindspeed_asp.cli import main
from mindspeed_asp.errors import InputError
from mindspeed_asp.scheduler.history import LengthHistory
from mindspeed_asp.workloads.spec import workload_from_spec
from mindspeed_asp.workloads.traces import load_alpaca, load_history_trace


def _alpaca(path, longest: int, extra=None, jsonl: bool = False):
    """A small alpaca-format trace: 20 prompts, lengths 5..400 and one sample of `longest` tokens."""
    rng = np.random.default_rng(0)
    recs = []
    for i in range(20):
        cols = rng.integers(5, 400, 4).tolist()
        if i == 7:
            cols[2] = longest  # L_t0.5 of prompt 7: a history column for target t0.7
        rec = {"id": str(i), "L_gt": 3, "L_t0.0": cols[0], "L_t0.3": cols[1], "L_t0.5": cols[2], "L_t0.7": cols[3]}
        rec.update(extra or {})
        recs.append(rec)
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n" if jsonl else json.dumps(recs))
    return path


def _rollout_log(path, longest: int, declare=None):
    """A runtime rollout log, 3 epochs x 12 prompts x 4 samples; one sample of `longest` tokens in epoch 1."""
    rng = np.random.default_rng(1)
    with path.open("w") as fh:
        for e in range(3):
            for i in range(12):
                lens = rng.integers(20, 900, 4).tolist()
                if e == 1 and i == 5:
                    lens[0] = longest
                rec = {"prompt_id": f"p{i}", "epoch": e, "response_lengths": lens, "instance": i % 2}
                if declare is not None:
                    rec["max_new_tokens"] = declare
                fh.write(json.dumps(rec) + "\n")
    return path


@pytest.mark.parametrize("longest", [1900, 16384])
@pytest.mark.parametrize("jsonl", [False, True], ids=["json", "jsonl"])
def test_alpaca_format_trace_cap_is_its_longest_length(tmp_path, longest, jsonl):
    path = _alpaca(tmp_path / ("t.jsonl" if jsonl else "t.json"), longest, jsonl=jsonl)
    trace = load_alpaca(path, target="t0.7")
    assert trace.max_new_tokens == longest and trace.cap_source == "observed"
    for spec in (f"alpaca:{path}", f"alpaca:{path}?target=all", f"alpaca:{path}?target=t0.5"):
        assert workload_from_spec(spec).max_new_tokens == longest
    assert workload_from_spec(f"alpaca:{path}?cap=20000").max_new_tokens == 20000  # the explicit override
    with pytest.raises(InputError, match=f"below the longest length in the trace \\({longest}\\)") as exc:
        workload_from_spec(f"alpaca:{path}?cap=1024")
    assert exc.value.key == "cap"


def test_alpaca_declared_cap_wins_and_is_checked(tmp_path):
    path = _alpaca(tmp_path / "d.json", 1900, extra={"max_new_tokens": 2048})
    trace = load_alpaca(path)
    assert trace.max_new_tokens == 2048 and trace.cap_source == "declared"
    with pytest.raises(InputError, match="exceeds the declared max_new_tokens 1024") as exc:
        load_alpaca(_alpaca(tmp_path / "low.json", 1900, extra={"max_new_tokens": 1024}))
    assert exc.value.key == "max_new_tokens"
    with pytest.raises(InputError, match="must be a positive integer"):
        load_alpaca(_alpaca(tmp_path / "bad.json", 1900, extra={"max_new_tokens": "lots"}))


@pytest.mark.parametrize("longest", [1900, 16384])
def test_history_trace_cap_is_its_longest_length_over_all_epochs(tmp_path, longest):
    log = _rollout_log(tmp_path / "rollout.jsonl", longest)
    wl = workload_from_spec(f"history:{log}")  # truth = epoch 2; the longest sample is in the history
    assert wl.max_new_tokens == longest and wl.truth.max() < longest
    early = workload_from_spec(f"history:{log}?epoch=0")  # the longest sample is after the truth epoch
    assert early.max_new_tokens == longest
    assert workload_from_spec(f"history:{log}?cap=32768").max_new_tokens == 32768


def test_history_declared_cap_from_jsonl_and_parquet(tmp_path):
    log = _rollout_log(tmp_path / "rollout.jsonl", 1900, declare=4096)
    trace = load_history_trace(log)
    assert trace.max_new_tokens == 4096 and trace.cap_source == "declared"
    hist = LengthHistory.load(log)
    assert hist.declared_cap == 4096
    for name in ("h.parquet", "h.jsonl"):  # save keeps the declared cap, load reads it back
        hist.save(tmp_path / name)
        assert LengthHistory.load(tmp_path / name).declared_cap == 4096
        assert workload_from_spec(f"history:{tmp_path / name}").max_new_tokens == 4096
    plain = _rollout_log(tmp_path / "plain.jsonl", 1900)
    LengthHistory.load(plain).save(tmp_path / "plain.parquet")
    assert LengthHistory.load(tmp_path / "plain.parquet").declared_cap is None
    assert workload_from_spec(f"history:{tmp_path / 'plain.parquet'}").max_new_tokens == 1900


def test_history_declared_cap_errors_name_file_line_and_key(tmp_path):
    with pytest.raises(InputError, match="exceeds the declared max_new_tokens 1024"):
        load_history_trace(_rollout_log(tmp_path / "low.jsonl", 1900, declare=1024))
    mixed = _rollout_log(tmp_path / "mixed.jsonl", 1900, declare=4096)
    lines = mixed.read_text().splitlines()
    rec = json.loads(lines[3])
    rec["max_new_tokens"] = 8192
    lines[3] = json.dumps(rec)
    mixed.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"mixed.jsonl:4 key 'max_new_tokens': max_new_tokens 8192 differs"):
        LengthHistory.load(mixed)


def test_splitwise_cap_includes_requests_left_out(tmp_path):
    csv = tmp_path / "s.csv"
    rows = [f"{i},{10 + i},{5 + i}" for i in range(9)] + ["9,30,1900"]  # the last request does not fill a group
    csv.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows) + "\n")
    wl = workload_from_spec(f"splitwise:{csv}?n=3")
    assert wl.truth.shape == (3, 3) and wl.max_new_tokens == 1900


def test_lengths_eval_reports_the_trace_cap_and_takes_the_override(tmp_path, capsys):
    path = _alpaca(tmp_path / "t.json", 1900)
    out = tmp_path / "m.json"
    assert main(["lengths", "eval", "--trace", f"alpaca:{path}", "--estimator", "history", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["max_new_tokens"] == 1900
    out2 = tmp_path / "m2.json"
    assert main(["lengths", "eval", "--trace", f"alpaca:{path}", "--estimator", "history", "--max-new-tokens",
                 "16384", "--json", str(out2)]) == 0
    assert json.loads(out2.read_text())["max_new_tokens"] == 16384
