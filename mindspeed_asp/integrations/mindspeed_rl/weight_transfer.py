"""Trainer -> rollout-instance weight broadcast over one collective group, with proof that bytes moved.

The Ascend path uses vllm-ascend's `PyHcclCommunicator` on a vLLM `StatelessProcessGroup` (the analogue of
the `PyNcclCommunicator` that verl and OpenRLHF use). Like PyNccl it *disables itself silently* when its
library cannot be loaded, after which every broadcast is a no-op; a round would "succeed" while moving
nothing. So every round here (1) refuses a disabled communicator, (2) sends a random canary tensor first and
(3) compares per-tensor checksums sent as metadata over the group's object channel, raising WeightSyncError
on any mismatch. The protocol only needs `comm.broadcast(tensor, src)` and `group.broadcast_obj(obj, src)`,
so the CPU tests run it over gloo.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from mindspeed_asp.errors import WeightSyncError


@dataclass
class TensorMeta:
    name: str
    shape: Tuple[int, ...]
    dtype: str
    checksum: float


def _checksum(t: Any) -> float:
    return float(t.detach().double().sum().item()) if t.numel() else 0.0


def _dtype(name: str) -> Any:
    import torch
    return getattr(torch, name.replace("torch.", ""))


def hccl_communicator(group: Any, device: Any) -> Any:
    """vllm-ascend's PyHcclCommunicator over `group`; raises instead of returning a disabled one."""
    try:
        from vllm_ascend.distributed.device_communicators.pyhccl import PyHcclCommunicator  # type: ignore
    except ImportError as exc:
        raise WeightSyncError(f"vllm-ascend's PyHcclCommunicator is not importable ({exc}); install vllm-ascend "
                              "v0.11.0-dev@1b16c01 (see `asp doctor --target npu`)") from None
    comm = PyHcclCommunicator(group, device=device)
    if getattr(comm, "disabled", False) or not getattr(comm, "available", True):
        raise WeightSyncError("PyHcclCommunicator disabled itself (libhccl not loadable?): source CANN's "
                              "set_env.sh on every node; weight sync would move nothing")
    return comm


def stateless_group(host: str, port: int, rank: int, world_size: int) -> Any:
    """vLLM's TCPStore-backed StatelessProcessGroup (outside the Megatron world, so no rank clash)."""
    from vllm.distributed.utils import StatelessProcessGroup
    return StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)


def send_state(comm: Any, group: Any, params: Dict[str, Any], src: int, version: int, seed: int = 0) -> int:
    """Broadcast `params` (name -> tensor, one device) from rank `src`; returns bytes sent."""
    import torch
    names = sorted(params)
    if not names:
        raise WeightSyncError("weight sync round with no tensors: the trainer exported nothing")
    device = params[names[0]].device
    g = torch.Generator().manual_seed(seed + version)
    canary = torch.rand(64, generator=g, dtype=torch.float32).to(device)
    meta = [TensorMeta(n, tuple(params[n].shape), str(params[n].dtype), _checksum(params[n])) for n in names]
    group.broadcast_obj({"version": version, "meta": meta, "canary": _checksum(canary)}, src=src)
    comm.broadcast(canary, src)
    sent = 0
    for n in names:
        t = params[n].contiguous()
        comm.broadcast(t, src)
        sent += t.numel() * t.element_size()
    return sent


def recv_state(comm: Any, group: Any, device: Any, src: int, keep: Optional[Dict[str, Any]] = None
               ) -> Tuple[int, Dict[str, Any]]:
    """Receive one round from `src`; returns (version, name -> tensor). Raises WeightSyncError on mismatch.

    `keep` (optional) reuses previous buffers of the same shape, so vLLM parameters aliased to them by
    MindSpeed-RL's megatron weight loader stay valid.
    """
    import torch
    header = group.broadcast_obj(None, src=src)
    canary = torch.zeros(64, dtype=torch.float32, device=device)
    comm.broadcast(canary, src)
    if abs(_checksum(canary) - header["canary"]) > 1e-3:
        raise WeightSyncError("weight sync canary did not arrive: the collective moved nothing (disabled "
                              "communicator or wrong group)")
    out: Dict[str, Any] = {}
    bad: List[str] = []
    for m in header["meta"]:
        buf = (keep or {}).get(m.name)
        if buf is None or tuple(buf.shape) != m.shape or str(buf.dtype) != m.dtype:
            buf = torch.empty(m.shape, dtype=_dtype(m.dtype), device=device)
        comm.broadcast(buf, src)
        if abs(_checksum(buf) - m.checksum) > 1e-3 * max(1.0, abs(m.checksum)):
            bad.append(m.name)
        out[m.name] = buf
    if bad:
        raise WeightSyncError(f"weight sync checksum mismatch on {len(bad)} tensors (first: {bad[0]})")
    return int(header["version"]), out


class TorchGroupComm:
    """`broadcast(tensor, src)` over a torch ProcessGroup (gloo on CPU): the protocol's CPU stand-in for HCCL."""

    def __init__(self, pg: Any) -> None:
        self.pg = pg

    def broadcast(self, tensor: Any, src: int) -> None:
        self.pg.broadcast(tensor, src).wait()
