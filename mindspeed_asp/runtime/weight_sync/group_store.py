"""The weight-sync group's control plane: a TCPStore hosted by rank 0.

Why it exists: every member announces itself there (so a missing rank can be named), the backends form
their groups through it, and announced rounds carry their manifest, checksums and verdicts through it,
so a receiver needs nothing but the group's address. The communicators, the sender and the receiver all
speak through these helpers; the keys they use are built here, under one prefix.
"""
from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any, Dict, Sequence, Tuple

from mindspeed_asp.errors import WeightSyncError, WeightSyncTimeout

KEY = "asp/ws"  # prefix of every control-plane key in the group's store


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port on `host` (loopback only by default)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])



def is_timeout(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "timed out" in text or "timeout" in text


_HOSTED: Dict[Tuple[str, int], Any] = {}  # stores bound by `host_store`, taken by this process's rank 0


def host_store(host: str, port: int, timeout_s: float, label: str = "sender") -> None:
    """Bind the group's TCPStore now, as rank 0 will use it: a port another process took since it was probed
    fails here at once (WeightSyncError carrying EADDRINUSE), before any member is told the address. The
    sender's Communicator in this process then takes this store instead of binding again."""
    _HOSTED[(str(host), int(port))] = open_store(host, port, 0, timeout_s, label)


def open_store(host: str, port: int, rank: int, timeout_s: float, label: str) -> Any:
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


def join_group(store: Any, rank: int, world_size: int, label: str, timeout_s: float, where: str) -> Dict[int, str]:
    """Announce this member and wait for all; returns every rank's label. Names the ranks that never came."""
    key = f"{KEY}/join/{rank}"
    token = f"{socket.gethostname()}:{os.getpid()}:{id(store)}|{label}"
    held = store.compare_set(key, "", token).decode()
    if held != token:
        raise WeightSyncError(f"{label}: rank {rank} of the weight-sync group at {where} is already taken by "
                              f"{held.split('|', 1)[-1]!r}")
    keys = [f"{KEY}/join/{r}" for r in range(world_size)]
    if not wait_all(store, keys, timeout_s, f"{label}: joining the weight-sync group at {where}"):
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        raise WeightSyncTimeout(f"{label}: weight-sync group at {where}: rank(s) "
                                f"{', '.join(map(str, missing))} of {world_size} did not join within "
                                f"{timeout_s:g} s")
    return {r: store.get(k).decode().split("|", 1)[-1] for r, k in enumerate(keys)}


def wait_all(store: Any, keys: Sequence[str], timeout_s: float, what: str) -> bool:
    """Block until every key exists (True) or the deadline passes (False); a lost store raises."""
    try:
        store.wait(list(keys), timedelta(seconds=timeout_s))
        return True
    except Exception as exc:
        if is_timeout(exc):
            return False
        raise WeightSyncError(f"{what}: lost the weight-sync group's store ({exc})") from exc


def wait_key(store: Any, key: str, timeout_s: float, what: str) -> bytes:
    """The value of `key` once set; WeightSyncTimeout(`what` ...) after `timeout_s`."""
    if not wait_all(store, [key], timeout_s, what):
        raise WeightSyncTimeout(f"{what} within {timeout_s:g} s")
    return store.get(key)



def round_key(n: int, what: str) -> str:
    """The store key of `what` in announced round `n` (sender and receivers count rounds alike)."""
    return f"{KEY}/round/{n}/{what}"

