"""The stall watch's verdicts and pacing (runtime/stall_watch.py), and the config keys that set it.

The watch on real vLLM instances, one with a hung engine step, is in tests/runtime/test_e2e_runtime.py.
"""
from __future__ import annotations

import pytest

from mindspeed_asp.errors import ConfigError
from mindspeed_asp.runtime.run_config import load_run_config, packaged_config_path
from mindspeed_asp.runtime.stall_watch import MAX_CHECK_EVERY_S, StallWatch


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def status(silent: float, running: int = 2, queued: int = 1) -> dict:
    return {"loop_silent_s": silent, "running_groups": running, "queued": queued}


def test_only_an_instance_silent_beyond_the_timeout_is_flagged():
    watch = StallWatch(30.0, clock=Clock())
    verdicts = watch.check({0: status(0.01), 1: status(31.0), 2: status(29.9)})
    assert [j for j, _ in verdicts] == [1]
    why = verdicts[0][1]
    assert "31 s" in why and "run.stall_timeout_s=30" in why and "2 groups running" in why


def test_a_status_call_that_fails_is_a_verdict_too():
    watch = StallWatch(30.0, clock=Clock())
    verdicts = watch.check({0: status(0.0), 3: TimeoutError("no answer in 60 s")})
    assert verdicts == [(3, "its status call failed (TimeoutError: no answer in 60 s)")]


def test_a_status_without_the_field_is_not_stalled():
    # an instance that does not report loop_silent_s (an older actor) is never declared hung by the watch
    assert StallWatch(1.0, clock=Clock()).check({0: {"running_groups": 5}}) == []


def test_checks_are_paced_by_the_timeout_and_capped():
    clock = Clock()
    watch = StallWatch(6.0, clock=clock)
    assert watch.every_s == 2.0 and watch.due()
    watch.check({})
    assert not watch.due()
    clock.t += 1.9
    assert not watch.due()
    clock.t += 0.2
    assert watch.due()
    assert StallWatch(600.0).every_s == MAX_CHECK_EVERY_S


def test_a_timeout_must_be_positive():
    with pytest.raises(ValueError, match="stall timeout"):
        StallWatch(0.0)


def test_the_packaged_config_sets_both_timeouts():
    cfg = load_run_config(packaged_config_path())
    assert cfg.run.stall_timeout_s == 300 and cfg.run.sync_timeout_s == 120
    assert cfg.run.stall_timeout_s < cfg.run.step_timeout_s


def test_a_stall_timeout_not_below_the_step_timeout_is_refused():
    with pytest.raises(ConfigError, match="run.stall_timeout_s") as err:
        load_run_config(packaged_config_path(), ["run.stall_timeout_s=600", "run.step_timeout_s=600"])
    assert "gives up before a hung instance is dropped" in str(err.value)
    with pytest.raises(ConfigError, match="run.sync_timeout_s"):
        load_run_config(packaged_config_path(), ["run.sync_timeout_s=0"])
