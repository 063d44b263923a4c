"""Session fixtures: one tiny model for the whole session, and a local Ray for the tests that ask for one.

- `tiny_model`: the tiny Qwen2 (seed 0, default shape) built once in the session's temporary directory.
- `local_ray`: a plain local Ray (the CPU tier's: 8 logical CPUs, 256 MB object store), opt-in per module.
  It is started when first asked for and kept for the next module that asks, so the session starts one Ray
  instead of one per file; it stops at the end of the session.
- `no_ray_held`: for the tests that start their own Ray or a two-node cluster (`ray.cluster_utils.Cluster`,
  a Ray with a runtime environment of their own): any Ray this process holds is shut down before they
  start. The next module that asks for `local_ray` starts a fresh one.
- `ray_holder`: the object behind both, for a module that needs other settings (the GPU tier's platform);
  a Ray with other settings than the one held is stopped and started again with the new ones.

torch and Ray are imported inside the fixtures only: a core-only install (neither) still collects every file.
"""
from __future__ import annotations

import sys
from typing import Any, Dict, Iterator, Optional

import pytest


class RayHolder:
    """The Ray this test process holds: started on demand, restarted when other settings are asked for."""

    def __init__(self) -> None:
        self.settings: Optional[Dict[str, Any]] = None
        self.address: Optional[str] = None
        self.node_id: Optional[str] = None  # new on every start, unlike the address (the port is reused)

    def ensure(self, num_cpus: int = 8, object_store_mb: int = 256, platform: Optional[str] = None) -> str:
        """A local Ray with these settings (the held one when it matches); returns its GCS address.

        The defaults are the CPU tier's plain Ray: oversubscribed logical CPUs (see
        mindspeed_asp/runtime/ray_utils.py) and a small object store.

        `platform` None is this host's platform (as `start_local_ray` resolves it), so asking for it by
        name or not gives the same Ray.
        """
        ray = pytest.importorskip("ray")
        from mindspeed_asp.runtime.platform import current_platform, platform_from_name
        from mindspeed_asp.runtime.ray_utils import start_local_ray

        plat = platform_from_name(platform) if platform else current_platform()
        settings = {"num_cpus": num_cpus, "object_store_mb": object_store_mb, "platform": plat.kind}
        if self.held() and settings == self.settings:
            return str(self.address)
        self.release()
        start_local_ray(num_cpus=num_cpus, object_store_mb=object_store_mb, platform=plat)
        context = ray.get_runtime_context()
        self.settings, self.address, self.node_id = settings, str(context.gcs_address), context.get_node_id()
        return self.address

    def held(self) -> bool:
        """Whether the Ray this process is connected to is the one `ensure` started (a test may have
        shut it down, or connected elsewhere)."""
        ray = sys.modules.get("ray")
        if ray is None or self.node_id is None or not ray.is_initialized():
            return False
        return ray.get_runtime_context().get_node_id() == self.node_id

    def release(self) -> None:
        """Shut down any Ray this process holds, ours or one a test left connected."""
        ray = sys.modules.get("ray")  # never imported: nothing to shut down
        if ray is not None and ray.is_initialized():
            ray.shutdown()
        self.settings = self.address = self.node_id = None


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """The tiny random Qwen2 (seed 0, default shape), one directory for the session; tests only read it."""
    pytest.importorskip("torch", reason="needs the runtime extra: pip install mindspeed-asp[runtime]")
    pytest.importorskip("transformers", reason="needs the runtime extra: pip install mindspeed-asp[runtime]")
    from mindspeed_asp.runtime.tiny_model import ensure_tiny_model

    return ensure_tiny_model(str(tmp_path_factory.mktemp("tiny") / "tiny-qwen2"), seed=0)


@pytest.fixture(scope="session")
def ray_holder() -> Iterator[RayHolder]:
    holder = RayHolder()
    yield holder
    holder.release()


@pytest.fixture(scope="module")
def local_ray(ray_holder: RayHolder) -> str:
    """A plain local Ray for this module (the held one when it is already up); returns its GCS address."""
    return ray_holder.ensure()


@pytest.fixture(scope="module")
def no_ray_held(ray_holder: RayHolder) -> None:
    """This module starts its own Ray or cluster: whatever Ray the process holds is shut down first."""
    ray_holder.release()
