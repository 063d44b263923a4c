"""The MindSpeed-RL rollout driver in front of a hung engine: the wait before a weight sync ends, and says which.

MindSpeed-RL's weight sync spans every engine rank, so an instance whose step call never returns cannot be
dropped there; what the run needs is a bounded wait and an error naming the instance. The rank actor here is
a stand-in whose `run` (the lockstep step call) never returns, as an engine stuck in a device call does; the
driver is the real one, on a real local Ray.
"""
from __future__ import annotations

import sys
import time

import pytest

pytestmark = pytest.mark.usefixtures("local_ray")


class HungRank:
    """A TP-rank actor whose step call never returns."""

    def run(self, jobs, steps):
        time.sleep(3600)


def test_pause_before_a_sync_ends_and_names_the_hung_instance():
    ray = pytest.importorskip("ray")
    from mindspeed_asp.integrations.mindspeed_rl.lockstep_rollout import LockstepRollout
    from mindspeed_asp.runtime.requests import GroupRequest

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test file
    rank = ray.remote(num_cpus=0)(HungRank).remote()
    driver = LockstepRollout([[rank]], "asp", 0, 1, 2, 2, 4, False)
    try:
        driver.load_window([GroupRequest("0", "p0", [2, 5, 6], 2, 8)], {0: 1.0}, [[0]])
        deadline = time.time() + 30
        while not driver.outstanding and time.time() < deadline:  # the loop issues the step call
            time.sleep(0.05)
        assert driver.outstanding, "the driver never issued the step call"
        t0 = time.time()
        with pytest.raises(TimeoutError) as err:
            driver.pause(timeout=1.0)
        assert time.time() - t0 < 10
        msg = str(err.value)
        assert "after 1 s" in msg and "instance 0 (1 TP ranks, call out for" in msg
        assert "asp.sync_timeout_s" in msg
    finally:
        driver.stop()
        ray.kill(rank, no_restart=True)
