"""Trainer -> rollout-instance weight sync over one collective group (gloo on CPU, NCCL on GPU, HCCL on NPU).

Why one group: the trainer's sending rank (rank 0) and every vLLM worker of every instance join a single
group (OpenRLHF/vLLM NCCL-engine topology: instance i's workers sit at `rank_offset_i + tp_rank`), so a
round is one broadcast per bucket, whatever the number of instances, and NPU hosts hold one set of HCCL
buffers. The same bucket plan is computed on both sides from a manifest of HF names, shapes and dtypes,
so only tensor bytes travel through the collective.

Every round is checked: vLLM's PyNcclCommunicator and vllm-ascend's PyHcclCommunicator turn every
collective into a silent no-op when their library is missing, so a communicator that is disabled, a
round that moves no tensor, a collective that fails, or a receiver whose checksums differ from the
sender's raises `WeightSyncError`; a peer that does not answer within the deadline (joining the group,
a broadcast, a verdict) raises `WeightSyncTimeout`, naming the ranks and labels it waited for.

The group's control plane is a TCPStore hosted by rank 0: every member announces itself there (so a
missing rank can be named), the backend forms its group through it, and announced rounds carry their
manifest and checksums through it (so a receiver needs nothing but the group: `WeightSyncReceiver`).

Pieces: `tensor_checksum` (bounded-memory, position-weighted), `make_communicator` (the three backends
behind one `broadcast(tensor, src)` with a deadline), `plan_buckets` / `pack_bucket` / `unpack_bucket`,
the trainer-side `WeightSyncSender` (init / start / send_bucket / finish / close, plus `send` for a whole
round), the in-process `WeightSyncReceiver`, and `init_weight_sync` / `sync_weights`, which drive the
trainer and vLLM instance actors concurrently.
"""
from __future__ import annotations

import functools
import json
import math
import os
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from mindspeed_asp.errors import WeightSyncError, WeightSyncTimeout
from mindspeed_asp.runtime.platform import Platform

DEFAULT_BUCKET_BYTES = 64 << 20
DEFAULT_TIMEOUT_S = 120.0
_ALIGN = 64  # byte alignment of each tensor inside a bucket, so any dtype view is legal

#: Position weights repeat every block; part of the checksum's definition, identical on every side.
CHECKSUM_BLOCK = 1 << 14
#: Elements checked per step (a whole number of blocks). The value does not depend on it; the extra
#: memory does: one fp32 copy of a chunk (4 MiB on CPU, 16 MiB on an accelerator).
CHECKSUM_CHUNK_CPU = 1 << 20
CHECKSUM_CHUNK_ACCEL = 1 << 22

ManifestEntry = Tuple[str, Tuple[int, ...], str]  # (HF name, shape, dtype name e.g. "float32")

_KEY = "asp/ws"  # prefix of every control-plane key in the group's store


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


# ---------------------------------------------------------------------------------------------- checksum
def _mix32(x: Any) -> Any:
    """A 32-bit integer hash (works on Python ints and int64 tensors alike; products stay below 2**59)."""
    x = (((x >> 16) ^ x) * 0x45D9F3B) & 0xFFFFFFFF
    x = (((x >> 16) ^ x) * 0x45D9F3B) & 0xFFFFFFFF
    return (x >> 16) ^ x


def _unit_weights(index: Any, salt: int) -> Any:
    """Pseudo-random weights in [1, 2) with 24-bit mantissas (exact in fp32) for int64 `index`."""
    import torch

    h = _mix32((index + salt) & 0xFFFFFFFF) >> 8
    return 1.0 + h.to(torch.float64) / float(1 << 24)


@functools.lru_cache(maxsize=8)
def _position_weights(device: Any) -> Any:
    """The block's position weights on `device` (64 KiB, computed on the host: identical bits everywhere)."""
    import torch

    w = _unit_weights(torch.arange(CHECKSUM_BLOCK, dtype=torch.int64), 0x2545F491)
    return w.to(torch.float32).to(device)


_BLOCK_WEIGHTS: List[Any] = []


def _block_weights(n: int) -> Any:
    """b_0 .. b_{n-1} (float64, host), grown on demand and kept: tensors of every size share them."""
    import torch

    cached = _BLOCK_WEIGHTS[0] if _BLOCK_WEIGHTS else None
    if cached is None or cached.numel() < n:  # a local reference: safe while another thread grows it
        cached = _unit_weights(torch.arange(1 << max(10, (n - 1).bit_length()), dtype=torch.int64), 0x68E31DA4)
        _BLOCK_WEIGHTS[:] = [cached]
    return cached[:n]


def _copy_flat(x: Any, start: int, out: Any) -> None:
    """Copy elements [start, start + len(out)) of `x` in row-major order into `out`, without a full copy.

    For non-contiguous tensors (a transposed view): `reshape(-1)` would materialise the whole tensor.
    """
    n = out.numel()
    if x.dim() <= 1:
        out.copy_(x.reshape(-1)[start:start + n])
        return
    inner = x[0].numel()
    pos = 0
    while pos < n:
        row, off = divmod(start + pos, inner)
        if off == 0 and n - pos >= inner:
            rows = (n - pos) // inner
            out[pos:pos + rows * inner].view(rows, *x.shape[1:]).copy_(x[row:row + rows])
            pos += rows * inner
        else:
            take = min(n - pos, inner - off)
            _copy_flat(x[row], off, out[pos:pos + take])
            pos += take


def tensor_checksum(t: Any, chunk: Optional[int] = None) -> float:
    """Position-weighted sum that changes when values change, are zeroed, left unwritten or permuted.

    Definition: element i (row-major) in block k = i // CHECKSUM_BLOCK, position j = i % CHECKSUM_BLOCK
    contributes x_i * (b_k * r_j + 1), where r_j and b_k are fixed pseudo-random weights in [1, 2): a
    plain sum plus a weighted sum whose weights differ between positions of a block (a permutation or a
    swap inside a block moves it) and between blocks (so does a swap across blocks). Each block is
    summed in fp32 and the block sums are combined in float64 on the host.

    Memory: the tensor is read `chunk` elements at a time (a whole number of blocks) through one fp32
    buffer of that size, so no full-size temporary exists: checking a 1 GiB bf16 embedding costs 4 MiB
    (CPU) or 16 MiB (accelerator), not the 4 GiB of an fp64 copy, and runs on the tensor's own device.
    Per-block sums are deterministic (fixed-length rows, whatever the thread count or chunk), so two
    processes checking the same bits agree; `checksums_match` still allows 1e-6 relative.
    """
    import torch

    x = t.detach()
    total = x.numel()
    if total == 0:
        return 0.0
    block = CHECKSUM_BLOCK
    if chunk is None:
        chunk = CHECKSUM_CHUNK_CPU if x.device.type == "cpu" else CHECKSUM_CHUNK_ACCEL
    chunk = max(block, int(chunk) // block * block)
    width = min(chunk, total)
    dev = x.device
    weights = _position_weights(dev)
    flat = x.reshape(-1) if x.is_contiguous() else None  # a view: contiguous tensors are read in place
    raw = None if flat is not None else torch.empty(width, dtype=x.dtype, device=dev)
    # fp32 tensors are read directly and need a product buffer; others are converted into `work`,
    # summed, then weighted in place: either way one chunk-sized fp32 buffer.
    work = torch.empty(width, dtype=torch.float32, device=dev)
    weighted: List[Any] = []
    plain: List[Any] = []
    for start in range(0, total, chunk):
        n = min(chunk, total - start)
        if flat is not None:
            src = flat[start:start + n]
        else:
            src = raw[:n]
            _copy_flat(x, start, src)
        if src.dtype == torch.float32:
            part, prod = src, work[:n]
        else:
            part = work[:n]
            part.copy_(src)
            prod = part
        full = n // block * block
        if full:
            plain.append(part[:full].view(-1, block).sum(1))
        if n > full:  # the tensor's last, partial block
            plain.append(part[full:].sum().reshape(1))
        if full:
            torch.mul(part[:full].view(-1, block), weights, out=prod[:full].view(-1, block))
            weighted.append(prod[:full].view(-1, block).sum(1))
        if n > full:
            torch.mul(part[full:], weights[:n - full], out=prod[full:])
            weighted.append(prod[full:].sum().reshape(1))
    sums = torch.cat(weighted + plain).cpu().to(torch.float64)  # one transfer to the host
    blocks = sums.numel() // 2
    return math.fsum((_block_weights(blocks) * sums[:blocks] + sums[blocks:]).tolist())


def checksums_match(expected: Dict[str, float], got: Dict[str, float], rtol: float = 1e-6,
                    atol: float = 1e-6) -> List[str]:
    """Names whose checksums differ (or are missing on one side); empty when they agree."""
    bad = sorted(set(expected) ^ set(got))
    for name in set(expected) & set(got):
        e, g = expected[name], got[name]
        if not (abs(e - g) <= atol + rtol * abs(e)):  # also catches NaN
            bad.append(name)
    return sorted(bad)


# ------------------------------------------------------------------------------------------- buckets
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


# ------------------------------------------------------------------------------------ group control plane
def _is_timeout(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "timed out" in text or "timeout" in text


_HOSTED: Dict[Tuple[str, int], Any] = {}  # stores bound by `host_store`, taken by this process's rank 0


def host_store(host: str, port: int, timeout_s: float, label: str = "sender") -> None:
    """Bind the group's TCPStore now, as rank 0 will use it: a port another process took since it was probed
    fails here at once (WeightSyncError carrying EADDRINUSE), before any member is told the address. The
    sender's Communicator in this process then takes this store instead of binding again."""
    _HOSTED[(str(host), int(port))] = _open_store(host, port, 0, timeout_s, label)


def _open_store(host: str, port: int, rank: int, timeout_s: float, label: str) -> Any:
    """Rank 0 hosts the group's TCPStore (or takes the one `host_store` bound); the others connect to it
    (retrying until the deadline)."""
    from torch.distributed import TCPStore

    if rank == 0 and (str(host), int(port)) in _HOSTED:
        return _HOSTED.pop((str(host), int(port)))
    try:
        return TCPStore(host, int(port), None, rank == 0, timeout=timedelta(seconds=timeout_s),
                        wait_for_workers=False)
    except Exception as exc:
        if rank == 0:
            raise WeightSyncError(f"{label}: cannot host the weight-sync group at {host}:{port}: {exc}") from exc
        raise WeightSyncTimeout(f"{label}: the sender (rank 0) of the weight-sync group at {host}:{port} did "
                                f"not answer within {timeout_s:g} s ({exc})") from exc


def _join(store: Any, rank: int, world_size: int, label: str, timeout_s: float, where: str) -> Dict[int, str]:
    """Announce this member and wait for all; returns every rank's label. Names the ranks that never came."""
    key = f"{_KEY}/join/{rank}"
    token = f"{socket.gethostname()}:{os.getpid()}:{id(store)}|{label}"
    held = store.compare_set(key, "", token).decode()
    if held != token:
        raise WeightSyncError(f"{label}: rank {rank} of the weight-sync group at {where} is already taken by "
                              f"{held.split('|', 1)[-1]!r}")
    keys = [f"{_KEY}/join/{r}" for r in range(world_size)]
    if not _wait_all(store, keys, timeout_s, f"{label}: joining the weight-sync group at {where}"):
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        raise WeightSyncTimeout(f"{label}: weight-sync group at {where}: rank(s) "
                                f"{', '.join(map(str, missing))} of {world_size} did not join within "
                                f"{timeout_s:g} s")
    return {r: store.get(k).decode().split("|", 1)[-1] for r, k in enumerate(keys)}


def _wait_all(store: Any, keys: Sequence[str], timeout_s: float, what: str) -> bool:
    """Block until every key exists (True) or the deadline passes (False); a lost store raises."""
    try:
        store.wait(list(keys), timedelta(seconds=timeout_s))
        return True
    except Exception as exc:
        if _is_timeout(exc):
            return False
        raise WeightSyncError(f"{what}: lost the weight-sync group's store ({exc})") from exc


def _wait_key(store: Any, key: str, timeout_s: float, what: str) -> bytes:
    """The value of `key` once set; WeightSyncTimeout(`what` ...) after `timeout_s`."""
    if not _wait_all(store, [key], timeout_s, what):
        raise WeightSyncTimeout(f"{what} within {timeout_s:g} s")
    return store.get(key)


# ----------------------------------------------------------------------------------------- communicators
class Communicator:
    """One member of the weight-sync group: `broadcast(tensor, src)` in place with a deadline, `close()`.

    Forming one joins the group's store (rank 0 hosts it) and waits for every rank; `labels` then maps
    each rank to its member's label. A broadcast that fails or outlives `timeout_s` leaves the group
    unusable (`broken`): later calls raise at once, and the caller forms a new group.
    """

    backend = ""

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout_s: float,
                 label: str = "") -> None:
        self.rank, self.world_size, self.timeout_s = int(rank), int(world_size), float(timeout_s)
        self.label = label or f"weight-sync rank {rank}"
        self.where = f"{host}:{port}"
        self.broken = ""
        self.store = _open_store(host, port, self.rank, self.timeout_s, self.label)
        self.labels = _join(self.store, self.rank, self.world_size, self.label, self.timeout_s, self.where)

    def describe(self, rank: int) -> str:
        return f"rank {rank} ({self.labels.get(rank, '?')})"

    def broadcast(self, tensor: Any, src: int) -> None:
        if self.broken:
            raise WeightSyncError(f"{self.label}: the {self.backend} weight-sync group at {self.where} is unusable "
                                  f"after an earlier failure ({self.broken}); form a new group")
        try:
            self._broadcast(tensor, src)
        except WeightSyncError as exc:
            self.broken = str(exc)
            raise
        except Exception as exc:
            self.broken = str(exc)
            nbytes = tensor.numel() * tensor.element_size()
            if _is_timeout(exc):
                raise WeightSyncTimeout(f"{self.label}: a {self.backend} broadcast of {nbytes} bytes from "
                                        f"{self.describe(src)} did not complete within {self.timeout_s:g} s "
                                        f"({exc})") from exc
            raise WeightSyncError(f"{self.label}: a {self.backend} broadcast of {nbytes} bytes from "
                                  f"{self.describe(src)} failed: {exc}") from exc

    def _broadcast(self, tensor: Any, src: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.store = None


class GlooCommunicator(Communicator):
    """torch's ProcessGroupGloo on the group's store (CPU hosts; its timeout bounds every broadcast)."""

    backend = "gloo"

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout_s: float,
                 label: str = "") -> None:
        from torch.distributed import PrefixStore, ProcessGroupGloo

        super().__init__(host, port, rank, world_size, timeout_s, label)
        self.pg = ProcessGroupGloo(PrefixStore(f"{_KEY}/gloo/", self.store), self.rank, self.world_size,
                                   timedelta(seconds=self.timeout_s))

    def _broadcast(self, tensor: Any, src: int) -> None:
        self.pg.broadcast(tensor, src).wait()

    def close(self) -> None:
        try:
            self.pg.shutdown()
        except Exception:  # noqa: BLE001 - closing a group whose peers are gone must not mask the real error
            pass
        super().close()


class _PyCommunicator(Communicator):
    """vLLM's PyNccl / vllm-ascend's PyHccl on a StatelessProcessGroup, refusing the silent no-op mode.

    The collective is enqueued on the current stream; completion is awaited by polling an event, so a
    peer that never joins the broadcast raises WeightSyncTimeout instead of blocking `synchronize()`.
    """

    def __init__(self, comm_cls: Any, host: str, port: int, rank: int, world_size: int,
                 device: Any, timeout_s: float, platform: Platform, label: str = "") -> None:
        from torch.distributed import PrefixStore
        from vllm.distributed.utils import StatelessProcessGroup

        super().__init__(host, port, rank, world_size, timeout_s, label)
        self.platform = platform
        self.group = StatelessProcessGroup(rank=self.rank, world_size=self.world_size,
                                           store=PrefixStore(f"{_KEY}/xccl/", self.store))
        self.comm = comm_cls(self.group, device=device)
        if getattr(self.comm, "disabled", False) or not getattr(self.comm, "available", True):
            raise WeightSyncError(
                f"{self.label}: {comm_cls.__name__} is disabled (library missing or world_size "
                f"{world_size} == 1); a {self.backend} weight sync would silently move nothing")

    def _broadcast(self, tensor: Any, src: int) -> None:
        stream = self.platform.current_stream()
        self.comm.broadcast(tensor, src=src, stream=stream)
        done = self.platform.torch_module.Event()
        done.record(stream)
        deadline = time.monotonic() + self.timeout_s
        while not done.query():
            if time.monotonic() > deadline:
                raise WeightSyncTimeout(f"{self.label}: a {self.backend} broadcast from {self.describe(src)} "
                                        f"did not complete within {self.timeout_s:g} s")
            time.sleep(1e-4)


class NcclCommunicator(_PyCommunicator):
    backend = "nccl"

    def __init__(self, host: str, port: int, rank: int, world_size: int, device: Any, timeout_s: float,
                 platform: Platform, label: str = "") -> None:
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator

        super().__init__(PyNcclCommunicator, host, port, rank, world_size, device, timeout_s, platform, label)


class HcclCommunicator(_PyCommunicator):
    backend = "hccl"

    def __init__(self, host: str, port: int, rank: int, world_size: int, device: Any, timeout_s: float,
                 platform: Platform, label: str = "") -> None:
        from vllm_ascend.distributed.device_communicators.pyhccl import PyHcclCommunicator

        super().__init__(PyHcclCommunicator, host, port, rank, world_size, device, timeout_s, platform, label)


def make_communicator(platform: Platform, host: str, port: int, rank: int, world_size: int,
                      device: Any = None, timeout_s: float = DEFAULT_TIMEOUT_S, label: str = "") -> Communicator:
    """The platform's weight-sync backend; any failure to form the group is a WeightSyncError.

    Blocks until every rank joined (WeightSyncTimeout naming the missing ranks after `timeout_s`).
    """
    if world_size < 2:
        raise WeightSyncError(f"weight-sync group of world_size {world_size}: needs the trainer and >= 1 worker")
    if not 0 <= rank < world_size:
        raise WeightSyncError(f"weight-sync rank {rank} outside world_size {world_size}")
    try:
        if platform.dist_backend == "gloo":
            return GlooCommunicator(host, port, rank, world_size, timeout_s, label)
        if device is None:
            device = platform.device(platform.torch_module.current_device())
        if platform.dist_backend == "nccl":
            return NcclCommunicator(host, port, rank, world_size, device, timeout_s, platform, label)
        if platform.dist_backend == "hccl":
            return HcclCommunicator(host, port, rank, world_size, device, timeout_s, platform, label)
    except WeightSyncError:
        raise
    except Exception as exc:
        cls = WeightSyncTimeout if _is_timeout(exc) else WeightSyncError
        raise cls(f"{label or f'rank {rank}'}: could not form the {platform.dist_backend} weight-sync group "
                  f"at {host}:{port} as rank {rank}/{world_size}: {exc}") from exc
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
    verify_seconds: float = 0.0  # the trainer's own checksums (part of send_seconds)
    ack_seconds: float = 0.0  # announced rounds: waiting for every receiver's verdict

    def as_metrics(self) -> Dict[str, float]:
        return {"time/weight_sync": self.seconds, "weight_sync/bytes": float(self.bytes),
                "weight_sync/tensors": float(self.tensors), "weight_sync/buckets": float(self.buckets),
                "weight_sync/send_seconds": self.send_seconds, "weight_sync/verify_seconds": self.verify_seconds,
                "weight_sync/ack_seconds": self.ack_seconds}


def _round_key(n: int, what: str) -> str:
    return f"{_KEY}/round/{n}/{what}"


class WeightSyncSender:
    """The trainer's rank 0 of the weight-sync group; one per run, reused for every round.

    Call `init()` only after every receiver's join has been fired (it blocks until all joined);
    `init_weight_sync()` below does both in the right order. `world_size` = 1 + all receivers.
    `send(..., announce=True)` makes a round self-describing for `WeightSyncReceiver`: the manifest and
    the checksums travel through the group's store and the round ends with every receiver's verdict.
    """

    def __init__(self, platform: Platform, master_addr: str = "127.0.0.1", master_port: int = 0,
                 world_size: int = 2, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 timeout_s: float = DEFAULT_TIMEOUT_S, device: Any = None, label: str = "trainer sender") -> None:
        self.platform = platform
        self.master_addr = master_addr
        self.master_port = master_port or free_port(master_addr)
        self.world_size = int(world_size)
        self.bucket_bytes = int(bucket_bytes)
        self.timeout_s = float(timeout_s)
        self.device = device
        self.label = label
        self.comm: Optional[Communicator] = None
        self.history: List[SyncStats] = []
        self.announced = 0  # announced rounds so far; receivers count the same way
        self._round: Optional[Dict[str, Any]] = None

    def init(self) -> None:
        self.comm = make_communicator(self.platform, self.master_addr, self.master_port, 0, self.world_size,
                                      device=self.device, timeout_s=self.timeout_s, label=self.label)

    # -- round protocol: start -> send_bucket* -> finish
    def start(self, version: int, manifest: Sequence[ManifestEntry]) -> List[List[Tuple[int, int, int]]]:
        if self.comm is None:
            raise WeightSyncError("weight sync not initialised: call init() first")
        if not manifest:
            raise WeightSyncError(f"weight sync round for version {version} has no tensors to send")
        buckets = plan_buckets(manifest, self.bucket_bytes)
        self._round = {"version": version, "manifest": list(manifest), "t0": time.perf_counter(),
                       "bytes": 0, "buckets": 0, "checksums": {}, "verify": 0.0, "announced": None}
        return buckets

    def send_bucket(self, tensors: Sequence[Any], bucket: Sequence[Tuple[int, int, int]]) -> None:
        """Broadcast one bucket; `tensors` is indexed like the round's manifest."""
        if self._round is None or self.comm is None:
            raise WeightSyncError("send_bucket outside a round: call start() first")
        flat = pack_bucket(tensors, bucket, self._device())
        try:
            self.comm.broadcast(flat, src=0)
        except WeightSyncError as exc:
            r, self._round = self._round, None
            raise type(exc)(f"version {r['version']}: {exc}{self._waiting_for(r)}") from exc
        except Exception as exc:
            self._round = None
            raise WeightSyncError(f"weight broadcast failed ({self.comm.backend}): {exc}") from exc
        t0 = time.perf_counter()
        for i, _, size in bucket:
            self._round["checksums"][self._round["manifest"][i][0]] = tensor_checksum(tensors[i])
            self._round["bytes"] += size
        self._round["verify"] += time.perf_counter() - t0
        self._round["buckets"] += 1

    def finish(self) -> SyncStats:
        if self._round is None:
            raise WeightSyncError("finish outside a round")
        r, self._round = self._round, None
        if r["bytes"] == 0:
            raise WeightSyncError(f"weight sync round for version {r['version']} moved no bytes")
        dt = time.perf_counter() - r["t0"]
        stats = SyncStats(version=r["version"], tensors=len(r["checksums"]), bytes=r["bytes"],
                          buckets=r["buckets"], seconds=dt, checksums=r["checksums"], send_seconds=dt,
                          verify_seconds=r["verify"])
        if r["announced"] is not None:
            self._collect_verdicts(r["announced"], stats)
            stats.verified = True
            stats.seconds = time.perf_counter() - r["t0"]
        self.history.append(stats)
        return stats

    def send(self, version: int, named_tensors: Iterable[Tuple[str, Any]], announce: bool = False) -> SyncStats:
        """A whole round: every tensor, bucket by bucket, in manifest order.

        `announce=True`: first publish the manifest, after the buckets the checksums, then wait until
        every receiver reported its verdict (WeightSyncError naming the receivers that disagree,
        WeightSyncTimeout naming those that did not answer).
        """
        pairs = list(named_tensors)
        manifest = make_manifest(pairs)
        buckets = self.start(version, manifest)
        if announce:
            self._announce(version, manifest)
        tensors = [t for _, t in pairs]
        for bucket in buckets:
            self.send_bucket(tensors, bucket)
        return self.finish()

    def close(self) -> None:
        if self.comm is not None:
            self.comm.close()
            self.comm = None

    # -- announced rounds
    def _announce(self, version: int, manifest: Sequence[ManifestEntry]) -> None:
        assert self.comm is not None and self._round is not None
        self.announced += 1
        header = {"version": int(version), "bucket_bytes": self.bucket_bytes,
                  "manifest": [[n, list(s), d] for n, s, d in manifest]}
        self.comm.store.set(_round_key(self.announced, "header"), json.dumps(header))
        self._round["announced"] = self.announced

    def _collect_verdicts(self, n: int, stats: SyncStats) -> None:
        assert self.comm is not None
        comm, store = self.comm, self.comm.store
        t0 = time.perf_counter()
        store.set(_round_key(n, "checksums"), json.dumps(stats.checksums))
        receivers = range(1, self.world_size)
        keys = {r: _round_key(n, f"verdict/{r}") for r in receivers}
        if not _wait_all(store, list(keys.values()), self.timeout_s, self.label):
            silent = [comm.describe(r) for r, k in keys.items() if not store.check([k])]
            raise WeightSyncTimeout(f"{self.label}: version {stats.version}: no verdict within "
                                    f"{self.timeout_s:g} s from {', '.join(silent)}")
        verdicts = {r: json.loads(store.get(k)) for r, k in keys.items()}
        stats.ack_seconds = time.perf_counter() - t0
        for what in ("header", "checksums", *(f"ready/{r}" for r in receivers), *(f"verdict/{r}" for r in receivers)):
            store.delete_key(_round_key(n, what))
        bad = {r: v for r, v in verdicts.items() if v.get("bad")}
        if bad:
            parts = [f"{comm.describe(r)}: {len(v['bad'])} tensors, e.g. {v['bad'][:3]}" for r, v in bad.items()]
            raise WeightSyncError(f"{self.label}: version {stats.version}: receivers hold other weights than the "
                                  f"sender sent (checksum mismatch): {'; '.join(parts)}")

    def _waiting_for(self, r: Dict[str, Any]) -> str:
        """For a failed broadcast of an announced round: the receivers that never started it."""
        n, comm = r.get("announced"), self.comm
        if n is None or comm is None or comm.store is None:
            return ""
        try:
            absent = [comm.describe(k) for k in range(1, self.world_size)
                      if not comm.store.check([_round_key(n, f"ready/{k}")])]
        except Exception:  # noqa: BLE001 - a diagnostic only: an unreachable store adds nothing to the message
            return ""
        if absent:
            return f"; never started receiving this round: {', '.join(absent)}"
        return "; every receiver had started the round (one stopped answering)"

    def _device(self) -> Any:
        if self.device is not None:
            return self.device
        return self.platform.device(self._device_index())

    def _device_index(self) -> int:
        return int(self.platform.torch_module.current_device()) if self.platform.is_accelerator else 0


# ---------------------------------------------------------------------------------------- receiver side
class WeightSyncReceiver:
    """One receiving rank of announced rounds, in any process (a rollout worker, a test).

    It needs nothing but the group: the manifest arrives through the group's store, the buckets through
    the communicator, the sender's checksums after them; the verdict goes back to the sender. With
    `reuse_buffers` the previous round's buffers are received into when the manifest is unchanged, so
    tensors a loader aliased (`param.data = tensor`) see the new weights without a second device copy.
    """

    def __init__(self, platform: Platform, master_addr: str, master_port: int, rank: int, world_size: int,
                 device: Any = None, timeout_s: float = DEFAULT_TIMEOUT_S, label: str = "",
                 reuse_buffers: bool = True) -> None:
        self.platform = platform
        self.master_addr, self.master_port = master_addr, int(master_port)
        self.rank, self.world_size = int(rank), int(world_size)
        self.device = device
        self.timeout_s = float(timeout_s)
        self.label = label or f"receiver rank {rank}"
        self.reuse_buffers = reuse_buffers
        self.comm: Optional[Communicator] = None
        self.rounds = 0
        self.last: Dict[str, float] = {}  # timings of the last round
        self._buffers: Optional[Tuple[Any, List[Any]]] = None  # (plan key, flat buffers)

    def init(self) -> None:
        self.comm = make_communicator(self.platform, self.master_addr, self.master_port, self.rank,
                                      self.world_size, device=self.device, timeout_s=self.timeout_s,
                                      label=self.label)

    def receive(self) -> Tuple[int, List[Tuple[str, Any]]]:
        """One round: (version, [(name, tensor)] in the sender's order); raises on mismatch or timeout."""
        if self.comm is None:
            raise WeightSyncError(f"{self.label}: not in a weight-sync group: call init() first")
        comm, store, n = self.comm, self.comm.store, self.rounds + 1
        t0 = time.perf_counter()
        store.set(_round_key(n, f"ready/{self.rank}"), b"1")
        sender = comm.describe(0)
        header = json.loads(_wait_key(store, _round_key(n, "header"), self.timeout_s,
                                      f"{self.label}: {sender} did not start weight-sync round {n}"))
        version = int(header["version"])
        manifest: List[ManifestEntry] = [(m[0], tuple(m[1]), m[2]) for m in header["manifest"]]
        buckets = plan_buckets(manifest, int(header["bucket_bytes"]))
        flats = self._flats(manifest, header["bucket_bytes"], buckets)
        t1 = time.perf_counter()
        pairs: List[Tuple[str, Any]] = []
        for i, (bucket, flat) in enumerate(zip(buckets, flats)):
            try:
                comm.broadcast(flat, src=0)
            except WeightSyncError as exc:
                raise type(exc)(f"version {version}, bucket {i + 1}/{len(buckets)}: {exc}") from exc
            pairs.extend(unpack_bucket(flat, manifest, bucket))
        t2 = time.perf_counter()
        mine = {name: tensor_checksum(t) for name, t in pairs}
        t3 = time.perf_counter()
        theirs = json.loads(_wait_key(store, _round_key(n, "checksums"), self.timeout_s,
                                      f"{self.label}: {sender} sent no checksums for version {version}"))
        bad = checksums_match(theirs, mine)
        self.rounds = n
        store.set(_round_key(n, f"verdict/{self.rank}"), json.dumps({"bad": bad}))
        self.last = {"wait_seconds": t1 - t0, "recv_seconds": t2 - t1, "verify_seconds": t3 - t2,
                     "seconds": time.perf_counter() - t0}
        if bad:
            raise WeightSyncError(f"{self.label}: version {version}: {len(bad)} received tensors differ from "
                                  f"what {sender} sent (checksum mismatch), e.g. {bad[:3]}")
        return version, pairs

    def _flats(self, manifest: Sequence[ManifestEntry], bucket_bytes: int,
               buckets: Sequence[Sequence[Tuple[int, int, int]]]) -> List[Any]:
        import torch

        key = (tuple(manifest), int(bucket_bytes))
        if self.reuse_buffers and self._buffers is not None and self._buffers[0] == key:
            return self._buffers[1]
        device = self.device if self.device is not None else self.platform.device(
            int(self.platform.torch_module.current_device()) if self.platform.is_accelerator else 0)
        flats = [torch.empty(bucket_size(b), dtype=torch.uint8, device=device) for b in buckets]
        self._buffers = (key, flats) if self.reuse_buffers else None
        return flats

    def close(self) -> None:
        self._buffers = None
        if self.comm is not None:
            self.comm.close()
            self.comm = None


# ------------------------------------------------------------------------------------ both sides at once
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
