"""The bucket layout of a round: a manifest of HF names, shapes and dtypes, and the buckets cut from it.

Why its own module: both ends of a round compute the same plan from the same manifest, so only tensor
bytes travel through the collective; the plan is pure arithmetic on the manifest (torch for dtypes and
the flat buffers, no Ray, no communicator), shared by the sender, the receivers and the vLLM workers.
"""
from __future__ import annotations

from typing import Any, Iterable, List, Sequence, Tuple

from mindspeed_asp.errors import WeightSyncError

DEFAULT_BUCKET_BYTES = 64 << 20
_ALIGN = 64  # byte alignment of each tensor inside a bucket, so any dtype view is legal

ManifestEntry = Tuple[str, Tuple[int, ...], str]  # (HF name, shape, dtype name e.g. "float32")


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
