"""Fault injection at random points: the driver of `asp train` SIGKILLed (no handler runs: an OOM kill, a node
lost) at points drawn from seeded RNGs, each part resumed with `asp train --resume`, until the run ends.

One run, killed three times (seeds 0, 1, 2: one kill point each). Each seed draws how many more updates the part
completes before its kill (at least one, so every part makes progress and has a checkpoint to resume) and a
delay within the next update, so kills land in training, in weight syncs, in checkpoint writes and between
them. Whatever the points, the run must end with every step in `metrics.jsonl` exactly once, versions 1..STEPS
once each, every trained group trained once, and no process of any part left behind.
"""
from __future__ import annotations

import json
import random
import time
import uuid

import pytest

pytest.importorskip("vllm")
pytest.importorskip("ray")
pytest.importorskip("psutil")

from processes import asp_process, assert_nothing_left, read_lines

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
STEPS = 10
SEEDS = (0, 1, 2)


def _kill_at(proc, out, after: int, delay: float, err) -> None:
    deadline = time.time() + 600
    while len(read_lines(out / "metrics.jsonl")) < after:
        assert proc.poll() is None, err.read_text()[-3000:]
        assert time.time() < deadline, "the run did not reach the kill point"
        time.sleep(0.05)
    time.sleep(delay)
    proc.kill()
    proc.wait(timeout=60)


@pytest.mark.timeout(1500)
def test_a_driver_killed_at_random_points_resumes_with_every_step_once(tmp_path):
    out = tmp_path / "run"
    args = ["train", "--quiet", "--out", str(out), f"model.path={tmp_path / 'model'}", "asp.instances=1",
            f"run.steps={STEPS}", "run.checkpoint_every=1", "run.plots=false"]
    points = []
    for part, seed in enumerate(SEEDS):
        rng = random.Random(seed)
        logged = len(read_lines(out / "metrics.jsonl"))
        after, delay = logged + rng.randint(1 if part else 2, 2), rng.uniform(0.0, 1.5)
        points.append((after, round(delay, 2)))
        tag = uuid.uuid4().hex
        proc = asp_process(args if part == 0 else ["train", "--quiet", "--resume", str(out)], tmp_path, tag,
                           tmp_path / f"p{part}")
        _kill_at(proc, out, after, delay, tmp_path / f"p{part}.err")
        assert_nothing_left(tag)

    tag = uuid.uuid4().hex
    proc = asp_process(["train", "--quiet", "--resume", str(out)], tmp_path, tag, tmp_path / "last")
    rc = proc.wait(timeout=900)
    err = (tmp_path / "last.err").read_text()
    assert rc == 0, f"kill points {points} (updates logged, delay s): the last resume failed:\n{err[-3000:]}"
    assert_nothing_left(tag)
    steps = read_lines(out / "metrics.jsonl")
    assert [s["step"] for s in steps] == list(range(STEPS)), f"kill points {points}"
    assert [s["version"] for s in steps] == list(range(1, STEPS + 1))
    summary = json.loads((out / "summary.json").read_text())
    trained = [g for s in steps for g in s["gids"]]
    assert len(trained) == len(set(trained)) == summary["trained_unique"] == summary["trained_groups"]
    assert summary["steps"] == STEPS and summary["interrupted"] is False
    assert len(summary["resumes"]) == len(SEEDS)
