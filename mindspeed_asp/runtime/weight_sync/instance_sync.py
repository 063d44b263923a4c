"""Both sides at once: the Ray glue that drives the trainer's sender and the vLLM instance actors together.

Why its own module: forming the group and running a verified round need the instances' calls fired
before the sender blocks in the collective, then awaited with a deadline and cancelled on failure;
that is the only part of the weight sync that talks to Ray, so it is kept apart from the protocol.
"""
from __future__ import annotations

import time
from typing import Any, Iterable, List, Optional, Sequence, Tuple

from mindspeed_asp.errors import WeightSyncError, WeightSyncTimeout
from mindspeed_asp.runtime.weight_sync.buckets import make_manifest
from mindspeed_asp.runtime.weight_sync.checksums import checksums_match
from mindspeed_asp.runtime.weight_sync.sender import SyncStats, WeightSyncSender


def _ray_get(refs: Any, timeout_s: float, what: str) -> Any:
    import ray

    try:
        return ray.get(refs, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError as exc:
        raise WeightSyncTimeout(f"{what} timed out after {timeout_s:g} s") from exc
    except ray.exceptions.RayError as exc:
        raise WeightSyncError(f"{what} failed: {exc}") from exc


def init_weight_sync(sender: WeightSyncSender, instances: Sequence[Any],
                     workers_per_instance: Optional[Sequence[int]] = None) -> List[int]:
    """Form the group: fire every instance's `init_weight_sync` first, then join as rank 0.

    Returns each instance's rank offset (1 + workers of the instances before it).
    """
    sizes = list(workers_per_instance or [1] * len(instances))
    if 1 + sum(sizes) != sender.world_size:
        raise WeightSyncError(f"sender world_size {sender.world_size} != 1 + {sum(sizes)} instance workers")
    offsets, off = [], 1
    for s in sizes:
        offsets.append(off)
        off += s
    refs = [inst.init_weight_sync.remote(sender.master_addr, sender.master_port, o, sender.world_size,
                                         timeout_s=sender.timeout_s)
            for inst, o in zip(instances, offsets)]
    try:
        sender.init()
    except WeightSyncError:
        _cancel(refs)
        raise
    _ray_get(refs, sender.timeout_s, "instance weight-sync init")
    return offsets


def sync_weights(sender: WeightSyncSender, instances: Sequence[Any], version: int,
                 named_tensors: Iterable[Tuple[str, Any]]) -> SyncStats:
    """One verified round: instances join the broadcast while the trainer sends, then checksums compare.

    The instances' `receive_weights` calls are dispatched first (they block inside the collective), then
    the trainer broadcasts; afterwards every instance's checksums of what it received and loaded must
    equal the trainer's, and the instance's version becomes `version`.
    """
    t0 = time.perf_counter()
    pairs = [(n, t.detach()) for n, t in named_tensors]
    manifest = make_manifest(pairs)
    if not manifest:
        raise WeightSyncError(f"weight sync round for version {version} has no tensors to send")
    refs = [inst.receive_weights.remote(version, manifest, bucket_bytes=sender.bucket_bytes)
            for inst in instances]
    try:
        stats = sender.send(version, pairs)
    except WeightSyncError:
        _cancel(refs)
        raise
    reports = _ray_get(refs, sender.timeout_s, f"instance receive of weight version {version}")
    for idx, rep in enumerate(reports):
        for worker in rep.get("workers", [rep]):
            bad = checksums_match(stats.checksums, worker.get("checksums", {}))
            if bad:
                raise WeightSyncError(f"instance {idx} (worker rank {worker.get('rank')}) holds different weights "
                                      f"than the trainer after version {version}: {bad[:5]}"
                                      f"{' ...' if len(bad) > 5 else ''}")
        stats.instance_seconds.append(float(rep.get("seconds", 0.0)))
        stats.engine_verified.append(min(int(w.get("engine_verified", 0)) for w in rep.get("workers", [rep])))
    stats.verified = True
    stats.send_seconds = stats.seconds
    stats.seconds = time.perf_counter() - t0  # what the trainer waited: send, load everywhere, verify
    return stats


def _cancel(refs: Sequence[Any]) -> None:
    import ray

    for r in refs:
        try:
            ray.cancel(r, force=False)
        except Exception:  # noqa: BLE001 - best-effort cancel of calls whose actors may be gone
            pass
