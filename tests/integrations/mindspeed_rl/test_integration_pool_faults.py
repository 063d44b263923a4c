"""Faults of the MindSpeed-RL rollout pool, on a real local Ray: what ends the run, how fast, and what it says.

- A dead instance (any TP rank) ends the run at the trainer's next call with a RunError naming the instance,
  its TP ranks and the cause; an instance that dies while idle is found before a sync's broadcast starts.
- Under `stale_policy: drop` a dropped group shrinks the supply; the trainer feeds a window instead of
  waiting for groups that no longer exist, and says so when the loader has nothing left.
- Placement groups, engine construction and the weight group's port each have their own bounded wait, and
  a port taken between the probe and the bind is probed again.

The rank actors are stand-ins where an engine's behaviour is the point (a step call that never returns, as a
rank waiting in a collective for a dead peer does; a constructor that binds the rendezvous port as vLLM's
does); the driver, the start-up and the weight group are the real code over real Ray and gloo.
"""
from __future__ import annotations

import socket
import sys
import time
import types

import pytest

ray = pytest.importorskip("ray", reason="needs the runtime extra: pip install mindspeed-asp[runtime]")
torch = pytest.importorskip("torch", reason="needs the runtime extra: pip install mindspeed-asp[runtime]")

from mindspeed_asp.errors import RunError, WeightSyncError  # noqa: E402
from mindspeed_asp.runtime.requests import GroupRequest, GroupResult, SampleResult  # noqa: E402

NPUS = 3  # logical NPUs of this module's Ray


@pytest.fixture(scope="module")
def npu_ray(no_ray_held):
    ray.init(num_cpus=8, resources={"NPU": NPUS}, include_dashboard=False,
             runtime_env={"env_vars": {"ASP_PLATFORM": "cpu"}})
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test file
    try:
        yield
    finally:
        ray.shutdown()


class FakeRank:
    """A TP-rank actor: `run` finishes every new group at once (or never returns: `hang`)."""

    def __init__(self, instance: int, hang: bool = False) -> None:
        self.instance, self.hang = instance, hang

    def ready(self):
        return {"instance": self.instance}

    def run(self, jobs, steps):
        if self.hang:
            time.sleep(3600)
        now = time.time()
        return [GroupResult(req.group_id, req.prompt_id, self.instance,
                            [SampleResult([5, 6], [-0.5, -0.5], v, v, "stop") for _ in range(req.n)],
                            list(req.prompt_token_ids), now, now, now) for req, v in jobs]


def _labels(shape):
    return [[f"asp_rollout_{j}_{r}" for r in range(tp)] for j, tp in enumerate(shape)]


def _wait(pred, timeout=30.0):
    deadline = time.time() + timeout
    while not pred() and time.time() < deadline:
        time.sleep(0.05)
    return pred()


# ------------------------------------------------------------------------------------------ instance death
def test_a_dead_tp_rank_ends_the_run_at_the_next_call_naming_the_instance(npu_ray):
    """Instance 1 has two TP ranks; rank 0 waits in a collective (its step call never returns) while rank 1
    dies. The driver must see rank 1's failure (waiting on rank 0's call alone, the death would go
    unseen until the sync's pause timed out)."""
    from mindspeed_asp.integrations.mindspeed_rl.lockstep_rollout import LockstepRollout
    ranks = [[ray.remote(num_cpus=0)(FakeRank).remote(0, hang=True)],
             [ray.remote(num_cpus=0)(FakeRank).remote(1, hang=True) for _ in range(2)]]
    driver = LockstepRollout(ranks, "async", 1, 2, 2, 2, 4, False, labels=_labels([1, 2]))
    try:
        driver.load_window([GroupRequest(str(g), f"p{g}", [2, 3], 2, 4) for g in range(4)], {})
        assert _wait(lambda: 1 in driver.outstanding), "no step call issued to instance 1"
        t0 = time.time()
        ray.kill(ranks[1][1], no_restart=True)
        assert _wait(lambda: bool(driver.deaths), timeout=20), "the death of instance 1's rank 1 went unseen"
        with pytest.raises(RunError) as err:
            driver.next_minibatch(0, timeout=20)
        assert time.time() - t0 < 20
        msg = str(err.value)
        assert "rollout instance 1 died" in msg and "TP ranks: asp_rollout_1_0, asp_rollout_1_1" in msg
        assert "failed: asp_rollout_1_1" in msg and "Actor" in msg  # Ray's ActorDiedError, the cause
        with pytest.raises(RunError, match="rollout instance 1 died"):
            driver.pause(timeout=5)  # the sync never starts its broadcast
        issued = dict(driver.outstanding)
        time.sleep(0.3)
        assert dict(driver.outstanding) == issued, "calls were issued after the death"
    finally:
        driver.stop()
        for rs in ranks:
            for r in rs:
                ray.kill(r, no_restart=True)


def test_an_instance_that_died_idle_is_found_before_the_broadcast(npu_ray):
    from mindspeed_asp.integrations.mindspeed_rl.lockstep_rollout import LockstepRollout
    ranks = [[ray.remote(num_cpus=0)(FakeRank).remote(j)] for j in range(2)]
    driver = LockstepRollout(ranks, "async", 1, 2, 2, 2, 4, False, labels=_labels([1, 1]))
    try:
        assert driver.check_alive(10) is True
        ray.kill(ranks[0][0], no_restart=True)
        assert driver.pause(timeout=5) is True  # nothing was outstanding: the step loop saw nothing
        t0 = time.time()
        with pytest.raises(RunError) as err:
            driver.check_alive(10)
        assert time.time() - t0 < 10
        assert "rollout instance 0 died (TP ranks: asp_rollout_0_0" in str(err.value)
    finally:
        driver.stop()
        for rs in ranks:
            ray.kill(rs[0], no_restart=True)


# -------------------------------------------------------------------------------- stale_policy: drop supply
def _fit(driver):
    from mindspeed_asp.integrations.mindspeed_rl.async_trainer import AsyncFit
    fit = AsyncFit.__new__(AsyncFit)
    fit.topo = types.SimpleNamespace(gbs=2, n=2, max_tokens=4)
    fit.asp = types.SimpleNamespace(mode="async", stale_policy="drop")
    fit.sampling, fit.extra, fit.driver = {}, {}, driver
    fit.version = fit.next_gid = fit.windows_fed = 0
    return fit


def test_dropped_groups_make_the_trainer_feed_a_window_instead_of_waiting(npu_ray):
    """Both groups of the only window fed go stale (the trainer's version moved two past theirs, max_lag 1)
    and are dropped: the update must not wait for them (86 400 s) but feed the next window and train it."""
    from mindspeed_asp.integrations.mindspeed_rl.lockstep_rollout import LockstepRollout
    rank = ray.remote(num_cpus=0)(FakeRank).remote(0)
    driver = ray.remote(num_cpus=0, max_concurrency=8)(LockstepRollout).remote(
        [[rank]], "async", 1, 2, 2, 2, 4, False, "drop")
    windows = iter([{"prompts": [torch.tensor([2, 3]), torch.tensor([4, 5])]} for _ in range(2)])
    fit = _fit(driver)
    try:
        assert fit.feed_window(windows)
        assert _wait(lambda: ray.get(driver.stats.remote())["counters"]["queue/received"] == 2)
        fit.version = 2
        ray.get(driver.set_version.remote(2))
        t0 = time.time()
        got = fit.take_trainable(windows)
        assert time.time() - t0 < 20
        assert sorted(int(g.group_id) for g in got["groups"]) == [2, 3]  # the window fed on demand
        assert got["lags"] == [0] * 4 and got["counters"]["queue/dropped_stale"] == 2 and fit.windows_fed == 2
        fit.version = 4  # and once more, with the loader exhausted: a named error, not a wait
        ray.get(driver.set_version.remote(4))
        more = iter([])
        with pytest.raises(RunError, match=r"pool holds 0 groups, an update needs 2, and the loader has no batch"):
            fit.take_trainable(more)
        # without the trainer's M (feed_below 0) the driver keeps its old contract: it waits
        with pytest.raises(Exception, match="no trainable minibatch"):
            ray.get(driver.next_minibatch.remote(4, 0.5))
    finally:
        ray.get(driver.stop.remote())
        ray.kill(rank, no_restart=True)


# -------------------------------------------------------------------------------------------- placement
def test_placement_wait_is_bounded_names_what_is_missing_and_removes_the_group(npu_ray):
    from ray.util.placement_group import placement_group_table
    from mindspeed_asp.integrations.mindspeed_rl.async_trainer import instance_placement
    before = set(placement_group_table())
    t0 = time.time()
    with pytest.raises(RunError) as err:
        instance_placement(NPUS + 1, timeout_s=2, instance=3)
    assert time.time() - t0 < 15
    msg = str(err.value)
    assert f"placement group for instance 3 needs {NPUS + 1} NPU, the cluster has {NPUS} free" in msg
    assert "within 2 s" in msg
    new = [v for k, v in placement_group_table().items() if k not in before]
    assert new and all(v["state"] == "REMOVED" for v in new), new
    # enough NPUs in total but not on one node is said as such (pure: the cluster's free resources)
    from mindspeed_asp.integrations.mindspeed_rl.async_trainer import placement_shortfall
    text = placement_shortfall([{"NPU": 1}] * 2, {"NPU": 4.0}, "placement group for instance 0")
    assert "on one node" in text and "4 NPU" in text


# ------------------------------------------------------------------------------------- engine start-up
class FakeEngine:
    """What RolloutWorker needs of an engine object, built the way start-up matters here."""

    held = []

    def __init__(self, mode: str) -> None:
        import os
        if mode == "bind":  # vLLM's TP world: rank 0 hosts its store at MASTER_PORT
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("", int(os.environ["MASTER_PORT"])))
            s.listen()
            FakeEngine.held.append(s)
        elif mode == "broken":
            raise ValueError("model path /no/such/model has no config.json")
        elif mode == "slow":
            time.sleep(120)
        self.llm_engine = None


def _spawn(modes):
    from mindspeed_asp.integrations.mindspeed_rl.async_trainer import rank_actor_name
    from mindspeed_asp.integrations.mindspeed_rl.rollout_worker import RolloutWorker, instance_env
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    cls = ray.remote(resources={"NPU": 1}, num_cpus=0)(RolloutWorker)
    made = []

    def spawn(j, place):
        mode = modes[j]
        env = instance_env(j, 0, 1, place.addr, place.port)
        w = cls.options(runtime_env={"env_vars": env}, name=rank_actor_name(j, 0),
                        scheduling_strategy=PlacementGroupSchedulingStrategy(
                            placement_group=place.pg, placement_group_bundle_index=0)).remote(
            j, 0, 2, {}, lambda m=mode: FakeEngine(m))
        made.append((j, place.port, w))
        return [w]
    return spawn, made


def _cleanup(made, places):
    from ray.util.placement_group import remove_placement_group
    from mindspeed_asp.integrations.mindspeed_rl.async_trainer import rank_actor_name, wait_names_free
    for _, _, w in made:
        ray.kill(w, no_restart=True)
    for p in places:
        remove_placement_group(p.pg)
    wait_names_free([rank_actor_name(j, 0) for j, _, _ in made])


def _placer(places, taken=None):
    from mindspeed_asp.integrations.mindspeed_rl.async_trainer import InstancePlacement, instance_placement

    def place(j):
        p = instance_placement(1, 30, instance=j, bundle={"NPU": 1})
        if taken is not None and j == 0:  # the probed port, taken by another process before vLLM binds it
            p = InstancePlacement(p.pg, p.addr, taken, p.node_id)
        places.append(p)
        return p
    return place


def test_engines_have_their_own_deadline_and_a_taken_rendezvous_port_is_probed_again(npu_ray):
    from mindspeed_asp.integrations.mindspeed_rl.async_trainer import start_instances
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    places = []
    spawn, made = _spawn({0: "bind", 1: "ok"})
    try:
        workers, final = start_instances(2, 1, _placer(places, taken), spawn, timeout_s=120)
        assert [ray.get(w[0].ready.remote())["instance"] for w in workers] == [0, 1]
        tries = [port for j, port, _ in made if j == 0]
        assert tries[0] == taken and len(tries) == 2 and final[0].port == tries[1] != taken
    finally:
        holder.close()
        _cleanup(made, places)


def test_a_broken_or_slow_engine_start_is_named(npu_ray):
    from mindspeed_asp.integrations.mindspeed_rl.async_trainer import start_instances
    places = []
    spawn, made = _spawn({0: "ok", 1: "broken"})
    try:
        t0 = time.time()
        with pytest.raises(RunError) as err:
            start_instances(2, 1, _placer(places), spawn, timeout_s=120)
        assert time.time() - t0 < 60
        assert "rollout instance 1 failed to start (asp_rollout_1_0" in str(err.value)
        assert "no config.json" in str(err.value)
    finally:
        _cleanup(made, places)
    places = []
    spawn, made = _spawn({0: "ok", 1: "slow"})
    try:
        with pytest.raises(RunError) as err:
            start_instances(2, 1, _placer(places), spawn, timeout_s=3)
        msg = str(err.value)
        assert "rollout engines not built within 3 s (asp.engine_start_timeout_s): instance 1 (asp_rollout_1_0)" \
            in msg and "1 of 2 instances are ready" in msg
    finally:
        _cleanup(made, places)


# ------------------------------------------------------------------------------------------- weight group
class SenderRank:
    """The Megatron rank's part in forming a weight group: only what `__ray_call__` runs on it."""


def test_a_taken_weight_group_port_is_probed_again_before_any_receiver_is_told(npu_ray):
    from mindspeed_asp.integrations.mindspeed_rl.async_trainer import asp_sender_address, form_weight_group
    from mindspeed_asp.integrations.mindspeed_rl.rollout_worker import RolloutWorker
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("", 0))
    holder.listen()
    taken = holder.getsockname()[1]

    def first_port_taken(worker, taken=taken):
        calls = getattr(worker, "calls", 0)
        worker.calls = calls + 1
        host, port = asp_sender_address(worker)
        return (host, taken) if calls == 0 else (host, port)

    sender = ray.remote(num_cpus=0)(SenderRank).remote()
    receivers = [ray.remote(num_cpus=0)(RolloutWorker).remote(j, 0, 2, {}, lambda: FakeEngine("ok"))
                 for j in range(2)]
    try:
        host, port = form_weight_group(0, sender, receivers, "gloo", 30, address=first_port_taken)
        assert port != taken
        assert ray.get(sender.__ray_call__.remote(lambda w: (w.calls, w._asp_sender is not None))) == (2, True)
        assert all(ray.get([r.__ray_call__.remote(lambda w: w._receiver is not None) for r in receivers]))
        with pytest.raises(WeightSyncError, match="every port probed .* was taken"):
            form_weight_group(0, ray.remote(num_cpus=0)(SenderRank).remote(), receivers, "gloo", 30,
                              address=lambda w, taken=taken: (asp_sender_address(w)[0], taken), port_attempts=2)
    finally:
        holder.close()
        for a in [sender] + receivers:
            ray.kill(a, no_restart=True)
