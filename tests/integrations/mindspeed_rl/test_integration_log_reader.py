"""MindSpeed-RL training logs (Loggers.handle_msg format) are read into compare summaries."""
import math
from datetime import datetime, timezone

import pytest

from mindspeed_asp.errors import InputError
from mindspeed_asp.integrations.mindspeed_rl import log_reader
from mindspeed_asp.integrations.mindspeed_rl.log_reader import (
    looks_like_training_log, parse_line, read_iterations, read_training_log)


def msrl_line(it, total, metrics):
    """One line exactly as MindSpeed-RL 05a90d7 `Loggers.handle_msg` formats it (behind logging's prefix)."""
    now = str(datetime.now(tz=timezone.utc)).split(".")[0]
    msg = f"[{now}] iteration: {it} / {total} | "
    for k, v in metrics.items():
        msg += f"{k} : {'{:e}'.format(v)} | " if "lr" in k else f"{k} : {format(v, '.4f')} | "
    return f"2026-04-22 10:00:00,000 - INFO - {msg[:-2]}\n"


def write_log(path, iters, total=5, e2e=(200.0, 220.0, 240.0)):
    with open(path, "w") as fh:
        fh.write("(train pid=123) INFO sync start grpo training at iteration: 0/5 ...\n")
        for i in range(iters):
            fh.write(msrl_line(i + 1, total, {"timing/all": 70.0 + i, "timing/rollout": 50.0, "timing/update": 15.0,
                                              "e2e_tps": e2e[i % len(e2e)], "vllm_tps": 300.0,
                                              "response_length/mean": 900.0 + i, "actor/lr": 1e-6,
                                              "grad_norm": float("nan") if i == 0 else 1.0,
                                              "grpo/score/mean": 0.1 * (i + 1)}))
            fh.write("unrelated line\n")


def test_parse_line_keeps_every_metric():
    rec = parse_line(msrl_line(3, 500, {"timing/all": 73.1234, "e2e_tps": 220.0, "actor/lr": 1e-6}))
    assert rec == {"iteration": 3, "train_iters": 500, "timing/all": 73.1234, "e2e_tps": 220.0, "actor/lr": 1e-6}
    assert parse_line("INFO after grpo training is done") is None


def test_summary_means_aliases_and_warmup(tmp_path):
    p = tmp_path / "stock.log"
    write_log(p, 3)
    s = read_training_log(p)
    assert s["iterations"] == 3 and s["train_iters"] == 5 and s["last_iteration"] == 3
    assert s["e2e_tps"] == pytest.approx(220.0)
    assert s["timing/all"] == pytest.approx(71.0) and s["time/iteration"] == pytest.approx(71.0)
    assert s["grad_norm"] == pytest.approx(1.0)  # nan skipped
    assert s["headline"]["vllm_tps"] == pytest.approx(300.0)
    assert s["reward/first"] == pytest.approx(0.1) and s["reward/final"] == pytest.approx(0.3)
    assert s["mode"] == "mindspeed-rl"
    s2 = read_training_log(p, skip_first=1)
    assert s2["iterations_used"] == 2 and s2["e2e_tps"] == pytest.approx(230.0)
    assert log_reader.read_log_summary is read_training_log  # name `asp compare` probes for


def test_restarted_run_keeps_the_last_one(tmp_path):
    p = tmp_path / "restart.log"
    write_log(p, 3)
    with open(p, "a") as fh:
        fh.write(msrl_line(1, 5, {"e2e_tps": 1.0}))
        fh.write(msrl_line(2, 5, {"e2e_tps": 3.0}))
    recs = read_iterations(p)
    assert [r["iteration"] for r in recs] == [1, 2]
    assert read_training_log(p)["e2e_tps"] == pytest.approx(2.0)


def test_not_a_log_is_an_error_naming_the_file(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("hello\n")
    assert not looks_like_training_log(p)
    with pytest.raises(InputError, match="notes.txt"):
        read_training_log(p)
    with pytest.raises(InputError, match="not found"):
        read_training_log(tmp_path / "missing.log")


def test_compare_reads_stock_and_asp_logs_side_by_side(tmp_path, capsys):
    from mindspeed_asp.cli import main
    stock, asp = tmp_path / "stock.log", tmp_path / "asp.log"
    write_log(stock, 3, e2e=(100.0,))
    write_log(asp, 3, e2e=(250.0,))
    rc = main(["compare", str(stock), str(asp), "--json", str(tmp_path / "c.json")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "stock.log" in out and "asp.log" in out
    import json
    rows = json.loads((tmp_path / "c.json").read_text())
    assert [r["e2e_tps"] for r in rows] == [100.0, 250.0]
    assert not math.isnan(rows[0]["timing/rollout"])


def test_compare_uses_mindspeed_rl_columns_when_a_log_is_involved(tmp_path, capsys):
    from mindspeed_asp.cli import main
    stock = tmp_path / "stock.log"
    write_log(stock, 3, e2e=(100.0,))
    asp_run = tmp_path / "asp_run"
    asp_run.mkdir()
    import json
    # An ASP run directory answers MindSpeed-RL's columns with its docs/design.md#metrics names.
    (asp_run / "summary.json").write_text(json.dumps({
        "mode": "asp", "throughput/e2e_tps": 250.0, "throughput/rollout_tps": 900.0, "time/iteration": 2.0,
        "time/rollout": 1.5, "time/train": 0.4, "length/trained_mean": 321.0, "lag/max": 1}))
    assert main(["compare", str(stock), str(asp_run)]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    for col in ("e2e_tps", "vllm_tps", "timing/all", "timing/rollout", "timing/update", "resp len mean"):
        assert col in header
    asp_line = next(line for line in out.splitlines() if line.startswith("asp_run"))
    assert "250 (x2.50)" in asp_line
    assert "321" in asp_line
