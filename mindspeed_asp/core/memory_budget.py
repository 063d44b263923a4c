"""Refusing sizes too large to plan or simulate, with an estimate, before anything is allocated.

numpy allocates what it is asked for and fails late (a MemoryError traceback), or the machine swaps for
minutes; a planning pass over `groups x n` samples on `instances x slots` slots has a predictable footprint,
so a command estimates it first and refuses with the estimate and what this machine has free.
The per-item costs are deliberately generous upper bounds: a refusal should only hit sizes that could never run.
`check_kv_budget` refuses the other size that can never run: a per-instance KV budget below one sequence.
"""
from __future__ import annotations

import os
from typing import Optional

from mindspeed_asp.errors import InputError

#: Bytes per sampled length while planning or simulating (lengths, estimates, event times, several copies).
BYTES_PER_SAMPLE = 96
#: Bytes per instance (Python-level queue, heap entries and per-instance arrays in planners and simulator).
BYTES_PER_INSTANCE = 2048
#: Bytes per concurrent slot (the simulator's per-slot state).
BYTES_PER_SLOT = 64
#: Bytes per synthesised length per epoch (latent float64 plus the int64 length and its history copy).
BYTES_PER_SYNTH_SAMPLE = 48
#: Override of the free memory, in GiB (tests; shared nodes where MemAvailable overstates the share).
LIMIT_ENV = "ASP_MEMORY_LIMIT_GB"


def available_bytes() -> int:
    """Memory this process may use: ASP_MEMORY_LIMIT_GB, else MemAvailable, else physical memory."""
    raw = os.environ.get(LIMIT_ENV)
    if raw:
        try:
            return int(float(raw) * 2**30)
        except ValueError:
            raise InputError(f"must be a number of GiB, got {raw!r}", key=LIMIT_ENV) from None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 1 << 62  # unknown: do not refuse


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.1f} GiB"


def check_fits(estimate: float, what: str, key: Optional[str] = None) -> None:
    """Refuse when `estimate` bytes exceed the free memory, naming `what` and the option (`key`)."""
    free = available_bytes()
    if estimate > free:
        raise InputError(f"{what} needs about {_gib(estimate)} of memory, this machine has {_gib(free)} free; "
                         "use smaller sizes", key=key)


def planning_bytes(groups: int, n: int, instances: int, slots: int) -> float:
    """Upper estimate of a planning or simulation pass over `groups x n` samples on `instances x slots`."""
    return (float(groups) * float(n) * BYTES_PER_SAMPLE + float(instances) * BYTES_PER_INSTANCE
            + float(instances) * float(slots) * BYTES_PER_SLOT)


def synthesis_bytes(prompts: int, n: int, epochs: int) -> float:
    """Upper estimate of synthesising `epochs` epochs of `prompts x n` lengths."""
    return float(prompts) * float(n) * float(max(epochs, 1)) * BYTES_PER_SYNTH_SAMPLE


def check_kv_budget(kv_budget: Optional[int], prompt_lens, max_new_tokens: int, key: str = "--kv-budget") -> None:
    """Refuse a KV budget (tokens per instance) that cannot hold the longest prompt plus the generation cap.

    Why: such a sequence could never be admitted (the simulator refuses it deep inside a run, and vLLM does not
    start an engine whose KV cache is below its max_model_len), so the command says so before any work."""
    if kv_budget is None or len(prompt_lens) == 0:
        return
    longest = int(max(prompt_lens))
    need = longest + int(max_new_tokens)
    if kv_budget < need:
        raise InputError(f"{kv_budget} KV tokens per instance cannot hold one sequence: the longest prompt "
                         f"({longest} tokens) plus the generation cap ({int(max_new_tokens)}) needs {need}",
                         key=key)
