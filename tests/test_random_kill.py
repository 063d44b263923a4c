"""Fault injection at random points: the driver of `asp train` SIGKILLed (no handler runs: an OOM kill, a node
lost) at a point drawn from a seeded RNG, then `asp train --resume` to the end.

Each seed draws how many updates the run completes before the kill (after the first checkpoint, so there is
one to resume from) and a delay within the next update, so kills land in training, in weight syncs, in
checkpoint writes and between them. Whatever the point, the resumed run must end with every step in
`metrics.jsonl` exactly once, versions 1..STEPS once each, every trained group trained once, and no process
of either part left behind.
"""
from __future__ import annotations

import json
import random
import time
import uuid

import pytest

from test_resume import _asp, _assert_nothing_left, _lines

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
STEPS = 8


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_driver_killed_at_a_random_point_resumes_with_every_step_once(tmp_path, seed):
    rng = random.Random(seed)
    after, delay = rng.randint(2, STEPS - 1), rng.uniform(0.0, 1.5)
    out = tmp_path / "run"
    tag = uuid.uuid4().hex
    proc = _asp(["train", "--quiet", "--out", str(out), f"model.path={tmp_path / 'model'}", "asp.instances=1",
                 f"run.steps={STEPS}", "run.checkpoint_every=1", "run.plots=false", f"run.seed={seed}"],
                tmp_path, tag, tmp_path / "p1")
    deadline = time.time() + 600
    while len(_lines(out / "metrics.jsonl")) < after:
        assert proc.poll() is None, (tmp_path / "p1.err").read_text()[-3000:]
        assert time.time() < deadline, "the run did not reach the kill point"
        time.sleep(0.05)
    time.sleep(delay)
    proc.kill()
    proc.wait(timeout=60)
    _assert_nothing_left(tag)
    before = len(_lines(out / "metrics.jsonl"))

    tag2 = uuid.uuid4().hex
    proc = _asp(["train", "--quiet", "--resume", str(out)], tmp_path, tag2, tmp_path / "p2")
    rc = proc.wait(timeout=900)
    err = (tmp_path / "p2.err").read_text()
    assert rc == 0, f"kill after {after} updates + {delay:.2f} s ({before} logged): resume failed:\n{err[-3000:]}"
    _assert_nothing_left(tag2)
    steps = _lines(out / "metrics.jsonl")
    assert [s["step"] for s in steps] == list(range(STEPS)), f"kill after {after} + {delay:.2f} s"
    assert [s["version"] for s in steps] == list(range(1, STEPS + 1))
    summary = json.loads((out / "summary.json").read_text())
    trained = [g for s in steps for g in s["gids"]]
    assert len(trained) == len(set(trained)) == summary["trained_unique"] == summary["trained_groups"]
    assert summary["steps"] == STEPS and summary["interrupted"] is False
