"""The session's Ray fixtures (tests/conftest.py): one local Ray reused across modules, a restart when other
settings are asked for, and nothing held after a release (what `no_ray_held` does before a module that
starts its own cluster; the next `local_ray` then starts a fresh one)."""
import pytest


def test_held_ray_is_reused_restarted_and_released(ray_holder):
    ray = pytest.importorskip("ray")
    address = ray_holder.ensure()
    node = ray_holder.node_id
    assert ray.is_initialized() and ray_holder.held()
    assert ray_holder.ensure() == address and ray_holder.node_id == node  # same settings: the same Ray

    ray_holder.ensure(num_cpus=4)  # other settings: stopped and started again with them
    assert ray_holder.held() and ray_holder.node_id != node and ray.cluster_resources()["CPU"] == 4

    ray.shutdown()  # a test shut it down behind the holder's back: not held, so `ensure` starts anew
    assert not ray_holder.held()
    ray_holder.release()
    assert not ray.is_initialized() and ray_holder.node_id is None
