"""Start and stop a local Ray for the runtime, sized for small hosts.

Why: Ray 2.60 has no local mode, so tests, the demo and `asp train` start a real local Ray. On a 2-core
host the logical CPU count is oversubscribed (actors need a CPU to be scheduled, and collectives need
every participant alive at once), the dashboard is off, the object store is small, and every actor gets
one compute thread (OMP/MKL/torch) so N instances and a trainer do not fight over the cores.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

from mindspeed_asp.runtime.platform import Platform, current_platform

#: Environment every runtime actor gets (vLLM CPU: no core pinning, 1 GiB KV, in-process engine core).
ONE_THREAD_ENV: Dict[str, str] = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
VLLM_CPU_ENV: Dict[str, str] = {
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
    "GLOO_SOCKET_IFNAME": "lo",
    "MASTER_ADDR": "127.0.0.1",
}


def actor_env(platform: Optional[Platform] = None, threads: int = 1) -> Dict[str, str]:
    """Environment variables for runtime actors on `platform` (one compute thread by default)."""
    platform = platform or current_platform()
    env = {k: str(threads) if k.endswith("_THREADS") else v for k, v in ONE_THREAD_ENV.items()}
    env["ASP_PLATFORM"] = platform.kind
    if platform.kind == "cpu":
        env.update(VLLM_CPU_ENV)
    else:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env["VLLM_NO_USAGE_STATS"] = "1"
    return env


def start_local_ray(num_cpus: int = 8, object_store_mb: int = 512, platform: Optional[Platform] = None,
                    env: Optional[Dict[str, str]] = None, **init_kwargs: Any) -> Dict[str, Any]:
    """Start (or reuse, if this process already has one) a local Ray; returns `ray.init`'s context info.

    `num_cpus` is a logical count, deliberately larger than the real cores on small hosts. Accelerators
    are left to Ray's own detection on GPU/NPU hosts.
    """
    import ray

    if ray.is_initialized():
        return {"reused": True, "address": ray.get_runtime_context().gcs_address}
    os.environ.pop("RAY_ADDRESS", None)  # never attach to someone else's cluster by accident
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    env_vars = dict(actor_env(platform))
    env_vars.update(env or {})
    kwargs: Dict[str, Any] = dict(
        num_cpus=num_cpus,
        include_dashboard=False,
        object_store_memory=object_store_mb << 20,
        runtime_env={"env_vars": env_vars},
        log_to_driver=True,
        _node_ip_address="127.0.0.1",
    )
    kwargs.update(init_kwargs)
    ctx = ray.init(**kwargs)
    return {"reused": False, "address": getattr(ctx, "address_info", {}).get("gcs_address")}


def stop_local_ray() -> None:
    """Shut down the Ray this process started (Ray stops only the processes it started)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
