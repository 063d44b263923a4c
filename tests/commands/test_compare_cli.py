"""`asp compare` over run directories written by the real RunRecorder, plus the metric definitions."""
from __future__ import annotations

import json

import pytest

from mindspeed_asp.cli import main
from mindspeed_asp.commands.compare import compare_runs, load_run, register_loader
from mindspeed_asp.errors import InputError
from mindspeed_asp.runtime.run_recorder import GroupSpan, RunRecorder, group_skewness, read_steps
from mindspeed_asp.runtime.run_plots import plot_run


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def fake_run(tmp_path, name, mode, iter_s, skew_end, offpolicy=None, devices=None):
    """A 2-step run: instance 0 busy [0, 4], instance 1 busy [0, skew_end]; steps end at iter_s, 2*iter_s."""
    clock = Clock()
    rec = RunRecorder(tmp_path / name, mode=mode, instances=2, slots=4, minibatch_groups=1, max_lag=1,
                      clock=clock, devices=devices)
    rec.group(GroupSpan(0, 0, 0.0, 0.0, 4.0, 10, 40, [10, 10, 10, 10], version=0, window=0, trained=True))
    rec.group(GroupSpan(1, 1, 0.0, 0.0, skew_end, 10, 20, [5, 5, 5, 5], version=0, window=0, trained=True))
    rec.queue(0, 0.0)
    rec.queue(1, 4.0)
    rec.trainer_starved(0.0, 2.0)
    for step, lags in ((0, [0, 0, 0, 0]), (1, [1, 1, 1, 1])):
        rec.log_step({"step": step, "version": step + 1, "t_end": iter_s * (step + 1), "time/iteration": iter_s,
                      "time/train": 0.5, "time/rollout": iter_s - 0.6, "time/weight_sync": 0.1,
                      "reward/mean": 0.1 * (step + 1),
                      "tokens/trained": 50, **((offpolicy or {}).get(step, {}))}, lags)
    rec.write()
    return rec


def test_metric_definitions(tmp_path):
    rec = fake_run(tmp_path, "a", "stock", 5.0, 2.0)
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    # T = [4, 2], R = 4: skew = 1 - 3/4
    assert s["bubble/skewness"] == pytest.approx(0.25)
    # trainer starved 2 s of a 10 s run
    assert s["bubble/sorting"] == pytest.approx(0.2)
    # 100 trained tokens / (3 devices: 2 instances + the trainer's 1 * 10 s), docs/design.md#e2e_tps
    assert s["throughput/e2e_tps"] == pytest.approx(100 / (3 * 10.0))
    assert s["devices"] == {"total": 3, "rollout": 2, "trainer": 1, "layout": "split", "definition": "all_devices"}
    # the stock run's own rho against its rollout: 0.5 s train / 4.4 s rollout per update
    assert s["rho_stock"] == pytest.approx(0.5 / 4.4)
    assert s["lag/max"] == 1 and s["lag/mean"] == pytest.approx(0.5) and s["lag/frac_over_bound"] == 0.0
    assert s["lag/hist"] == {"0": 4, "1": 4}
    # each group fills all 4 samples for its whole span: slot-time use 4*4 + 4*2 over 4 slots * 6 s busy = 1
    assert s["bubble/padding"] == pytest.approx(0.0)
    assert [r["step"] for r in read_steps(tmp_path / "a")] == [0, 1]
    assert group_skewness([], 2)["skew"] == 0.0
    assert rec.summary()["reward/final"] == pytest.approx(0.2)


def test_plots_written(tmp_path):
    fake_run(tmp_path, "a", "asp", 5.0, 2.0)
    paths = plot_run(tmp_path / "a")
    assert [p.name for p in paths] == ["gantt.png", "queue.png", "lag_hist.png", "reward.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_compare_table_ratios_and_cli(tmp_path, capsys):
    fake_run(tmp_path, "stock", "stock", 10.0, 1.0)
    fake_run(tmp_path, "asp", "asp", 5.0, 4.0)
    table, runs = compare_runs([tmp_path / "stock", tmp_path / "asp"])
    asp_line = [x for x in table.splitlines() if x.startswith("asp ")][0]
    # e2e_tps doubles and iteration time halves against the first run
    assert "(x2.00)" in asp_line.split()[3] and asp_line.count("(x2.00)") >= 2
    assert runs[1]["mode"] == "asp"
    out_json = tmp_path / "cmp.json"
    assert main(["compare", str(tmp_path / "stock"), str(tmp_path / "asp"), "--json", str(out_json)]) == 0
    assert "e2e_tps" in capsys.readouterr().out
    assert len(json.loads(out_json.read_text())) == 2


def test_compare_errors_name_the_path(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="summary.json"):
        load_run(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "summary.json").write_text("{not json")
    with pytest.raises(InputError, match="summary.json"):
        load_run(bad)


def test_pluggable_loader(tmp_path):
    log = tmp_path / "x.customlog"
    log.write_text("e2e_tps=7\n")
    register_loader(lambda p: p.suffix == ".customlog",
                    lambda p: {"name": p.name, "mode": "log", "throughput/e2e_tps": 7.0}, first=True)
    assert load_run(log)["throughput/e2e_tps"] == 7.0


def test_mindspeed_rl_log_file_is_read_by_the_log_reader(tmp_path):
    pytest.importorskip("mindspeed_asp.integrations.mindspeed_rl.log_reader")
    log = tmp_path / "stock_mindspeed.log"
    log.write_text("".join(
        f"[2026-04-22 10:00:0{i}] iteration: {i} / 3 | timing/all : {10.0 + i} | e2e_tps : {200.0 + i}\n"
        for i in (1, 2, 3)))
    fake = fake_run(tmp_path, "asp", "asp", 5.0, 2.0)
    assert fake is not None
    table, runs = compare_runs([log, tmp_path / "asp"])
    assert runs[0]["throughput/e2e_tps"] == pytest.approx(202.0)
    assert runs[0]["time/iteration"] == pytest.approx(12.0)
    assert runs[0]["name"] == "stock_mindspeed.log"
    # ratio column against the log's run: asp's iteration time 5 s vs 12 s
    assert "(x2.40)" in table
    assert "stock_mindspeed.log MindSpeed-RL's world size (not in the log)" in table  # the same definition
    assert "warning" not in table
    asp_log = tmp_path / "asp_mindspeed.log"
    asp_log.write_text("[2026-04-22 10:00:01] iteration: 1 / 3 | timing/all : 10.0 | e2e_tps : 100.0 | "
                       "asp/devices : 16.0 | lag/mean : 0.5\n")
    table, _ = compare_runs([log, asp_log])
    assert "asp_mindspeed.log 16 (MindSpeed-RL's world size)" in table


def test_offpolicy_metrics_summarised_and_compared(tmp_path):
    from mindspeed_asp.runtime.run_recorder import offpolicy_fields

    steps = {0: {"offpolicy/iw_mean": 1.0, "offpolicy/iw_max": 1.0, "offpolicy/iw_frac_capped": 0.0,
                 "offpolicy/clip_frac": 0.1, "offpolicy/iw_mean_lag0": 1.0, "lag/token_weighted_mean": 0.0},
             1: {"offpolicy/iw_mean": 1.5, "offpolicy/iw_max": 2.0, "offpolicy/iw_frac_capped": 0.25,
                 "offpolicy/clip_frac": 0.3, "offpolicy/iw_mean_lag1": 1.5, "lag/token_weighted_mean": 1.0}}
    fake_run(tmp_path, "plain", "stock", 10.0, 1.0)
    fake_run(tmp_path, "dec", "asp", 5.0, 4.0, offpolicy=steps)
    s = json.loads((tmp_path / "dec" / "summary.json").read_text())
    assert s["offpolicy/iw_mean"] == pytest.approx(1.25)  # mean over steps
    assert s["offpolicy/iw_max"] == pytest.approx(2.0)  # max over steps
    assert s["offpolicy/iw_frac_capped"] == pytest.approx(0.125)
    assert s["offpolicy/iw_mean_lag1"] == pytest.approx(1.5)  # only the step that had lag 1
    assert s["lag/token_weighted_mean"] == pytest.approx(0.5)
    assert read_steps(tmp_path / "dec")[1]["offpolicy/iw_frac_capped"] == 0.25
    assert offpolicy_fields({"offpolicy/iw_mean": 1, "loss": 3.0, "lag/token_weighted_mean": 0.5}) == {
        "offpolicy/iw_mean": 1.0, "lag/token_weighted_mean": 0.5}
    table, _ = compare_runs([tmp_path / "plain", tmp_path / "dec"])
    header = table.splitlines()[0]
    assert "iw mean" in header and "iw capped" in header and "clip" in header and "tok lag" in header
    dec_line = [line for line in table.splitlines() if line.startswith("dec ")][0]
    assert "1.25" in dec_line and "0.125" in dec_line
    plain, _ = compare_runs([tmp_path / "plain"])
    assert "iw mean" not in plain  # runs without the metrics keep the narrow table


def test_compare_states_devices_and_rho_stock_and_warns_on_old_summaries(tmp_path):
    from mindspeed_asp.core.metrics import split_devices

    fake_run(tmp_path, "stock", "stock", 10.0, 1.0)
    fake_run(tmp_path, "asp", "asp", 5.0, 4.0, devices=split_devices(2, 1, 2))  # a trainer on 2 devices
    s = json.loads((tmp_path / "asp" / "summary.json").read_text())
    assert s["throughput/e2e_tps"] == pytest.approx(100 / (4 * 10.0))
    assert "rho_stock" not in s  # only a stock run measures stock's rollout
    table, runs = compare_runs([tmp_path / "stock", tmp_path / "asp"])
    assert "stock 3 (2 rollout + 1 trainer, split)" in table and "asp 4 (2 rollout + 2 trainer, split)" in table
    assert "warning" not in table
    # rho_stock: each run's train time per update over the stock run's rollout per update (9.4 s)
    assert runs[0]["rho/stock"] == pytest.approx(0.5 / 9.4) and runs[1]["rho/stock"] == pytest.approx(0.5 / 9.4)
    assert "rho_stock" in table.splitlines()[0]
    # a summary without a devices record (its e2e_tps divided by the instances only): compared with a warning naming it
    old = tmp_path / "old"
    old.mkdir()
    legacy = {k: v for k, v in s.items() if k != "devices"}
    (old / "summary.json").write_text(json.dumps(legacy))
    table, _ = compare_runs([tmp_path / "stock", old])
    assert "old unknown" in table
    assert [line for line in table.splitlines() if line.startswith("warning: old recorded no devices")]
