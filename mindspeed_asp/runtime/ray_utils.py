"""The Ray of a run: a local Ray sized for small hosts (the default), or an existing cluster (`run.ray_address`).

Why: Ray 2.60 has no local mode, so tests, the demo and `asp train` start a real local Ray. On a 2-core
host the logical CPU count is oversubscribed (actors need a CPU to be scheduled, and collectives need
every participant alive at once), the dashboard is off, the object store is small, and every actor gets
one compute thread (OMP/MKL/torch) so N instances and a trainer do not fight over the cores.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
from typing import Any, Callable, Dict, Mapping, Optional

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


#: Keys of VLLM_CPU_ENV that pin collectives to the loopback interface: right for a local Ray, wrong on a
#: cluster of several hosts, where peers must reach each other over the nodes' own interfaces.
LOOPBACK_KEYS = ("GLOO_SOCKET_IFNAME", "MASTER_ADDR")


def actor_env(platform: Optional[Platform] = None, threads: int = 1, loopback: bool = True) -> Dict[str, str]:
    """Environment variables for runtime actors on `platform` (one compute thread by default).

    `loopback=False` (a run on an existing, possibly multi-host cluster) leaves out LOOPBACK_KEYS.
    """
    platform = platform or current_platform()
    env = {k: str(threads) if k.endswith("_THREADS") else v for k, v in ONE_THREAD_ENV.items()}
    env["ASP_PLATFORM"] = platform.kind
    if platform.kind == "cpu":
        env.update({k: v for k, v in VLLM_CPU_ENV.items() if loopback or k not in LOOPBACK_KEYS})
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
    warning = exposure_warning(os.environ)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    os.environ.pop("RAY_ADDRESS", None)  # never attach to someone else's cluster by accident
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    env_vars = dict(actor_env(platform))
    env_vars.update(env or {})
    kwargs: Dict[str, Any] = dict(
        # "local" starts a new Ray even when another one runs on this host: without it ray.init() attaches
        # to the cluster named in /tmp/ray/ray_current_cluster (someone else's run, or a test's cluster).
        address="local",
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


def exposure_warning(env: Mapping[str, str]) -> Optional[str]:
    """The warning a local Ray started with token authentication switched off gets: Ray 2.60's GCS, raylet
    and worker servers listen on every interface whatever the node address (no setting binds them to
    loopback), so the token is what keeps other hosts out (docs/runtime.md, "Network exposure")."""
    if env.get("RAY_AUTH_MODE", "").strip().lower() != "disabled":
        return None
    return ("asp: warning: RAY_AUTH_MODE=disabled: the local Ray's ports listen on every interface (Ray cannot "
            "bind them to loopback) and now accept anyone who reaches them; unset RAY_AUTH_MODE on a host "
            "reachable from other networks")


def start_local_ray_shielded(**kwargs: Any) -> Dict[str, Any]:
    """`start_local_ray` for a command's main thread: a SIGINT/SIGTERM while Ray starts is honoured once Ray is
    whole (`StopSignals.shielded`), as `RunInterrupted` after this Ray is shut down again."""
    from mindspeed_asp.runtime.stop_signals import RunInterrupted, StopSignals

    stop = StopSignals(announce=True)
    installed = stop.install()
    try:
        with stop.shielded():
            return start_local_ray(**kwargs)
    except RunInterrupted:
        stop_local_ray()
        raise
    finally:
        if installed:
            stop.restore()


def local_gcs_lost() -> Optional[str]:
    """Why the GCS of the Ray this process started is gone (its process exited, with its code); None while it
    runs, or when this process did not start the Ray it is connected to."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)  # noqa: SLF001 - the processes this driver started
    for info in (getattr(node, "all_processes", None) or {}).get("gcs_server") or []:
        code = info.process.poll()
        if code is not None:
            return f"Ray's GCS (pid {info.process.pid}) exited with code {code}"
    return None


def stop_local_ray() -> None:
    """Shut down the Ray this process started (Ray stops only the processes it started). With its GCS gone,
    the remaining processes (raylet, agents, workers) are killed first: a graceful shutdown would wait for a
    GCS that no longer answers, and the agents would outlive the run."""
    import ray

    if ray.is_initialized():
        if local_gcs_lost() is not None:
            ray._private.worker._global_node.kill_all_processes(check_alive=False,  # noqa: SLF001
                                                                 allow_graceful=False)
        ray.shutdown()


def connect_ray(address: str, platform: Optional[Platform] = None, env: Optional[Dict[str, str]] = None) -> str:
    """Attach this process to an existing Ray cluster at `address` (`run.ray_address`); returns its GCS address.

    The job's actors get the runtime environment without the loopback pins (the cluster may span hosts).
    The cluster is not ours: `ray.shutdown()` afterwards only drops this connection.
    """
    import ray

    env_vars = dict(actor_env(platform, loopback=False))
    env_vars.update(env or {})
    ray.init(address=address, runtime_env={"env_vars": env_vars}, log_to_driver=True)
    return str(ray.get_runtime_context().gcs_address)


class RaySession:
    """The Ray a run uses, and what the run owns of it.

    `address` None starts a local Ray (`start_local_ray`) that `close()` shuts down again; an address attaches
    to that cluster (`connect_ray`) and `close()` only disconnects, the cluster and other jobs on it go on. A
    Ray this process already had (a test's, a caller's) is used as it is and left running.
    """

    def __init__(self, address: Optional[str] = None, num_cpus: int = 8, object_store_mb: int = 512,
                 platform: Optional[Platform] = None, env: Optional[Dict[str, str]] = None) -> None:
        self.address = address
        self.num_cpus = num_cpus
        self.object_store_mb = object_store_mb
        self.platform = platform
        self.env = dict(env or {})
        self.owned: Optional[str] = None  # "local" or "connection" while this session holds a Ray to release
        self.lost: Optional[str] = None  # why Ray's GCS is gone, once the watch saw it go
        self._watch: Optional[threading.Thread] = None
        self._stop_watch = threading.Event()

    @property
    def multi_node(self) -> bool:
        """Whether actors may run on other hosts (an existing cluster): no loopback-only settings then."""
        return self.address is not None

    def open(self) -> None:
        """Start or attach; a no-op when this process already has a Ray (then `owned` stays None)."""
        import ray

        if ray.is_initialized():
            return
        if self.address is not None:
            connect_ray(self.address, platform=self.platform, env=self.env)
            self.owned = "connection"
        else:
            start_local_ray(num_cpus=self.num_cpus, object_store_mb=self.object_store_mb, platform=self.platform,
                            env=self.env)
            self.owned = "local"

    def gcs_state(self) -> Optional[str]:
        """None while Ray's GCS answers; otherwise why not. A local Ray this session started: its GCS process
        exited (with its code). A cluster: its GCS port no longer accepts connections."""
        import ray

        if not ray.is_initialized():
            return None
        node = getattr(ray._private.worker, "_global_node", None)  # noqa: SLF001
        if (getattr(node, "all_processes", None) or {}).get("gcs_server"):  # a Ray this process started
            return local_gcs_lost()
        address = str(ray.get_runtime_context().gcs_address)
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=3).close()
        except OSError as exc:
            return f"Ray's GCS at {address} does not answer ({exc.strerror or exc})"
        return None

    def watch(self, on_lost: Callable[[str], None], every_s: float = 2.0) -> None:
        """Check the GCS every `every_s` seconds in a daemon thread; `on_lost(reason)` once it is gone.

        Why: without its GCS, Ray ends the driver about 60 s later from C++ (no summary, no checkpoint, agents
        left behind), while the instances' direct calls go on working. Seen in time, the run stops at its next
        safe point instead, like a SIGTERM, and `close()` stops what is left of a local Ray."""
        if self._watch is not None:
            return
        self._stop_watch.clear()

        def loop() -> None:
            while not self._stop_watch.wait(every_s):
                reason = self.gcs_state()
                if reason is not None:
                    self.lost = reason
                    on_lost(reason)
                    return
        self._watch = threading.Thread(target=loop, name="asp-gcs-watch", daemon=True)
        self._watch.start()

    def close(self) -> None:
        """Release what `open` took: stop the local Ray, or drop the connection to the existing cluster. With
        the GCS gone, a local Ray's remaining processes (raylet, agents, workers) are killed first: a graceful
        `ray.shutdown()` would wait for a GCS that no longer answers."""
        import ray

        self._stop_watch.set()
        self._watch = None
        if self.owned == "local":
            stop_local_ray()
        elif self.owned is not None and ray.is_initialized():
            ray.shutdown()  # disconnects; a cluster we did not start keeps running
        self.owned = None
