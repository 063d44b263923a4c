"""MindSpeed-RL trainer -> rollout-worker weight transfer: a thin adapter over `runtime/weight_sync/`.

One protocol for both runtimes: the same communicators (HCCL/NCCL/gloo), bucket plan, bounded-memory
checksums and deadlines as the ASP runtime. Topology: one group per inference-TP rank r; rank 0 is the
Megatron rank holding infer-TP shard r (`WeightSender`), rank 1 + j is TP rank r of rollout instance j
(`WeightReceiver`).

Lifetime: both objects form their group once and are reused for every round. Rebuilding an HCCL
communicator per sync leaks HCCL resources (buffers of `HCCL_BUFFSIZE`, ports above `HCCL_IF_BASE_PORT`)
until the process runs out of them.

Each round is self-describing: the manifest (names, shapes, dtypes, version) and the sender's checksums
travel through the group's store, so a receiver needs no prior knowledge. The receiver compares its own
checksums of what arrived and reports its verdict; `WeightSender.send` returns only when every receiver
agreed. A disabled PyHccl/PyNccl communicator is refused when the group is formed, and every wait has a
deadline (`WeightSyncTimeout` names the side and the rank/label that did not answer).
"""
from __future__ import annotations

import time
from typing import Any, Dict, Iterable, List, Tuple

from mindspeed_asp.errors import WeightSyncError, WeightSyncTimeout
from mindspeed_asp.runtime.platform import Platform, platform_from_name
from mindspeed_asp.runtime.weight_sync.buckets import DEFAULT_BUCKET_BYTES
from mindspeed_asp.runtime.weight_sync.receiver import WeightSyncReceiver
from mindspeed_asp.runtime.weight_sync.sender import WeightSyncSender

#: backend name -> the platform row whose communicator implements it
BACKEND_PLATFORM = {"hccl": "npu", "nccl": "cuda", "gloo": "cpu"}


def backend_platform(backend: str) -> Platform:
    """The runtime platform for a communicator backend name; unknown names are a WeightSyncError."""
    kind = BACKEND_PLATFORM.get(str(backend).lower())
    if kind is None:
        raise WeightSyncError(f"unknown weight-sync backend {backend!r}; expected one of "
                              f"{', '.join(BACKEND_PLATFORM)}")
    return platform_from_name(kind)


class WeightSender:
    """Rank 0 of one weight-sync group, in the Megatron actor rank holding infer-TP shard r.

    Construction forms the group and blocks until every receiver joined (WeightSyncTimeout naming the
    ranks that did not, after `timeout_s`), so fire the receivers' construction first.
    """

    def __init__(self, backend: str, host: str, port: int, world_size: int, device: Any = None,
                 timeout_s: float = 600.0, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        self._tx = WeightSyncSender(backend_platform(backend), host, int(port), world_size=int(world_size),
                                    bucket_bytes=int(bucket_bytes), timeout_s=float(timeout_s), device=device,
                                    label=f"weight sender at {host}:{port}")
        self._tx.init()

    def send(self, version: int, named_tensors: Iterable[Tuple[str, Any]]) -> Dict[str, float]:
        """Broadcast one version and wait for every receiver's verdict.

        Returns metrics: `time/weight_sync` (whole round), `weight_sync/{bytes,tensors,buckets,
        send_seconds,verify_seconds,ack_seconds,version}`. Raises WeightSyncError when a receiver's
        checksums differ, WeightSyncTimeout when a receiver does not answer within `timeout_s`.
        """
        if self._tx.comm is None:
            raise WeightSyncError(f"{self._tx.label}: send after close()")
        stats = self._tx.send(int(version), named_tensors, announce=True)
        metrics = stats.as_metrics()
        metrics["weight_sync/version"] = float(stats.version)
        return metrics

    def close(self) -> None:
        self._tx.close()


class WeightReceiver:
    """Rank 1 + j of the group: TP rank r of rollout instance j. `label` names it in every error.

    Received tensors are views of per-bucket buffers that the next round reuses while the manifest is
    unchanged: MindSpeed-RL's megatron loader aliases `param.data` to them, so keep the returned dict
    alive (and do not run the engine while `receive` writes into them).
    """

    def __init__(self, backend: str, host: str, port: int, rank: int, world_size: int, device: Any = None,
                 timeout_s: float = 600.0, label: str = "") -> None:
        self._rx = WeightSyncReceiver(backend_platform(backend), host, int(port), int(rank), int(world_size),
                                      device=device, timeout_s=float(timeout_s),
                                      label=label or f"weight receiver rank {rank}")
        self._rx.init()

    @property
    def label(self) -> str:
        return self._rx.label

    def receive(self) -> Tuple[int, Dict[str, Any]]:
        """(version, name -> tensor) of the next round; WeightSyncError on mismatch, WeightSyncTimeout late."""
        if self._rx.comm is None:
            raise WeightSyncError(f"{self._rx.label}: receive after close()")
        version, pairs = self._rx.receive()
        return version, dict(pairs)

    def close(self) -> None:
        self._rx.close()


def sync_deadline(refs_by_label: Dict[str, Any], timeout_s: float) -> Dict[str, Any]:
    """`ray.get` every ref under one shared deadline; returns label -> result in the given order.

    Fails fast: the first actor error is re-raised as a WeightSyncError (a WeightSyncTimeout if the
    actor timed out) naming its label; at the deadline, WeightSyncTimeout names every label still silent.
    """
    import ray

    labels: List[str] = list(refs_by_label)
    pending = {refs_by_label[label]: label for label in labels}
    results: Dict[str, Any] = {}
    deadline = time.monotonic() + float(timeout_s)
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            silent = [label for label in labels if label in pending.values()]
            raise WeightSyncTimeout(f"weight sync: no answer within {timeout_s:g} s from {', '.join(silent)}")
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=left)
        for ref in ready:
            label = pending.pop(ref)
            try:
                results[label] = ray.get(ref)
            except ray.exceptions.RayError as exc:
                cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else exc
                cls = WeightSyncTimeout if isinstance(cause, WeightSyncTimeout) else WeightSyncError
                raise cls(f"{label}: {type(cause).__name__}: {cause}") from exc
    return {label: results[label] for label in labels}

