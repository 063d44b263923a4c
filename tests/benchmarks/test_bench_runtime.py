"""benchmarks/bench_runtime.py's pure parts: the interleaved order, paired ratios with t intervals, the target
verdicts, resuming from run directories (a signal stops the benchmark), and the section-4 renderer on a results
document."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
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
    assert bench_runtime.mode_overrides("stock") == ["asp.mode=stock", "asp.max_lag=0"]
    assert bench_runtime.mode_overrides("asp_lag2") == ["asp.mode=asp", "asp.max_lag=2"]
    with pytest.raises(SystemExit, match="unknown mode"):
        bench_runtime.mode_overrides("fast_lag1")


def test_a_stock_run_composes_on_a_config_with_its_own_lag():
    """Stock trains at lag 0 only and the config refuses another lag: the benchmarks say lag 0 for their stock
    runs, so a base list or config that sets asp.max_lag for the other modes still composes one."""
    import bench_convergence
    from mindspeed_asp.runtime.run_config import load_run_config, packaged_config_path

    for stock in (bench_runtime.mode_overrides("stock"), bench_convergence.RUN_KINDS["stock"]):
        cfg = load_run_config(packaged_config_path(), ["asp.max_lag=2"] + stock)
        assert (cfg.asp.mode, cfg.asp.max_lag) == ("stock", 0)


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
    the signal was meant for the benchmark, so the benchmark stops rather than go on to the next run
    and keep the truncated one. A rerun starts that run afresh: the files a failed try left are removed first."""
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


# ------------------------------------------------------------------------------------------ long tail
def test_k_minus_1_is_replan_every_and_is_recorded_once():
    cfg = {"asp": {"replan_every": 2, "minibatch_groups": 8}, "data": {"num_prompts": 48}}
    assert bench_runtime.window_minibatches(cfg) == 2
    lags, spelled = bench_runtime.resolve_lags("1,2,K-1", 2)
    assert lags == [1, 2] and spelled == {"1": ["1", "K-1"], "2": ["2"]}  # K-1 = 1: lag 1's runs, once
    assert bench_runtime.lag_modes(lags) == ["stock", "async_lag1", "asp_lag1", "async_lag2", "asp_lag2"]
    whole_epoch = {"asp": {"replan_every": 0, "minibatch_groups": 8}, "data": {"num_prompts": 48}}
    assert bench_runtime.window_minibatches(whole_epoch) == 6
    assert bench_runtime.resolve_lags("1,K-1", 6) == ([1, 5], {"1": ["1"], "5": ["K-1"]})
    assert bench_runtime.resolve_mode("asp_lagK1", 6) == "asp_lag5"
    assert bench_runtime.resolve_mode("async_lag2", 6) == "async_lag2"
    with pytest.raises(SystemExit, match="neither a number nor K-1"):
        bench_runtime.resolve_lags("1,K", 2)
    with pytest.raises(SystemExit, match="no max_lag"):
        bench_runtime.resolve_lags("K-1", 0)
    with pytest.raises(SystemExit, match="K1 resolved first"):
        bench_runtime.mode_overrides("asp_lagK1")


def test_the_long_tail_config_resolves_k_targets_and_per_seed_lengths():
    cfg = bench_runtime._resolve_config(str(BENCH.parent / "configs" / "tiny_cpu_longtail.yaml"), [])
    assert bench_runtime.window_minibatches(cfg) == cfg["asp"]["replan_every"] == 2
    assert bench_runtime.choose_targets("auto", cfg) == "longtail"
    assert bench_runtime.choose_targets("auto", {"data": {"task": "demo"}}) == "demo"
    assert bench_runtime.seed_overrides(3, cfg) == ["run.seed=3", "data.seed=3", "data.replay.seed=3"]
    assert bench_runtime.seed_overrides(3, {"data": {"task": "demo"}}) == ["run.seed=3", "data.seed=3"]
    w = bench_runtime.workload_shape(cfg, [0, 1])
    assert w["p99_over_median"] >= 8 and 0.05 <= w["cap_share"] <= 0.12  # the long tail the config is for
    assert w["per_seed"]["0"] != w["per_seed"]["1"]  # a seed draws its own lengths
    chat = bench_runtime._resolve_config(str(BENCH.parent / "configs" / "tiny_cpu_longtail.yaml"),
                                         bench_runtime.kind_overrides("chat"))
    wc = bench_runtime.workload_shape(chat, [0])
    assert wc["scale"] == pytest.approx(384 / 2048) and wc["p99_over_median"] < w["p99_over_median"]


def test_seed_plan_rotates_workloads_and_modes_keeping_a_kinds_runs_together():
    modes, kmodes = ["stock", "async_lag1", "asp_lag1", "async_lag2", "asp_lag2"], ["stock", "async_lag1", "asp_lag1"]
    plans = [bench_runtime.seed_plan(modes, ["tiny_decode", "chat"], kmodes, i) for i in range(6)]
    for p in plans:
        assert sorted(p, key=str) == sorted([(None, m) for m in modes] + [(k, m) for k in ("tiny_decode", "chat")
                                                                          for m in kmodes], key=str)
        kinds = [k for k, _ in p]
        assert sum(a != b for a, b in zip(kinds, kinds[1:])) == 2  # three blocks, each contiguous
    assert {p[0][0] for p in plans} == {None, "tiny_decode", "chat"}
    for i, p in enumerate(plans):  # inside a block: the same rotation as seed_order
        assert [m for k, m in p if k == "chat"] == bench_runtime.seed_order(kmodes, i)


def _ci_of(values):
    return dict(bench_runtime.t_interval(values), values=list(values))


def _lt_result(asp_async, asp_stock2, sim_err=0.03, sim_diff=0.02, plan_share=0.01, seeds=(0, 1, 2)):
    """A results dict as `analyze` builds it, with chosen paired ratios (per seed) and figures."""
    modes = ["stock", "async_lag1", "asp_lag1", "async_lag2", "asp_lag2"]
    n = len(seeds)
    sims = {m: dict(bench_runtime.t_interval([sim_err] * n), abs_mean=abs(sim_err), abs_max=abs(sim_err),
                    errors=[sim_err] * n) for m in modes}
    bub = {m: {k: _ci_of([plan_share if m.startswith("asp") else 0.0] * n) for k in bench_runtime.BUBBLE_KEYS}
           for m in modes}
    return {"modes": modes, "seeds_done": list(seeds),
            "ratios_vs_stock": {"async_lag1": _ci_of([1.2] * n), "asp_lag1": _ci_of([1.3] * n),
                                "async_lag2": _ci_of([1.3] * n), "asp_lag2": _ci_of(asp_stock2)},
            "asp_vs_async": {f"lag{k}": _ci_of(v) for k, v in asp_async.items()},
            "simulator": sims,
            "sim_ratio": {f"lag{k}": {"predicted": _ci_of([x + sim_diff for x in v]), "measured": _ci_of(v),
                                      "diff": _ci_of([sim_diff] * n)} for k, v in asp_async.items()},
            "bubbles": bub, "bubbles_runs": {}}


def _by_label(targets):
    return {t["target"]: t for t in targets}


def test_longtail_targets_met():
    r = _lt_result({1: [1.08, 1.10, 1.12], 2: [0.95, 1.10, 1.20]}, [1.55, 1.6, 1.65])
    t = _by_label(bench_runtime.evaluate_targets(r, "longtail"))
    assert len(t) == len(bench_runtime.LONGTAIL_TARGETS)
    assert t["asp max_lag 1 >= 1.05x async max_lag 1"]["verdict"] == "met (interval above target)"
    assert t["asp max_lag 2 >= 1.05x async max_lag 2"]["verdict"] == "met (interval includes a miss)"
    above = t["asp/async 95% interval above 1.0 at max_lag 1 or 2"]
    assert above["met"] is True and above["verdict"] == "met (max_lag 1)"  # lag 2's interval reaches below 1.0
    assert t["asp never below async's interval at any max_lag"]["met"] is True
    assert t["asp max_lag 2 >= 1.5x stock"]["met"] is True
    assert t["simulator within 10% of every mode's run time"]["met"] is True
    assert t["simulator's asp/async within 5 points of the measured ratio"]["met"] is True
    assert t["planning on the critical path < 2% of the run"]["met"] is True
    assert all(x["met"] for x in t.values())


def test_longtail_targets_missed_with_figures():
    r = _lt_result({1: [1.00, 1.02, 1.04], 2: [0.90, 0.91, 0.92]}, [1.3, 1.4, 1.5], sim_err=-0.12, sim_diff=0.08,
                   plan_share=0.03)
    t = _by_label(bench_runtime.evaluate_targets(r, "longtail"))
    assert t["asp max_lag 1 >= 1.05x async max_lag 1"]["verdict"] == "missed (interval includes the target)"
    assert t["asp max_lag 2 >= 1.05x async max_lag 2"]["verdict"] == "missed (interval below target)"
    assert t["asp/async 95% interval above 1.0 at max_lag 1 or 2"]["met"] is False
    below = t["asp never below async's interval at any max_lag"]
    assert below["met"] is False and "max_lag 2" in below["verdict"]
    assert t["asp max_lag 2 >= 1.5x stock"]["met"] is False
    sim = t["simulator within 10% of every mode's run time"]
    assert sim["met"] is False and "12.0%" in sim["verdict"]
    ratio = t["simulator's asp/async within 5 points of the measured ratio"]
    assert ratio["verdict"] == "missed at max_lag 1, max_lag 2"
    plan = t["planning on the critical path < 2% of the run"]
    assert plan["met"] is False and "3.00%" in plan["figure"]


def test_targets_without_data_say_so_and_demo_targets_are_unchanged():
    r = _lt_result({1: [1.1], 2: [1.1]}, [1.6], seeds=(0,))
    del r["simulator"], r["sim_ratio"]
    t = _by_label(bench_runtime.evaluate_targets(r, "longtail"))
    assert t["asp/async 95% interval above 1.0 at max_lag 1 or 2"]["met"] is None  # one seed: no interval
    assert t["simulator within 10% of every mode's run time"]["verdict"] == "no data (simulator skipped)"
    assert t["asp max_lag 1 >= 1.05x async max_lag 1"]["verdict"] == "met (one seed, no interval)"
    demo = bench_runtime.evaluate_targets(_lt_result({1: [1.1, 1.2], 2: [1.0, 1.1]}, [1.2, 1.3], seeds=(0, 1)),
                                          "demo")
    assert [x["target"] for x in demo] == ["asp max_lag 1 >= async max_lag 1", "asp max_lag 2 >= async max_lag 2",
                                           "asp max_lag 1 >= 1.3x stock"]  # asp_lag0 was not run: left out
    assert demo[2]["verdict"] == bench_runtime.verdict_of(_ci_of([1.3, 1.3]), 1.3)
    assert bench_runtime.evaluate_targets(r, "none") == []


# ------------------------------------------------------------------------ real run directories, as recorded
M, K, INSTANCES = 2, 2, 2


def _record_run(run_dir, mode, lag, scale=1.0, reward=0.3):
    """A run directory written by the runtime's own recorder (summary.json, trace.json, metrics.jsonl): 8 groups
    of 2 samples on 2 instances, 4 updates of M = 2 groups; every time is multiplied by `scale`.

    Instance 0 runs groups 0, 1 (4 s) and 4, 5 (2 s), instance 1 groups 2, 3 (2 s) and 6, 7 (4 s): over the
    run both are busy 6 s (no skew), per window of K x M = 4 groups each window is 4 s against 2 s (skew 0.25)."""
    from mindspeed_asp.runtime.run_recorder import GroupSpan, RunRecorder

    rec = RunRecorder(run_dir, mode=mode, instances=INSTANCES, slots=4, minibatch_groups=M, max_lag=lag,
                      clock=lambda: 0.0)
    spans = {0: (0, 0, 2), 1: (0, 2, 4), 2: (1, 0, 1), 3: (1, 1, 2), 4: (0, 4, 5), 5: (0, 5, 6), 6: (1, 4, 6),
             7: (1, 6, 8)}
    for gid, (inst, a, b) in spans.items():
        rec.group(GroupSpan(instance=inst, gid=gid, submit=0.0, start=a * scale, end=b * scale, prompt_tokens=8,
                            response_tokens=40, sample_lengths=[10, 30], version=0,
                            window=gid // M if mode == "stock" else 0, trained=True))
    rec.trainer_starved(0.0, 1.0 * scale)
    rec.trainer_starved(4.0 * scale, 4.5 * scale)
    for step in range(4):
        rec.log_step({"step": step, "t_end": 2.0 * (step + 1) * scale, "time/iteration": 2.0 * scale,
                      "time/rollout": 0.5 * scale, "time/train": 1.0 * scale, "time/weight_sync": 0.1,
                      "tokens/trained": 96, "reward/mean": reward, "bubble/padding_train": 0.1 * (step + 1),
                      "gids": [2 * step, 2 * step + 1]}, [0, 0])
    cost = {"a": 0.005, "b": 2e-5, "c": 1.8e-7, "p": 0.0, "source": "config", "steps": 0, "r2": None,
            "mean_rel": None}  # online_cost.CostEstimate.as_dict / RhoEstimate.as_dict, as plan/windows holds them
    rho = {"rho": 1.0, "source": "default", "updates": 0, "windows": 0, "train_s_per_update": None,
           "rollout_lb_s_per_window": None}
    windows = ([{"window": 0, "groups": 4, "plan_seconds": 0.16 * scale, "ahead": False, "cost": cost, "rho": rho},
                {"window": 1, "groups": 4, "plan_seconds": 0.5, "ahead": True, "cost": cost, "rho": rho}]
               if mode == "asp" else [])
    config = {"asp": {"mode": mode, "max_lag": lag, "replan_every": K, "minibatch_groups": M,
                      "instances": INSTANCES, "slots": 4}, "data": {"num_prompts": 8, "n": 2}}
    return rec.write({"config": config, "plan/windows": windows, "weight_sync/mean_s": 0.1,
                      "memory/peak_rss_gib": 1.0, "steals": 0, "interrupted": False})


def test_bubbles_are_read_from_what_the_recorder_wrote(tmp_path):
    summary = _record_run(tmp_path / "asp_lag1_s0", "asp", 1)
    b = bench_runtime.run_bubbles(tmp_path / "asp_lag1_s0", summary)
    assert b["padding_train"] == pytest.approx(0.25)  # mean of the 4 updates' bubble/padding_train
    assert b["padding_rollout"] == pytest.approx(summary["bubble/padding"]) and b["padding_basis"] == "time"
    assert b["skewness"] == pytest.approx(0.0)  # the recorder sees the streaming run as one window
    assert b["skewness_window"] == pytest.approx(0.25)  # per window of K x M groups: 1 - 3/4 in both
    assert b["trainer_idle_s"] == pytest.approx(1.5) and b["sorting"] == pytest.approx(1.5 / 8)
    assert b["rollout_wait_share"] == pytest.approx(2.0 / 8)
    assert b["plan_critical_s"] == pytest.approx(0.16) and b["plan_critical_share"] == pytest.approx(0.02)
    assert (b["plan_windows"], b["plan_ahead"]) == (2, 1)
    stock = _record_run(tmp_path / "stock_s0", "stock", 0)
    sb = bench_runtime.run_bubbles(tmp_path / "stock_s0", stock)
    # stock: its iterations of M groups are its windows; gids 0, 1 both on instance 0: 1 - 2/4 ... per iteration
    assert sb["skewness_window"] == pytest.approx(stock["bubble/skewness"])
    assert sb["plan_critical_share"] == 0.0

    per_run = {"asp_lag1_s0": b, "asp_lag1_s1": dict(b, sorting=0.25), "stock_s0": sb, "stock_s1": sb}
    agg = bench_runtime.aggregate_bubbles(per_run, ["stock", "asp_lag1"], [0, 1])
    assert agg["asp_lag1"]["sorting"]["mean"] == pytest.approx((1.5 / 8 + 0.25) / 2)
    sorting = agg["asp_lag1"]["sorting"]
    assert sorting["n"] == 2 and sorting["lo"] < sorting["mean"] < sorting["hi"]
    diff = bench_runtime.paired_bubble_diff(per_run, [0, 1], "asp_lag1", "stock")
    assert diff["plan_critical_share"]["values"] == pytest.approx([0.02, 0.02])


def test_planning_on_the_critical_path_counts_every_wait_the_summary_records():
    """A window planned ahead whose search had not finished made the loop wait too (`wait_seconds`); a summary
    without the field counts the windows not planned ahead."""
    recorded = [{"plan_seconds": 0.3, "ahead": False, "wait_seconds": 0.31},
                {"plan_seconds": 0.5, "ahead": True, "wait_seconds": 0.2}]
    assert [bench_runtime.plan_wait_seconds(w) for w in recorded] == [0.31, 0.2]
    older = [{"plan_seconds": 0.3, "ahead": False}, {"plan_seconds": 0.5, "ahead": True}]
    assert [bench_runtime.plan_wait_seconds(w) for w in older] == [0.3, 0.0]


def test_simulator_ratio_is_paired_by_seed():
    runs = {f"{m}_s{s}": {"tokens/trained": 100.0, "throughput/e2e_tps": tps}
            for s in (0, 1) for m, tps in (("asp_lag1", 11.0), ("async_lag1", 10.0))}
    sims = {"asp_lag1_s0": {"predicted_run_s": 9.0}, "async_lag1_s0": {"predicted_run_s": 10.0},
            "asp_lag1_s1": {"predicted_run_s": 10.0}, "async_lag1_s1": {"error_msg": "no engine steps"}}
    sr = bench_runtime.sim_ratio(runs, sims, [0, 1], "asp_lag1", "async_lag1")
    assert sr["seeds"] == [0]  # seed 1's async run has no prediction
    assert sr["predicted"]["mean"] == pytest.approx(10.0 / 9.0) and sr["measured"]["mean"] == pytest.approx(1.1)
    assert sr["diff"]["values"] == pytest.approx([10.0 / 9.0 - 1.1])


def _longtail_results(root):
    """analyze() over recorder-written run directories: asp 10% faster than async, async 25% faster than stock."""
    scale = {"stock": 1.25, "async_lag1": 1.0, "asp_lag1": 1 / 1.1, "async_lag2": 1.0, "asp_lag2": 1 / 1.1}
    modes = list(scale)
    for s in (0, 1):
        for m in modes:
            lag = bench_runtime.mode_lag(m) or 0
            _record_run(root / f"{m}_s{s}", m.split("_lag")[0], lag, scale[m] * (1 + 0.01 * s))
    runs = {f"{m}_s{s}": bench_runtime.load_summary(root / f"{m}_s{s}") for m in modes for s in (0, 1)}
    result = bench_runtime.analyze(root, runs, [0, 1], modes, skip_sim=True, targets="longtail")
    result.update(config="configs/tiny_cpu_longtail.yaml",
                  k={"K": 2, "source": "asp.replan_every", "K-1": 1, "lags": [1, 2],
                     "spelled": {"1": ["1", "K-1"], "2": ["2"]}},
                  workload={"kind": "long_cot", "scale": 0.0125, "max_new_tokens": 384, "median": 33.0,
                            "p99_over_median": 11.6, "cap_share": 0.081})
    kmodes = ["stock", "async_lag1", "asp_lag1"]
    for s in (0, 1):
        for m in kmodes:
            _record_run(root / "kind_chat" / f"{m}_s{s}", m.split("_lag")[0], bench_runtime.mode_lag(m) or 0,
                        1.0 if m != "stock" else 1.1)
    kruns = {f"{m}_s{s}": bench_runtime.load_summary(root / "kind_chat" / f"{m}_s{s}") for m in kmodes for s in (0, 1)}
    chat = bench_runtime.analyze(root / "kind_chat", kruns, [0, 1], kmodes, skip_sim=True, targets="none")
    chat["workload"] = {"kind": "chat", "scale": 0.1875, "max_new_tokens": 384, "median": 47.0,
                        "p99_over_median": 6.4, "cap_share": 0.003}
    result.update(kinds={"chat": chat}, kind_lag=1, kind_overrides=["data.replay.scale=null"])
    return result


def test_analyze_on_recorded_runs_and_the_longtail_renderer(tmp_path):
    import _results
    import render_docs

    d = _longtail_results(tmp_path / "runs")
    assert d["complete"] and d["asp_vs_async"]["lag1"]["mean"] == pytest.approx(1.1)
    assert d["ratios_vs_stock"]["async_lag1"]["mean"] == pytest.approx(1.25)
    assert d["bubbles"]["asp_lag1"]["skewness_window"]["mean"] == pytest.approx(0.25)
    t = _by_label(d["targets"])
    assert t["asp max_lag 1 >= 1.05x async max_lag 1"]["met"] is True
    assert t["asp max_lag 2 >= 1.5x stock"]["met"] is False  # 1.375x: and the reason names the bubbles
    assert "asp_lag2 - stock, paired" in t["asp max_lag 2 >= 1.5x stock"]["why"]
    assert t["simulator within 10% of every mode's run time"]["met"] is None  # --skip-sim
    res = tmp_path / "results"
    res.mkdir()
    stamped = _results.stamp(json.loads(json.dumps(d, default=float)), str(BENCH / "bench_runtime.py"),
                             ["--config", "configs/tiny_cpu_longtail.yaml", "--lags", "1,2,K-1"])
    (res / "runtime_longtail.json").write_text(json.dumps(stamped))
    out = render_docs.render("<!-- BEGIN generated: runtime_longtail -->\n<!-- END generated: runtime_longtail -->\n",
                             res)
    assert "python benchmarks/bench_runtime.py --config configs/tiny_cpu_longtail.yaml --lags 1,2,K-1" in out
    for question in ("Does asp beat async on long tails?", "Does it beat stock?", "Does the simulator predict it?",
                     "Where do the bubbles go?", "Where does ASP not help?"):
        assert f"**{question}" in out
    assert "max_lag K-1 = 1, the same runs as max_lag 1" in out
    assert "| 1 (= K-1) | 1.10x [" in out  # asp / async at max_lag 1, with its interval
    assert "| chat | 6.4 | 0.3% | 1 | 1.00x [" in out
    assert "**missed (interval below target)**" in out and "| asp, max_lag 1 (= K-1) |" in out
    assert "run without `--skip-sim`" in out


def test_longtail_section_is_skipped_with_a_note_without_its_results(tmp_path):
    import render_docs

    for marker in ("runtime_longtail", "runtime_longtail (pending)"):
        out = render_docs.render(f"<!-- BEGIN generated: {marker} -->\n<!-- END generated: runtime_longtail -->\n",
                                 tmp_path)
        assert "Not measured yet: `benchmarks/results/runtime_longtail.json` does not exist" in out
        assert "--lags 1,2,K-1" in out and "| " not in out  # the command, and no table
