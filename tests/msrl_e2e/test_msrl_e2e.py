"""MindSpeed-RL's own trainer loop on a CPU, with ASP installed as a cluster installs it (tier `msrl_e2e`).

Each mode is one run of `run_msrl.py` (MindSpeed-RL's launcher, `train` task, `RayGRPOTrainer`, worker classes,
TransferDock, rule reward, advantages, `metrics_sort` and log line; only the NPU stack is stood in, see
cpu_standins.py). What the runs print and the ASP audit file are then checked here.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence

import pytest

from mindspeed_asp.integrations.mindspeed_rl.log_reader import read_iterations

HERE = Path(__file__).resolve().parent
ITERS, GBS, N = 3, 2, 4
MSRL_NAMES = ("timing/all", "timing/update", "timing/rollout", "timing/reference_model", "timing/adv",
              "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/lr", "grpo/score/mean",
              "response_length/mean", "prompt_length/mean", "e2e_tps", "update_tps", "vllm_tps")
ASP_NAMES = ("lag/mean", "lag/max", "lag/token_weighted_mean", "time/weight_sync", "asp/policy_version",
             "asp/iw_mean", "asp/iw_max", "asp/iw_frac_capped", "asp/behav_prox_absdiff_mean", "asp/clip_frac",
             "asp/sync_readback", "bubble/skewness", "throughput/e2e_tps")
NOT_DETERMINISTIC = ("timing/", "e2e_tps", "update_tps", "vllm_tps", "throughput/", "time/")

pytestmark = [pytest.mark.msrl_e2e, pytest.mark.slow]


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: Any) -> Path:
    return tmp_path_factory.mktemp("msrl_e2e")


def run_mode(workdir: Path, mode: str, without_asp: bool = False, iters: int = ITERS, tag: str = "",
             extra: Sequence[str] = (), audit_name: str = "asp_audit.jsonl", log_name: str = "",
             worker_name: str = "", expect_fail: bool = False) -> Dict[str, Any]:
    name = mode + ("-noasp" if without_asp else "") + (f"-{tag}" if tag else "")
    log = workdir / f"{log_name or name}.log"
    cmd = [sys.executable, str(HERE / "run_msrl.py"), "--workdir", str(workdir), "--mode", mode,
           "--iters", str(iters), "--gbs", str(GBS), "--n", str(N)] + (["--without-asp"] if without_asp else [])
    cmd += (["--tag", tag] if tag else []) + list(extra)
    with log.open("w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=600, env=dict(os.environ))
    text = log.read_text(errors="replace")
    if expect_fail:
        assert proc.returncode != 0, f"{name} was expected to fail (log {log}):\n" + text[-3000:]
        return {"dir": workdir / name, "log": text, "ended": time.time()}
    assert proc.returncode == 0, f"{name} failed (log {log}):\n" + text[-6000:]
    audit = workdir / name / audit_name
    records = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
    worker_log = workdir / name / (worker_name or audit_name.replace("asp_audit", "worker_output").replace(".jsonl",
                                                                                                         ".log"))
    assert worker_log.is_file(), f"{name} left no copy of its workers' output (log {log}):\n" + text[-3000:]
    return {"iterations": read_iterations(worker_log), "audit": records, "dir": workdir / name,
            "log": text + worker_log.read_text(errors="replace")}


@pytest.fixture(scope="session")
def stock(workdir: Path) -> Dict[str, Any]:
    return run_mode(workdir, "stock")


@pytest.fixture(scope="session")
def stock_without_asp(workdir: Path) -> Dict[str, Any]:
    return run_mode(workdir, "stock", without_asp=True)


@pytest.fixture(scope="session", params=["async1", "asp1"])
def streaming(request: Any, workdir: Path) -> Dict[str, Any]:
    if request.param == "async1":  # with a launch-line override of an asp: key, composed as the launchers do:
        # the trainer's audit lands where the override says only if the override reached ASP's processes
        audit = "asp_audit_override.jsonl"
        return dict(run_mode(workdir, "async1", extra=["--override", f"asp.audit_path={workdir / 'async1' / audit}"],
                             audit_name=audit, worker_name="worker_output.log"), mode="async1")
    return dict(run_mode(workdir, request.param), mode=request.param)


@pytest.fixture(scope="session")
def asp0(workdir: Path) -> Dict[str, Any]:
    return run_mode(workdir, "asp0")


def deterministic(rec: Dict[str, Any]) -> Dict[str, float]:
    return {k: v for k, v in rec.items() if not k.startswith(NOT_DETERMINISTIC)}


def test_stock_runs_msrl_loop_and_logs_its_metric_names(stock: Dict[str, Any]) -> None:
    its = stock["iterations"]
    assert [r["iteration"] for r in its] == list(range(1, ITERS + 1))
    for rec in its:
        missing = [k for k in MSRL_NAMES if k not in rec]
        assert not missing, f"iteration {rec['iteration']} lacks {missing}"
    assert its[-1]["actor/kl_loss"] > 0.0, "the policy never moved away from the reference"


def test_installing_asp_changes_nothing_in_stock_mode(stock: Dict[str, Any],
                                                      stock_without_asp: Dict[str, Any]) -> None:
    with_asp = [deterministic(r) for r in stock["iterations"]]
    without = [deterministic(r) for r in stock_without_asp["iterations"]]
    assert len(with_asp) == ITERS and with_asp == without
    assert not any(k.startswith(("asp/", "lag/")) for r in with_asp for k in r)


def test_plan_ordered_rows_in_msrl_fit(asp0: Dict[str, Any]) -> None:
    from mindspeed_asp.scheduler.plan_file import DispatchPlan
    its = asp0["iterations"]
    assert [r["iteration"] for r in its] == list(range(1, ITERS + 1))
    assert all(all(k in r for k in MSRL_NAMES) for r in its)
    windows = [r for r in asp0["audit"] if "plan_iteration" in r]
    assert [w["plan_iteration"] for w in windows][:ITERS] == list(range(ITERS))
    plan = DispatchPlan.load(str(asp0["dir"] / "plan.parquet"))
    seen: List[str] = []
    for w in windows[:ITERS]:
        planned = [[str(p) for p in plan.instance_queue(w["plan_iteration"], j)] for j in range(len(w["queues"]))]
        assert w["queues"] == planned
        ids = [p for q in w["queues"] for p in q]
        assert len(ids) == GBS
        seen += ids
    assert len(seen) == len(set(seen)), "a prompt was trained twice"


def test_streaming_updates_train_each_group_once_within_the_lag_bound(streaming: Dict[str, Any]) -> None:
    audit = streaming["audit"]
    assert len(audit) == ITERS
    trained: List[str] = []
    for k, rec in enumerate(audit):
        assert len(rec["group_ids"]) == GBS, "each update trains exactly global_batch_size groups"
        assert len(rec["lags"]) == GBS * N
        assert max(rec["lags"]) <= 1 and min(rec["lags"]) >= 0
        assert rec["train_version"] == k and rec["new_version"] == k + 1, "versions advance by one per update"
        assert rec["sync"]["asp/sync_readback"] > 0, "the instances' weights were not read back"
        assert rec["sync"]["asp/sync_bytes"] > 0
        trained += rec["group_ids"]
    assert len(trained) == len(set(trained)), "a group was trained twice"


def test_streaming_log_line_has_msrl_and_asp_names(streaming: Dict[str, Any]) -> None:
    its = streaming["iterations"]
    assert [r["iteration"] for r in its] == list(range(1, ITERS + 1))
    for rec in its:
        missing = [k for k in MSRL_NAMES + ASP_NAMES if k not in rec]
        assert not missing, f"{streaming['mode']} iteration {rec['iteration']} lacks {missing}"
    assert [r["asp/policy_version"] for r in its] == [1.0, 2.0, 3.0]


def test_importance_weights_are_one_at_lag_zero_and_not_at_lag_one(streaming: Dict[str, Any]) -> None:
    its, audit = streaming["iterations"], streaming["audit"]
    by_lag = {0: [], 1: []}
    for rec, aud in zip(its, audit):
        lags = set(aud["lags"])
        if lags == {0}:
            by_lag[0].append(rec)
        elif lags == {1}:
            by_lag[1].append(rec)
    assert by_lag[0] and by_lag[1], f"expected updates at lag 0 and lag 1, audit lags {[a['lags'] for a in audit]}"
    for rec in by_lag[0]:
        assert rec["asp/iw_mean"] == 1.0 and rec["asp/iw_max"] == 1.0 and rec["asp/behav_prox_absdiff_max"] == 0.0
    assert any(r["asp/behav_prox_absdiff_mean"] > 0.0 and r["asp/iw_max"] != 1.0 for r in by_lag[1])


RESUME_ITERS, SAVED_AT = 4, 2


@pytest.mark.timeout(1800)  # two runs of the tier (each up to the 600 s a run is given)
def test_asp_run_resumes_from_msrl_checkpoint_with_asps_state(workdir: Path) -> None:
    """Pre-empted after the checkpoint of iteration 2 (asp, max_lag 1, 2 instances), then restarted from it: the
    finished groups ASP saved beside the checkpoint are trained as they were generated, only the unfinished
    ones are generated again, versions continue, the plan cursor continues (every planned prompt trained once,
    none lost), and no group is trained twice across the restart."""
    from mindspeed_asp.integrations.mindspeed_rl.resume_state import read_state
    from mindspeed_asp.scheduler.plan_file import DispatchPlan
    common = dict(iters=RESUME_ITERS, tag="resume")
    first = run_mode(workdir, "asp1", extra=["--save-interval", str(SAVED_AT), "--stop-after-save", str(SAVED_AT)],
                     **common)
    assert "stopped after the checkpoint of iteration 2" in first["log"]
    state = read_state(first["dir"] / "ckpt", SAVED_AT, {"mode": "asp", "max_lag": 1, "instances": 2, "gbs": GBS,
                                                           "n": N})
    saved = [r for r in first["audit"] if r["iteration"] <= SAVED_AT]  # what the checkpoint holds
    assert [r["new_version"] for r in saved] == [1, 2] and state["policy_version"] == 2
    assert sorted(int(g) for r in saved for g in r["group_ids"]) == sorted(state["trained_gids"])
    kept = {r["request"]["group_id"] for r in state["ready"]} | {r["request"]["group_id"] for r in state["unfinished"]}
    assert len(kept) == (1 + 1) * GBS  # max_lag + 1 windows are fed ahead of the updates

    second = run_mode(workdir, "asp1", extra=["--save-interval", str(SAVED_AT), "--resume"],
                      audit_name="asp_audit_resume.jsonl", log_name="asp1-resume-2", **common)
    assert f"asp: resumed at iteration {SAVED_AT}, policy version {SAVED_AT}" in second["log"]
    its, audit = second["iterations"], second["audit"]
    assert [r["iteration"] for r in its] == [3, 4]
    assert [r["asp/policy_version"] for r in its] == [3.0, 4.0]
    assert [(r["train_version"], r["new_version"]) for r in audit] == [(2, 3), (3, 4)], "versions continue"
    assert all(0 <= lag <= 1 for r in audit for lag in r["lags"])
    after = {g: (r["min_versions"][k], r["prompt_ids"][k]) for r in audit for k, g in enumerate(r["group_ids"])}
    for group in state["ready"]:  # trained as saved: same versions, not generated again
        gid = group["request"]["group_id"]
        assert after[gid][0] == min(s["min_version"] for s in group["result"]["samples"])
    # the saved groups are the ones trained after the restart (the admission bound keeps newer windows back)
    assert set(after) == kept, "a saved group was lost, or a group was fed again"
    trained = [g for r in saved for g in r["group_ids"]] + [g for r in audit for g in r["group_ids"]]
    assert len(trained) == len(set(trained)) == RESUME_ITERS * GBS, "a group trained twice or lost"
    # the plan cursor continued: group g holds the g-th prompt in plan order (windows are fed in plan order and
    # group ids count on across the restart), so no window was fed twice or skipped
    plan = DispatchPlan.load(str(first["dir"] / "plan.parquet"))
    order = [str(p) for it in range(plan.num_iterations) for j in range(2) for p in plan.instance_queue(it, j)]
    for r in saved + audit:
        assert [order[int(g)] for g in r["group_ids"]] == [str(p) for p in r["prompt_ids"]]


def test_first_run_report_passes_on_a_cpu_run(streaming: Dict[str, Any]) -> None:
    """shell/ascend_first_run.sh's table, on this tier's real run: start-up timings, the weight groups, the
    syncs' bandwidth, the functional probe, lag-0 engine vs Megatron log-probs, patches live in every Megatron
    worker. (Device memory does not apply on a CPU; the bandwidth bound is a cluster's, not a CPU's.)"""
    from mindspeed_asp.integrations.mindspeed_rl import first_run_report as fr
    rows = {r.check: r for r in fr.evaluate(streaming["log"], streaming["iterations"], streaming["audit"],
                                            fr.Bounds(trainer_ranks=1, min_sync_gbps=0.0))}
    failed = {k: r for k, r in rows.items() if r.status not in (fr.PASS, fr.NA)}
    assert not failed, fr.render(list(rows.values()))
    assert rows["trainer peak memory (export + update)"].status == fr.NA
    assert rows["functional weight probe"].status == fr.PASS


@pytest.mark.timeout(900)
def test_a_killed_rollout_instance_ends_the_run_fast_and_names_it(workdir: Path) -> None:
    """asp, max_lag 1, 2 instances: after the first update, instance 1's only TP rank is SIGKILLed (as an OOM
    kill or a device fault would). The run must stop with ASP's RunError naming the instance, its rank and
    Ray's cause, well before the 600 s asp.sync_timeout_s a broadcast to the dead rank would wait."""
    run = run_mode(workdir, "asp1", iters=4, tag="kill", extra=["--kill-instance-after", "1"], expect_fail=True)
    killed = json.loads((run["dir"] / "killed.json").read_text())
    assert killed["actor"] == "asp_rollout_1_0"
    took = run["ended"] - killed["time"]
    assert took < 180, f"the run took {took:.0f} s to end after the kill"
    log = run["log"]
    assert "rollout instance 1 died" in log and "asp_rollout_1_0" in log, log[-4000:]
    assert "RunError" in log and "resume from the last checkpoint" in log
    assert "WeightSyncTimeout" not in log
