"""Trainer -> rollout-instance weight sync over one collective group (gloo on CPU, NCCL on GPU, HCCL on NPU).

Why one group: the trainer's sending rank (rank 0) and every vLLM worker of every instance join a single
group (OpenRLHF/vLLM NCCL-engine topology: instance i's workers sit at `rank_offset_i + tp_rank`), so a
round is one broadcast per bucket, whatever the number of instances, and NPU hosts hold one set of HCCL
buffers. The same bucket plan is computed on both sides from a manifest of HF names, shapes and dtypes,
so only tensor bytes travel through the collective.

Every round is checked: vLLM's PyNcclCommunicator and vllm-ascend's PyHcclCommunicator turn every
collective into a silent no-op when their library is missing, so a communicator that is disabled, a
round that moves no tensor, a collective that fails or times out, or a receiver whose checksums differ
from the sender's raises `WeightSyncError`.

Pieces: `make_communicator` (the three backends behind one `broadcast(tensor, src)`), `plan_buckets` /
`pack_bucket` / `unpack_bucket`, `tensor_checksum`, the trainer-side `WeightSyncSender`
(init / start / send_bucket / finish / close, plus `send` for a whole round), and `init_weight_sync` /
`sync_weights`, which drive the trainer and the instance actors concurrently.
"""
from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from mindspeed_asp.errors import WeightSyncError
from mindspeed_asp.runtime.platform import Platform

DEFAULT_BUCKET_BYTES = 64 << 20
DEFAULT_TIMEOUT_S = 120.0
_ALIGN = 64  # byte alignment of each tensor inside a bucket, so any dtype view is legal

ManifestEntry = Tuple[str, Tuple[int, ...], str]  # (HF name, shape, dtype name e.g. "float32")


# ----------------------------------------------------------------------------------------------- helpers
def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port on `host` (loopback only by default)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def torch_dtype(name: str) -> Any:
    import torch

    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise WeightSyncError(f"manifest names an unknown dtype {name!r}")
    return dt


def tensor_nbytes(shape: Sequence[int], dtype: str) -> int:
    import torch

    numel = 1
    for d in shape:
        numel *= int(d)
    return numel * torch.empty((), dtype=torch_dtype(dtype)).element_size()


def tensor_checksum(t: Any, chunk: int = 1 << 24) -> float:
    """Position-weighted float64 sum: differs when values change, are zeroed, garbage, or permuted.

    Computed on the tensor's own device in chunks, so checking a large model neither copies it to the
    host nor doubles its memory.
    """
    import torch

    x = t.detach().reshape(-1)
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, x.numel(), chunk):
        part = x[start:start + chunk].to(torch.float64)
        w = 1.0 + ((torch.arange(part.numel(), dtype=torch.int64, device=x.device) + start) % 13) / 13.0
        total += (part * w).sum()
    return float(total)


def checksums_match(expected: Dict[str, float], got: Dict[str, float], rtol: float = 1e-6,
                    atol: float = 1e-6) -> List[str]:
    """Names whose checksums differ (or are missing on one side); empty when they agree."""
    bad = sorted(set(expected) ^ set(got))
    for name in set(expected) & set(got):
        e, g = expected[name], got[name]
        if not (abs(e - g) <= atol + rtol * abs(e)):  # also catches NaN
            bad.append(name)
    return sorted(bad)


def make_manifest(named_tensors: Iterable[Tuple[str, Any]]) -> List[ManifestEntry]:
    return [(name, tuple(int(d) for d in t.shape), dtype_name(t.dtype)) for name, t in named_tensors]


def plan_buckets(manifest: Sequence[ManifestEntry], bucket_bytes: int) -> List[List[Tuple[int, int, int]]]:
    """Split the manifest into buckets of at most `bucket_bytes` (a larger tensor gets its own bucket).

    Returns, per bucket, (manifest index, byte offset, byte size) triples. Both sides call this with the
    same arguments, so the layout never travels over the wire.
    """
    if bucket_bytes <= 0:
        raise ValueError("bucket_bytes must be positive")
    buckets: List[List[Tuple[int, int, int]]] = []
    cur: List[Tuple[int, int, int]] = []
    used = 0
    for i, (_, shape, dt) in enumerate(manifest):
        size = tensor_nbytes(shape, dt)
        start = (used + _ALIGN - 1) // _ALIGN * _ALIGN
        if cur and start + size > bucket_bytes:
            buckets.append(cur)
            cur, start = [], 0
        cur.append((i, start, size))
        used = start + size
    if cur:
        buckets.append(cur)
    return buckets


def bucket_size(bucket: Sequence[Tuple[int, int, int]]) -> int:
    return max(off + size for _, off, size in bucket) if bucket else 0


def pack_bucket(tensors: Sequence[Any], bucket: Sequence[Tuple[int, int, int]], device: Any) -> Any:
    """Copy the bucket's tensors into one flat uint8 buffer on `device`."""
    import torch

    flat = torch.zeros(bucket_size(bucket), dtype=torch.uint8, device=device)
    for i, off, size in bucket:
        src = tensors[i].detach().contiguous().reshape(-1).view(torch.uint8)
        flat[off:off + size].copy_(src)
    return flat


def unpack_bucket(flat: Any, manifest: Sequence[ManifestEntry],
                  bucket: Sequence[Tuple[int, int, int]]) -> List[Tuple[str, Any]]:
    """Views of the received buffer as (HF name, tensor) pairs, ready for `model.load_weights`."""
    out = []
    for i, off, size in bucket:
        name, shape, dt = manifest[i]
        out.append((name, flat[off:off + size].view(torch_dtype(dt)).reshape(shape)))
    return out


# ----------------------------------------------------------------------------------------- communicators
class Communicator:
    """One member of the weight-sync group: `broadcast(tensor, src)` in place, `close()`."""

    backend = ""

    def broadcast(self, tensor: Any, src: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class GlooCommunicator(Communicator):
    """torch gloo on a stateless group (vLLM's helper), loopback only on CPU hosts.

    The stateless group is not the default group, so `torch.distributed.broadcast(group=pg)` refuses
    it; the group's own `pg.broadcast(tensor, root).wait()` is used instead.
    """

    backend = "gloo"

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout_s: float) -> None:
        from vllm.distributed.utils import stateless_init_torch_distributed_process_group

        self.rank, self.world_size = rank, world_size
        self.pg = stateless_init_torch_distributed_process_group(
            host, port, rank, world_size, backend="gloo", timeout=timedelta(seconds=timeout_s))

    def broadcast(self, tensor: Any, src: int) -> None:
        self.pg.broadcast(tensor, src).wait()

    def close(self) -> None:
        from vllm.distributed.utils import stateless_destroy_torch_distributed_process_group

        try:
            stateless_destroy_torch_distributed_process_group(self.pg)
        except Exception:  # closing a group whose peers are gone must not mask the real error
            pass


class _PyCommunicator(Communicator):
    """vLLM's PyNccl / vllm-ascend's PyHccl on a StatelessProcessGroup, refusing the silent no-op mode."""

    def __init__(self, comm_cls: Any, host: str, port: int, rank: int, world_size: int,
                 device: Any, timeout_s: float, platform: Platform) -> None:
        from vllm.distributed.utils import StatelessProcessGroup

        self.platform = platform
        self.group = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size,
                                                  store_timeout=int(timeout_s))
        self.comm = comm_cls(self.group, device=device)
        if getattr(self.comm, "disabled", False) or not getattr(self.comm, "available", True):
            raise WeightSyncError(
                f"{comm_cls.__name__} is disabled (library missing or world_size {world_size} == 1); "
                f"a {self.backend} weight sync would silently move nothing")

    def broadcast(self, tensor: Any, src: int) -> None:
        self.comm.broadcast(tensor, src=src, stream=self.platform.current_stream())
        self.platform.synchronize()


class NcclCommunicator(_PyCommunicator):
    backend = "nccl"

    def __init__(self, host: str, port: int, rank: int, world_size: int, device: Any, timeout_s: float,
                 platform: Platform) -> None:
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator

        super().__init__(PyNcclCommunicator, host, port, rank, world_size, device, timeout_s, platform)


class HcclCommunicator(_PyCommunicator):
    backend = "hccl"

    def __init__(self, host: str, port: int, rank: int, world_size: int, device: Any, timeout_s: float,
                 platform: Platform) -> None:
        from vllm_ascend.distributed.device_communicators.pyhccl import PyHcclCommunicator

        super().__init__(PyHcclCommunicator, host, port, rank, world_size, device, timeout_s, platform)


def make_communicator(platform: Platform, host: str, port: int, rank: int, world_size: int,
                      device: Any = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> Communicator:
    """The platform's weight-sync backend; any failure to form the group is a WeightSyncError."""
    if world_size < 2:
        raise WeightSyncError(f"weight-sync group of world_size {world_size}: needs the trainer and >= 1 worker")
    if not 0 <= rank < world_size:
        raise WeightSyncError(f"weight-sync rank {rank} outside world_size {world_size}")
    try:
        if platform.dist_backend == "gloo":
            return GlooCommunicator(host, port, rank, world_size, timeout_s)
        if device is None:
            device = platform.device(platform.torch_module.current_device())
        if platform.dist_backend == "nccl":
            return NcclCommunicator(host, port, rank, world_size, device, timeout_s, platform)
        if platform.dist_backend == "hccl":
            return HcclCommunicator(host, port, rank, world_size, device, timeout_s, platform)
    except WeightSyncError:
        raise
    except Exception as exc:
        raise WeightSyncError(f"could not form the {platform.dist_backend} weight-sync group at "
                              f"{host}:{port} as rank {rank}/{world_size}: {exc}") from exc
    raise WeightSyncError(f"no weight-sync backend for collective {platform.dist_backend!r}")


# ---------------------------------------------------------------------------------------- trainer side
@dataclass
class SyncStats:
    """One round, as the trainer saw it (plus what the instances reported, filled by `sync_weights`)."""

    version: int
    tensors: int
    bytes: int
    buckets: int
    seconds: float
    checksums: Dict[str, float] = field(default_factory=dict)
    instance_seconds: List[float] = field(default_factory=list)
    verified: bool = False
    send_seconds: float = 0.0  # the trainer's broadcasts alone; `seconds` is the whole round
    engine_verified: List[int] = field(default_factory=list)  # per instance: params read back from vLLM

    def as_metrics(self) -> Dict[str, float]:
        return {"time/weight_sync": self.seconds, "weight_sync/bytes": float(self.bytes),
                "weight_sync/tensors": float(self.tensors), "weight_sync/buckets": float(self.buckets)}


class WeightSyncSender:
    """The trainer's rank 0 of the weight-sync group.

    Call `init()` only after every instance's `init_weight_sync` has been fired (the rendezvous blocks);
    `init_weight_sync()` below does both in the right order. `world_size` = 1 + all instances' workers.
    """

    def __init__(self, platform: Platform, master_addr: str = "127.0.0.1", master_port: int = 0,
                 world_size: int = 2, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.platform = platform
        self.master_addr = master_addr
        self.master_port = master_port or free_port(master_addr)
        self.world_size = int(world_size)
        self.bucket_bytes = int(bucket_bytes)
        self.timeout_s = float(timeout_s)
        self.comm: Optional[Communicator] = None
        self.history: List[SyncStats] = []
        self._round: Optional[Dict[str, Any]] = None

    def init(self) -> None:
        self.comm = make_communicator(self.platform, self.master_addr, self.master_port, 0, self.world_size,
                                      timeout_s=self.timeout_s)

    # -- round protocol: start -> send_bucket* -> finish
    def start(self, version: int, manifest: Sequence[ManifestEntry]) -> List[List[Tuple[int, int, int]]]:
        if self.comm is None:
            raise WeightSyncError("weight sync not initialised: call init() first")
        if not manifest:
            raise WeightSyncError(f"weight sync round for version {version} has no tensors to send")
        buckets = plan_buckets(manifest, self.bucket_bytes)
        self._round = {"version": version, "manifest": list(manifest), "t0": time.perf_counter(),
                       "bytes": 0, "buckets": 0, "checksums": {}}
        return buckets

    def send_bucket(self, tensors: Sequence[Any], bucket: Sequence[Tuple[int, int, int]]) -> None:
        """Broadcast one bucket; `tensors` is indexed like the round's manifest."""
        if self._round is None or self.comm is None:
            raise WeightSyncError("send_bucket outside a round: call start() first")
        flat = pack_bucket(tensors, bucket, self.platform.device(self._device_index()))
        try:
            self.comm.broadcast(flat, src=0)
        except Exception as exc:
            self._round = None
            raise WeightSyncError(f"weight broadcast failed ({self.comm.backend}): {exc}") from exc
        for i, _, size in bucket:
            self._round["checksums"][self._round["manifest"][i][0]] = tensor_checksum(tensors[i])
            self._round["bytes"] += size
        self._round["buckets"] += 1

    def finish(self) -> SyncStats:
        if self._round is None:
            raise WeightSyncError("finish outside a round")
        r, self._round = self._round, None
        if r["bytes"] == 0:
            raise WeightSyncError(f"weight sync round for version {r['version']} moved no bytes")
        dt = time.perf_counter() - r["t0"]
        stats = SyncStats(version=r["version"], tensors=len(r["checksums"]), bytes=r["bytes"],
                          buckets=r["buckets"], seconds=dt, checksums=r["checksums"], send_seconds=dt)
        self.history.append(stats)
        return stats

    def send(self, version: int, named_tensors: Iterable[Tuple[str, Any]]) -> SyncStats:
        """A whole round: every tensor, bucket by bucket, in manifest order."""
        pairs = list(named_tensors)
        manifest = make_manifest(pairs)
        buckets = self.start(version, manifest)
        tensors = [t for _, t in pairs]
        for bucket in buckets:
            self.send_bucket(tensors, bucket)
        return self.finish()

    def close(self) -> None:
        if self.comm is not None:
            self.comm.close()
            self.comm = None

    def _device_index(self) -> int:
        return int(self.platform.torch_module.current_device()) if self.platform.is_accelerator else 0


# ------------------------------------------------------------------------------------ both sides at once
def _ray_get(refs: Any, timeout_s: float, what: str) -> Any:
    import ray

    try:
        return ray.get(refs, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError as exc:
        raise WeightSyncError(f"{what} timed out after {timeout_s:.0f} s") from exc
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
    refs = [inst.init_weight_sync.remote(sender.master_addr, sender.master_port, o, sender.world_size)
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
        except Exception:
            pass
