"""The trainer's side of the weight sync: `WeightSyncSender` (rank 0) and the `SyncStats` of each round.

Why its own module: the sender owns the round protocol (start -> send_bucket* -> finish), its
checksums and, for announced rounds, the manifest it publishes and the verdicts it collects, naming
the receivers that disagree or never answered. It runs in any process (the driver, a Megatron rank)
and needs no Ray; `instance_sync` adds the Ray calls that drive vLLM instances alongside it.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from mindspeed_asp.errors import WeightSyncError, WeightSyncTimeout
from mindspeed_asp.runtime.platform import Platform
from mindspeed_asp.runtime.weight_sync.buckets import (
    DEFAULT_BUCKET_BYTES,
    ManifestEntry,
    make_manifest,
    pack_bucket,
    plan_buckets,
)
from mindspeed_asp.runtime.weight_sync.checksums import tensor_checksum
from mindspeed_asp.runtime.weight_sync.communicators import DEFAULT_TIMEOUT_S, Communicator, make_communicator
from mindspeed_asp.runtime.weight_sync.group_store import free_port, round_key, wait_all


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




class WeightSyncSender:
    """The trainer's rank 0 of the weight-sync group; one per run, reused for every round.

    Call `init()` only after every receiver's join has been fired (it blocks until all joined);
    `instance_sync.init_weight_sync()` does both in the right order. `world_size` = 1 + all receivers.
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
        self.comm.store.set(round_key(self.announced, "header"), json.dumps(header))
        self._round["announced"] = self.announced

    def _collect_verdicts(self, n: int, stats: SyncStats) -> None:
        assert self.comm is not None
        comm, store = self.comm, self.comm.store
        t0 = time.perf_counter()
        store.set(round_key(n, "checksums"), json.dumps(stats.checksums))
        receivers = range(1, self.world_size)
        keys = {r: round_key(n, f"verdict/{r}") for r in receivers}
        if not wait_all(store, list(keys.values()), self.timeout_s, self.label):
            silent = [comm.describe(r) for r, k in keys.items() if not store.check([k])]
            raise WeightSyncTimeout(f"{self.label}: version {stats.version}: no verdict within "
                                    f"{self.timeout_s:g} s from {', '.join(silent)}")
        verdicts = {r: json.loads(store.get(k)) for r, k in keys.items()}
        stats.ack_seconds = time.perf_counter() - t0
        for what in ("header", "checksums", *(f"ready/{r}" for r in receivers), *(f"verdict/{r}" for r in receivers)):
            store.delete_key(round_key(n, what))
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
                      if not comm.store.check([round_key(n, f"ready/{k}")])]
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

