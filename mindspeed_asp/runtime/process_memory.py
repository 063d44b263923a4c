"""Resident memory of a run: the driver (trainer) plus every instance process and its children.

Sampled once per update for the summary's `memory/peak_rss_gib`; each process is counted once, Ray's own
daemons are not counted. Without psutil (a core-only install) nothing is sampled.
"""
from __future__ import annotations

import os
from typing import Iterable, Optional


def rss_gib(pids: Iterable[int]) -> Optional[float]:
    """Total RSS in GiB of this process and of `pids` with their children; None without psutil."""
    try:
        import psutil
    except ImportError:
        return None
    procs = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs[p.pid] = p
            procs.update({c.pid: c for c in p.children(recursive=True)})
        except Exception:  # noqa: BLE001 - a process that just died
            continue
    procs[os.getpid()] = psutil.Process(os.getpid())
    total = 0
    for p in procs.values():
        try:
            total += p.memory_info().rss
        except Exception:  # noqa: BLE001 - a process that just died
            continue
    return total / (1 << 30)
