"""Rollout instances on another node than the train task: a two-node Ray cluster on one machine.

Node A (the driver's) has no NPUs; node B holds them, as a 32B run's rollout devices sit on a node other than
the train task's. An instance's TP world must rendezvous on node B, at an address and port probed there.
"""
import pytest

pytest.importorskip("ray", reason="needs the runtime extra: pip install mindspeed-asp[runtime]")

from mindspeed_asp.integrations.mindspeed_rl.async_trainer import instance_placement
from mindspeed_asp.integrations.mindspeed_rl.rollout_worker import instance_env


@pytest.fixture(scope="module")
def two_nodes(no_ray_held):
    import ray
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"train_node": 1}})
    node_b = cluster.add_node(num_cpus=2, resources={"NPU": 2, "rollout_node": 1})
    ray.init(address=cluster.address, include_dashboard=False)
    try:
        yield {"head": cluster.head_node.node_id, "rollout": node_b.node_id}
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_instance_rendezvous_is_on_the_node_that_holds_it(two_nodes):
    import ray
    from ray.util.placement_group import placement_group_table
    place = instance_placement(tp=2)
    bundles = placement_group_table(place.pg)["bundles_to_node_id"]
    assert set(bundles.values()) == {two_nodes["rollout"]}, "both TP ranks on the NPU node"
    assert place.node_id == two_nodes["rollout"] != ray.get_runtime_context().get_node_id()
    assert 0 < place.port < 65536
    env = [instance_env(0, r, 2, place.addr, place.port) for r in range(2)]
    assert {e["MASTER_ADDR"] for e in env} == {place.addr} and {e["MASTER_PORT"] for e in env} == {str(place.port)}
    assert [e["RANK"] for e in env] == ["0", "1"] and {e["WORLD_SIZE"] for e in env} == {"2"}
    ray.util.remove_placement_group(place.pg)
