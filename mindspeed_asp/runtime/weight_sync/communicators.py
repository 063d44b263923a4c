"""The communicators: one member of the weight-sync group per backend (gloo on CPU, NCCL on GPU, HCCL on NPU).

Why its own module: the three backends form their groups differently (torch's ProcessGroupGloo, vLLM's
PyNccl, vllm-ascend's PyHccl on a StatelessProcessGroup) but the sender and receivers need only
`broadcast(tensor, src)` with a deadline. PyNccl and PyHccl turn every collective into a silent no-op
when their library is missing, so a disabled communicator is refused here, when the group is formed,
and a broadcast that fails or outlives its deadline breaks the group loudly.
"""
from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from mindspeed_asp.errors import WeightSyncError, WeightSyncTimeout
from mindspeed_asp.runtime.platform import Platform
from mindspeed_asp.runtime.weight_sync.group_store import KEY, is_timeout, join_group, open_store

DEFAULT_TIMEOUT_S = 120.0


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
        self.store = open_store(host, port, self.rank, self.timeout_s, self.label)
        self.labels = join_group(self.store, self.rank, self.world_size, self.label, self.timeout_s, self.where)

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
            if is_timeout(exc):
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
        self.pg = ProcessGroupGloo(PrefixStore(f"{KEY}/gloo/", self.store), self.rank, self.world_size,
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
                                           store=PrefixStore(f"{KEY}/xccl/", self.store))
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
        cls = WeightSyncTimeout if is_timeout(exc) else WeightSyncError
        raise cls(f"{label or f'rank {rank}'}: could not form the {platform.dist_backend} weight-sync group "
                  f"at {host}:{port} as rank {rank}/{world_size}: {exc}") from exc
    raise WeightSyncError(f"no weight-sync backend for collective {platform.dist_backend!r}")

