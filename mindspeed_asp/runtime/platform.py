"""The one place that knows which hardware this process runs on: cpu, cuda (NVIDIA GPU) or npu (Ascend).

Why: the same runtime runs on three tiers (docs/design.md#platforms). Everything hardware-specific (device
type, the torch device module, the collective backend for weight sync, the visible-devices variable Ray
sets, the Ray resource name, what the engine can do) is decided here once per process, following
vLLM's `current_platform`. Other modules never write "cuda" or `torch.cuda`; they ask this object.

Resolution order: env `ASP_PLATFORM` (cpu|cuda|npu, so tests can force CPU on a GPU host) -> torch_npu
importable and an NPU present -> CUDA available -> cpu. The probes do not initialise the accelerator
beyond what `is_available()` does. (verl's CPU mistakes, "nccl" backend and "NPU" resource on CPU, are
avoided by construction: each kind has its own row.)
"""
from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Optional

ENV_OVERRIDE = "ASP_PLATFORM"
KINDS = ("cpu", "cuda", "npu")


@dataclass(frozen=True)
class Platform:
    """What the runtime needs to know about the hardware of this process.

    `dist_backend` is the collective used for trainer->instance weight sync; `visible_devices_env` is the
    variable Ray sets per actor (None on CPU, where it must be ignored); `ray_resource` is the Ray
    resource an instance asks for per device (None on CPU: instances ask for CPUs only).
    """

    kind: str
    device_type: str
    dist_backend: str
    visible_devices_env: Optional[str]
    ray_resource: Optional[str]
    torch_module_name: str
    capabilities: FrozenSet[str] = field(default_factory=frozenset)
    source: str = "probe"  # "env" when forced by ASP_PLATFORM

    @property
    def torch_module(self) -> Any:
        """`torch.cuda`, `torch.npu` (registered by torch_npu) or `torch.cpu`, imported on first use."""
        import torch

        if self.kind == "npu":
            import torch_npu  # noqa: F401  (registers torch.npu)
        return getattr(torch, self.torch_module_name)

    @property
    def is_accelerator(self) -> bool:
        return self.kind != "cpu"

    def supports(self, capability: str) -> bool:
        return capability in self.capabilities

    def device(self, index: int = 0) -> Any:
        """The torch device for local device `index` (always `cpu` on CPU)."""
        import torch

        if self.kind == "cpu":
            return torch.device("cpu")
        return torch.device(self.device_type, index)

    def set_device(self, index: int) -> None:
        if self.is_accelerator:
            self.torch_module.set_device(index)

    def synchronize(self) -> None:
        if self.is_accelerator:
            self.torch_module.synchronize()

    def current_stream(self) -> Any:
        """The current device stream (None on CPU, where collectives are synchronous)."""
        return self.torch_module.current_stream() if self.is_accelerator else None

    def device_count(self) -> int:
        return int(self.torch_module.device_count()) if self.is_accelerator else 0

    def ray_actor_resources(self, devices: int) -> Dict[str, float]:
        """Ray `resources=`/`num_gpus=` keywords for an actor that owns `devices` accelerators."""
        if self.kind == "cpu" or devices <= 0:
            return {}
        if self.ray_resource == "GPU":
            return {"num_gpus": float(devices)}
        return {"resources": {self.ray_resource: float(devices)}}

    def describe(self) -> Dict[str, Any]:
        return {
            "kind": self.kind,
            "device_type": self.device_type,
            "dist_backend": self.dist_backend,
            "visible_devices_env": self.visible_devices_env,
            "ray_resource": self.ray_resource,
            "capabilities": sorted(self.capabilities),
            "source": self.source,
        }


def _row(kind: str, source: str) -> Platform:
    if kind == "cpu":
        return Platform("cpu", "cpu", "gloo", None, None, "cpu",
                        frozenset({"gloo_weight_sync"}), source)
    if kind == "cuda":
        return Platform("cuda", "cuda", "nccl", "CUDA_VISIBLE_DEVICES", "GPU", "cuda",
                        frozenset({"sleep_mode", "ipc_weight_sync", "nccl_weight_sync", "cuda_graphs"}), source)
    if kind == "npu":
        return Platform("npu", "npu", "hccl", "ASCEND_RT_VISIBLE_DEVICES", "NPU", "npu",
                        frozenset({"sleep_mode", "ipc_weight_sync", "hccl_weight_sync", "acl_graphs"}), source)
    raise ValueError(f"unknown platform kind {kind!r}; expected one of {', '.join(KINDS)}")


def probe_npu() -> bool:
    """torch_npu importable and at least one NPU visible (transformers' is_torch_npu_available idea)."""
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        import torch
        import torch_npu  # noqa: F401

        return bool(torch.npu.is_available())
    except Exception:  # noqa: BLE001 - a broken CANN install is "no NPU", not a crash of the driver
        return False


def probe_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken CUDA install is 'no GPU', not a crash
        return False


def resolve_platform(override: Optional[str] = None,
                     probes: Optional[Dict[str, Callable[[], bool]]] = None) -> Platform:
    """Resolve the platform without caching (tests pass `probes` to cover every branch on CPU).

    `override` (or env ASP_PLATFORM) forces a kind; an unknown value is an error naming the variable.
    """
    from mindspeed_asp.errors import ConfigError

    forced = override if override is not None else os.environ.get(ENV_OVERRIDE, "").strip()
    if forced:
        kind = forced.lower()
        if kind not in KINDS:
            raise ConfigError(f"unknown platform {forced!r}; expected one of {', '.join(KINDS)}",
                              key=ENV_OVERRIDE)
        return _row(kind, "env")
    probes = probes or {}
    if probes.get("npu", probe_npu)():
        return _row("npu", "probe")
    if probes.get("cuda", probe_cuda)():
        return _row("cuda", "probe")
    return _row("cpu", "probe")


@functools.lru_cache(maxsize=1)
def current_platform() -> Platform:
    """The platform of this process, resolved once."""
    return resolve_platform()


def platform_from_name(kind: str) -> Platform:
    """The row for a kind, e.g. to describe another process's platform from its name."""
    return _row(kind.lower(), "env")
