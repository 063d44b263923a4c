"""benchmarks/bench_runtime.py's pure parts: the interleaved order, paired ratios with t intervals, the target
verdicts, resuming from run directories (a signal stops the benchmark), and the section-4 renderer on a results
document."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_runtime  # noqa: E402
import doc_tables  # noqa: E402


def test_every_mode_takes_every_position_over_seeds():
    modes = list(bench_runtime.ALL_MODES)
    orders = [bench_runtime.seed_order(modes, i) for i in range(len(modes))]
    for pos in range(len(modes)):
        assert sorted(o[pos] for o in orders) == sorted(modes)
    assert all(sorted(o) == sorted(modes) for o in orders)


def test_mode_overrides_and_bad_mode():
    assert bench_runtime.mode_overrides("stock") == ["asp.mode=stock"]
    assert bench_runtime.mode_overrides("asp_lag2") == ["asp.mode=asp", "asp.max_lag=2"]
    with pytest.raises(SystemExit, match="unknown mode"):
        bench_runtime.mode_overrides("fast_lag1")


def test_t_interval_matches_the_textbook_value():
    ci = bench_runtime.t_interval([1.0, 2.0, 3.0, 4.0])
    # mean 2.5, s = 1.291, t(0.975, 3) = 3.182: half-width 2.054
    assert ci["mean"] == pytest.approx(2.5)
    assert ci["hi"] - ci["mean"] == pytest.approx(3.182446 * 1.2909944 / 2.0, rel=1e-5)
    one = bench_runtime.t_interval([1.2])
    assert one["mean"] == 1.2 and np.isnan(one["lo"])


def _runs(ratios):
    runs = {}
    for s, r in enumerate(ratios):
        runs[f"stock_s{s}"] = {"throughput/e2e_tps": 100.0}
        runs[f"asp_lag1_s{s}"] = {"throughput/e2e_tps": 100.0 * r}
    return runs


def test_paired_ratio_and_verdicts():
    ci = bench_runtime.paired_ratio(_runs([1.45, 1.5, 1.55]), [0, 1, 2], "asp_lag1", "stock")
    assert ci["values"] == pytest.approx([1.45, 1.5, 1.55]) and ci["mean"] == pytest.approx(1.5)
    assert bench_runtime.verdict_of(ci, 1.3).startswith("met (interval above")
    assert bench_runtime.verdict_of(ci, 1.55).startswith("missed (interval includes")
    wide = bench_runtime.paired_ratio(_runs([0.9, 1.8]), [0, 1], "asp_lag1", "stock")
    assert bench_runtime.verdict_of(wide, 1.3) == "met (interval includes a miss)"
    assert bench_runtime.paired_ratio(_runs([1.1]), [0, 5], "asp_lag1", "stock")["n"] == 1  # seed 5: no runs


def test_resume_reads_finished_runs_only(tmp_path):
    (tmp_path / "stock_s0").mkdir()
    (tmp_path / "stock_s0" / "summary.json").write_text(json.dumps({"interrupted": False, "x": 1}))
    (tmp_path / "asp_lag1_s0").mkdir()
    (tmp_path / "asp_lag1_s0" / "summary.json").write_text(json.dumps({"interrupted": True}))
    assert bench_runtime.load_summary(tmp_path / "stock_s0") == {"interrupted": False, "x": 1}
    assert bench_runtime.load_summary(tmp_path / "asp_lag1_s0") is None  # stopped early: run again
    assert bench_runtime.load_summary(tmp_path / "async_lag1_s0") is None


def test_renderer_prints_targets_and_simulator_errors():
    ci = bench_runtime.t_interval([1.0, 1.1])
    d = {"modes": ["stock", "asp_lag1"], "seeds_done": [0, 1], "seeds_planned": [0, 1, 2], "complete": False,
         "ratios_vs_stock": {"asp_lag1": dict(ci, values=[1.0, 1.1])}, "asp_vs_async": {},
         "targets": [{"target": "asp max_lag 1 >= 1.3x stock", "ratio": ci, "threshold": 1.3,
                      "verdict": bench_runtime.verdict_of(ci, 1.3)}],
         "runs": {f"{m}_s{s}": {"throughput/e2e_tps": 100.0, "time/run": 30.0}
                  for m in ("stock", "asp_lag1") for s in (0, 1)},
         "asp_time": {}, "convergence": {m: dict(bench_runtime.t_interval([0.3, 0.4]), finals=[0.3, 0.4])
                                         for m in ("stock", "asp_lag1")},
         "weight_sync_s_per_round": {m: bench_runtime.t_interval([0.1, 0.1]) for m in ("stock", "asp_lag1")},
         "peak_memory_gib": {"stock": 3.0, "asp_lag1": 3.1},
         "simulator": {m: dict(bench_runtime.t_interval([0.05, -0.02]), abs_mean=0.035, abs_max=0.05,
                               errors=[0.05, -0.02], verdict="met") for m in ("stock", "asp_lag1")}}
    text = doc_tables.runtime(d)
    assert "**partial**" in text and "missed (interval" in text
    assert "1.05x [" in text and "3.5%" in text


def test_a_run_stopped_by_a_signal_stops_the_benchmark_and_what_a_try_left_is_cleared(tmp_path, monkeypatch):
    """A signal ends the driver's run at a safe point with `interrupted` set: that run is no measurement, and
    the signal was meant for the benchmark, so the benchmark stops (before, it went on to the next run and
    kept the truncated one). A rerun starts that run afresh: the files a failed try left are removed first."""
    import mindspeed_asp.runtime.driver as driver_mod

    class StoppedDriver:
        def __init__(self, cfg, out, **kwargs):
            self.out, self.pool = Path(out), None

        def run(self):
            with open(self.out / "rollout_log.jsonl", "a") as fh:
                fh.write('{"prompt_id": "p0"}\n')
            return {"interrupted": True, "stop_signal": "SIGTERM"}

    monkeypatch.setattr(driver_mod, "Driver", StoppedDriver)
    left = tmp_path / "stock_s0"
    left.mkdir()
    (left / "rollout_log.jsonl").write_text('{"prompt_id": "from an earlier try"}\n')
    runner = bench_runtime.Runner(None, share_instances=True)
    with pytest.raises(KeyboardInterrupt, match="stock_s0 stopped by SIGTERM"):
        runner.run("stock_s0", tmp_path, ["asp.mode=stock"])
    assert (left / "rollout_log.jsonl").read_text() == '{"prompt_id": "p0"}\n'  # the earlier try's lines are gone
    assert bench_runtime.load_summary(left) is None
