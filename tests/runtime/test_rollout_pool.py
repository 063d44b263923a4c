"""The rollout pool on a two-node Ray cluster on one machine (ray.cluster_utils.Cluster), plus its config seams.

The pool's own code runs for real (placement group, `create_instance`, start, submit/poll, death handling,
shutdown); the engine is a light stand-in actor with the instance's API, so no vLLM starts here. The run of
the real driver and real vLLM instances on such a cluster is in tests/runtime/test_e2e_multinode.py (slow).
"""
from __future__ import annotations

import os
import pickle
import sys
import time

import pytest

from mindspeed_asp.errors import ConfigError, RunError
from mindspeed_asp.runtime.platform import platform_from_name
from mindspeed_asp.runtime.rollout_pool import RolloutPool, instance_bundle
from mindspeed_asp.runtime.run_config import load_run_config, packaged_config_path
from mindspeed_asp.runtime.requests import EngineConfig, GroupRequest, GroupResult, RequestId, SampleResult

CPU = platform_from_name("cpu")


# ---------------------------------------------------------------------------- no Ray
def test_request_id_is_typed_and_survives_pickling():
    req = GroupRequest(group_id=RequestId(7, 2), prompt_id="p7", prompt_token_ids=[1, 2], n=2, max_new_tokens=4)
    back = pickle.loads(pickle.dumps(req))  # what Ray does to a submit's arguments
    assert back.group_id == RequestId(gid=7, attempt=2) and back.group_id.gid == 7 and back.group_id.attempt == 2
    assert RequestId(7) == RequestId(7, 0) != RequestId(7, 1)  # a re-dispatch is another request of one group
    assert len({RequestId(7, 0), RequestId(7, 1), RequestId(7, 0)}) == 2


def test_instance_bundle_holds_the_instance_resources():
    assert instance_bundle(CPU, 1) == {"CPU": 1.0}
    assert instance_bundle(platform_from_name("cuda"), 2) == {"CPU": 1.0, "GPU": 2.0}
    npu = platform_from_name("npu")
    assert instance_bundle(npu, 1) == {"CPU": 1.0, npu.ray_resource: 1.0}


def test_ray_address_config_and_flag():
    from mindspeed_asp.commands.train import build_config

    assert load_run_config(packaged_config_path()).run.ray_address is None  # the local Ray stays the default
    cfg = build_config(None, [], ray_address="10.0.0.5:6379")
    assert cfg.run.ray_address == "10.0.0.5:6379"
    # this host's CPU-slot and ray_num_cpus limits bind only a local Ray; a cluster is checked by placement
    with pytest.raises(ConfigError, match="asp.instances"):
        build_config(None, ["asp.instances=12"])
    assert build_config(None, ["asp.instances=12"], ray_address="auto").asp.instances == 12
    with pytest.raises(ConfigError, match="run.ray_address"):
        build_config(None, ["run.ray_address=''"])


def test_train_parser_takes_ray_address():
    from mindspeed_asp.cli import build_parser

    args = build_parser().parse_args(["train", "--ray-address", "auto", "--quiet"])
    assert args.ray_address == "auto"
    assert build_parser().parse_args(["train"]).ray_address is None


# ---------------------------------------------------------------------------- a two-node cluster
class FakeInstance:
    """The instance actor's API without an engine: every submitted group finishes at the next drain."""

    def __init__(self, index, config, platform_kind=None):
        self.index = index
        self.pending = []
        self.drains = 0

    def start(self):
        import ray

        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(), "start_seconds": 0.01}

    def submit(self, groups, stolen=False):
        self.pending.extend(groups)
        return len(self.pending)

    def drain_finished(self):
        self.drains += 1
        out = [GroupResult(group_id=g.group_id, prompt_id=g.prompt_id, instance=self.index,
                           samples=[SampleResult([5], [-0.1], 0, 0, "stop")], prompt_token_ids=g.prompt_token_ids,
                           t_enqueued=0.0, t_started=0.0, t_finished=0.0) for g in self.pending]
        self.pending = []
        return out

    def status(self):
        return {"steps": self.drains}

    def shutdown(self):
        return None


@pytest.fixture(scope="module")
def cluster(no_ray_held):
    """Head and one worker node, 2 CPUs each: two 1-CPU instances would fit on either node alone, so only
    the pool's SPREAD placement puts them on both."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test file
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    worker = c.add_node(num_cpus=2)
    c.wait_for_nodes()
    try:
        yield {"cluster": c, "nodes": {c.head_node.node_id, worker.node_id}}
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()


def _pool(events, deaths, count=2):
    return RolloutPool(EngineConfig(model_path="unused"), count, CPU, start_timeout_s=60, multi_node=True,
                       on_death=lambda j, exc: deaths.append(j), event=lambda kind, **f: events.append((kind, f)),
                       actor_cls=__import__("ray").remote(FakeInstance))


def _requests(gids, attempt=0):
    return [GroupRequest(group_id=RequestId(g, attempt), prompt_id=f"p{g}", prompt_token_ids=[3, 4], n=1,
                         max_new_tokens=2) for g in gids]


def test_pool_spreads_instances_over_both_nodes_and_survives_a_death(cluster):
    import ray
    from ray.util.placement_group import placement_group_table

    from mindspeed_asp.runtime.ray_utils import RaySession

    session = RaySession(cluster["cluster"].address)
    session.open()
    assert session.owned == "connection"
    events, deaths = [], []
    pool = _pool(events, deaths)
    try:
        pool.start()
        assert set(pool.nodes) == cluster["nodes"], "one instance on each node"
        table = placement_group_table(pool.placement)
        assert table["strategy"] == "SPREAD" and set(table["bundles_to_node_id"].values()) == cluster["nodes"]
        assert [f["node"] for k, f in events if k == "instance_started"] == pool.nodes
        assert pool.sync_address() == ray.util.get_node_ip_address()  # not loopback on a cluster

        assert pool.submit(0, _requests([0, 2])) and pool.submit(1, _requests([1]))
        got = pool.poll()
        assert sorted((j, r.group_id) for j, r in got) == [(0, RequestId(0)), (0, RequestId(2)), (1, RequestId(1))]

        ray.kill(pool.handles[1], no_restart=True)
        time.sleep(0.5)
        assert pool.submit(1, _requests([3])) is False  # the failed call marks it dead, once
        assert pool.poll() == [] and deaths == [1] and pool.live() == [0] and pool.alive == [True, False]
        assert pool.submit(0, _requests([3], attempt=1))
        assert [(j, r.group_id) for j, r in pool.poll()] == [(0, RequestId(3, 1))]
        assert pool.decode_steps() == {0: 3}
        with pytest.raises(RunError, match="every rollout instance died"):
            pool.mark_dead(0, RuntimeError("gone"))
        assert deaths == [1]  # the last death is an error, not a re-dispatch
    finally:
        pool.shutdown()
        session.close()
    assert not ray.is_initialized() and session.owned is None
    # the run only disconnected: the cluster and both its nodes are still there for others
    ray.init(address=cluster["cluster"].address)
    try:
        assert sum(1 for n in ray.nodes() if n["Alive"]) == 2
        assert placement_group_table() == {} or all(
            pg["state"] == "REMOVED" for pg in placement_group_table().values())
    finally:
        ray.shutdown()


def test_pool_refuses_more_instances_than_the_cluster_holds(cluster):
    import ray

    ray.init(address=cluster["cluster"].address)
    pool = RolloutPool(EngineConfig(model_path="unused"), 5, CPU, start_timeout_s=3, multi_node=True,
                       actor_cls=ray.remote(FakeInstance))
    try:
        with pytest.raises(RunError, match="asp.instances=5"):
            pool.start()
        assert pool.handles == []
    finally:
        pool.shutdown()
        ray.shutdown()
