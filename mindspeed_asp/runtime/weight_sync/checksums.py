"""The bounded-memory, position-weighted tensor checksum every weight-sync round is verified with.

Why its own module: the sender, every receiver (vLLM workers, the MindSpeed-RL rollout workers) and the
benchmarks compute the same value from the same bits, so the definition lives once, with nothing but
torch behind it (no Ray, no communicator): importing it in a worker costs nothing else.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Dict, List, Optional

#: Position weights repeat every block; part of the checksum's definition, identical on every side.
CHECKSUM_BLOCK = 1 << 14
#: Elements checked per step (a whole number of blocks). The value does not depend on it; the extra
#: memory does: one fp32 copy of a chunk (4 MiB on CPU, 16 MiB on an accelerator).
CHECKSUM_CHUNK_CPU = 1 << 20
CHECKSUM_CHUNK_ACCEL = 1 << 22


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
