"""The receiving side of announced rounds: `WeightSyncReceiver`, one rank of the group in any process.

Why its own module: a receiver needs nothing but the group (the manifest arrives through the store,
the buckets through the communicator, the sender's checksums after them) and reports its verdict back,
so it is usable outside the vLLM worker extension: by the MindSpeed-RL rollout workers and by tests.
"""
from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mindspeed_asp.errors import WeightSyncError
from mindspeed_asp.runtime.platform import Platform
from mindspeed_asp.runtime.weight_sync.buckets import ManifestEntry, bucket_size, plan_buckets, unpack_bucket
from mindspeed_asp.runtime.weight_sync.checksums import checksums_match, tensor_checksum
from mindspeed_asp.runtime.weight_sync.communicators import DEFAULT_TIMEOUT_S, Communicator, make_communicator
from mindspeed_asp.runtime.weight_sync.group_store import round_key, wait_key


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
        store.set(round_key(n, f"ready/{self.rank}"), b"1")
        sender = comm.describe(0)
        header = json.loads(wait_key(store, round_key(n, "header"), self.timeout_s,
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
        theirs = json.loads(wait_key(store, round_key(n, "checksums"), self.timeout_s,
                                      f"{self.label}: {sender} sent no checksums for version {version}"))
        bad = checksums_match(theirs, mine)
        self.rounds = n
        store.set(round_key(n, f"verdict/{self.rank}"), json.dumps({"bad": bad}))
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

