"""`asp lengths` end to end through mindspeed_asp.cli.main."""
import json

import pytest

from mindspeed_asp.cli import main
from mindspeed_asp.scheduler.estimators import HistoryEstimator
from mindspeed_asp.scheduler.history import LengthHistory
from mindspeed_asp.scheduler.length_metrics import evaluate
from mindspeed_asp.workloads.prompts import load_prompt_set

from factories import shared_data

ALPACA = shared_data() / "alpaca-train-10k-length.json"


@pytest.mark.skipif(not ALPACA.is_file(), reason=f"{ALPACA} not present")
def test_eval_alpaca_reaches_tau(tmp_path, capsys):
    out = tmp_path / "m.json"
    rc = main(["lengths", "eval", "--trace", f"alpaca:{ALPACA}", "--target", "t0.7",
               "--estimator", "history,cold_start,oracle", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "history" in text and "tau" in text and "10000 groups" in text
    data = json.loads(out.read_text())
    assert data["groups"] == 10_000 and data["max_new_tokens"] == 512
    assert data["results"]["history"]["kendall_tau"] >= 0.6
    assert data["results"]["oracle"]["mae"] == 0.0
    assert data["results"]["history"]["mae"] < data["results"]["cold_start"]["mae"]


def test_eval_synthetic_with_flags(tmp_path, capsys):
    out = tmp_path / "m.json"
    rc = main(["lengths", "eval", "--trace", "synthetic:prompts=600,n=8,seed=1,epochs=3,regime=small",
               "--estimator", "history,cold_start", "--quantile", "0.9", "--recency-decay", "0.7",
               "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["estimator_section"]["group_max_quantile"] == 0.9
    assert data["estimator_section"]["recency_decay"] == 0.7
    hist = data["results"]["history"]
    assert hist["quantile"] == 0.9 and abs(hist["group_max_coverage"] - 0.9) < 0.06
    assert hist["kendall_tau"] > data["results"]["cold_start"]["kendall_tau"] + 0.3
    assert "cold_start" in capsys.readouterr().out


def test_eval_config_and_bad_values(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("asp:\n  estimator:\n    group_max_quantile: 0.7\n    drift: false\n")
    out = tmp_path / "m.json"
    assert main(["lengths", "eval", "--trace", "synthetic:prompts=200,n=4", "--config", str(cfg),
                 "--json", str(out)]) == 0
    sec = json.loads(out.read_text())["estimator_section"]
    assert sec["group_max_quantile"] == 0.7 and sec["drift"] is False
    capsys.readouterr()
    assert main(["lengths", "eval", "--trace", "synthetic:prompts=200", "--quantile", "1.5"]) == 2
    assert "--quantile" in capsys.readouterr().err  # the flag given, not the config key
    assert main(["lengths", "eval", "--trace", "synthetic:prompts=200", "--estimator", "magic"]) == 2
    assert "unknown estimator" in capsys.readouterr().err
    cfg.write_text("asp:\n  estimator:\n    quantile: 0.7\n")
    assert main(["lengths", "eval", "--trace", "synthetic:prompts=200", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert str(cfg) in err and "asp.estimator.quantile" in err


def test_eval_malformed_trace_names_file_and_line(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text('[\n{"id": "1", "L_t0.0": 1, "L_t0.3": 2, "L_t0.5": 3, "L_t0.7": 4},\n'
                    '{"id": "2", "L_t0.0": 1, "L_t0.3": -2, "L_t0.5": 3, "L_t0.7": 4}\n]\n')
    assert main(["lengths", "eval", "--trace", f"alpaca:{path}"]) == 2
    err = capsys.readouterr().err
    assert f"{path}:3" in err and "L_t0.3" in err and "negative" in err
    assert main(["lengths", "eval", "--trace", "synthetic:prompts=5", "--target", "t0.5"]) == 2
    assert "alpaca" in capsys.readouterr().err


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_synth_writes_history_and_dataset(tmp_path, capsys, suffix):
    hist_path = tmp_path / f"h{suffix}"
    truth_path = tmp_path / "truth.jsonl"
    rc = main(["lengths", "synth", "--prompts", "300", "--epochs", "3", "--n", "4", "--seed", "5", "--small",
               "-o", str(hist_path), "--truth", str(truth_path)])
    assert rc == 0
    hist = LengthHistory.load(hist_path)
    prompts = load_prompt_set(tmp_path / "h.prompts.jsonl", n=4)
    assert len(prompts) == 300 and hist.epochs() == [0, 1, 2] and len(hist) == 900
    truth = LengthHistory.load(truth_path)
    assert truth.epochs() == [3]
    true_lengths = truth.epoch_matrix(prompts.prompt_ids, 3, n=4)
    assert (true_lengths >= 1).all() and true_lengths.max() <= 384
    # the written files are directly usable for estimation
    est = HistoryEstimator().estimate(prompts, hist, 384)
    assert est.has_history.all() and evaluate(est, true_lengths)["kendall_tau"] > 0.4


def test_synth_rejects_bad_output(tmp_path, capsys):
    assert main(["lengths", "synth", "--prompts", "10", "--epochs", "1", "-o", str(tmp_path / "h.csv")]) == 2
    assert "h.csv" in capsys.readouterr().err


def test_describe(tmp_path, capsys):
    out = tmp_path / "d.json"
    assert main(["lengths", "describe", "--trace", "synthetic:prompts=2000,seed=2", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert 4 <= d["max_over_mean"] <= 70 and 0.3 <= d["tail_time_share"] <= 0.5
    assert "tail_time_share" in capsys.readouterr().out
