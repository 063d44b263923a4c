"""Learning curve of the CPU demo task under the reference GRPO trainer, with the pure-HF sampler.

Shows (1) the mean reward rising within a few dozen GRPO steps from a random tiny model, and (2) the
response lengths moving while it learns: per-prompt lengths first follow the per-prompt caps, then shrink
toward the targets, so last epoch's lengths are a drifting predictor (why ASP re-plans from the history).

    python benchmarks/bench_demo_learning.py --steps 40 --out benchmarks/results/demo_learning.json

Sampling here is HF `generate` on one process (the real runs use vLLM instances); one core suffices.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time

from _results import write_results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--prompts", type=int, default=64, help="dataset size")
    ap.add_argument("--groups", type=int, default=8, help="prompt groups per step (minibatch M)")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model-dir", default=None, help="tiny model directory (default: the shared cache)")
    ap.add_argument("--out", default=None, help="write the per-step rows as JSON here")
    args = ap.parse_args(argv)

    import numpy as np
    import torch
    from tqdm import tqdm

    from mindspeed_asp.runtime.tasks.demo import DemoTask
    from mindspeed_asp.runtime.hf_sampler import sample_groups
    from mindspeed_asp.runtime.tiny_model import ensure_tiny_model
    from mindspeed_asp.runtime.trainer import GRPOTrainer

    torch.set_num_threads(args.threads)
    path = ensure_tiny_model(args.model_dir, seed=args.seed)
    task = DemoTask(args.prompts, seed=args.seed)
    trainer = GRPOTrainer(path, lr=args.lr, seed=args.seed, micro_batch_size=64)
    rng = random.Random(args.seed)
    rows = []
    t0 = time.time()
    for step in tqdm(range(args.steps), desc="GRPO steps", file=sys.stderr):
        batch = rng.sample(task.prompts(), args.groups)
        groups = sample_groups(trainer.model, batch, n=args.n, eos_token_id=task.eos_token_id,
                               version=trainer.version, seed=args.seed * 100003 + step)
        rewards = [[task.reward(g.prompt_id, s.token_ids) for s in g.samples] for g in groups]
        lengths = [[len(s.token_ids) for s in g.samples] for g in groups]
        targets = [task.target_len(g.prompt_id) for g in groups]
        stats = trainer.train_step(groups, rewards)
        group_mean = np.array([np.mean(x) for x in lengths])
        rows.append({
            "step": step, "reward_mean": stats["reward_mean"],
            "stop_share": float(np.mean([s.finish_reason == "stop" for g in groups for s in g.samples])),
            "response_len_mean": float(np.mean(group_mean)),
            "response_len_max_over_mean": float(max(max(x) for x in lengths) / np.mean(group_mean)),
            "len_target_log_corr": float(np.corrcoef(np.log(group_mean), np.log(targets))[0, 1]),
            "within_group_cv": float(np.mean([np.std(x) / np.mean(x) for x in lengths])),
            "entropy": stats["entropy"], "bubble/padding_train": stats["bubble/padding_train"],
            "train_time": stats["time"], "elapsed": time.time() - t0,
        })
    print(f"{'step':>4} {'reward':>7} {'stop':>5} {'len':>6} {'max/mean':>8} {'corr':>5} {'cv':>5} {'entropy':>7}")
    for r in rows:
        print(f"{r['step']:>4} {r['reward_mean']:7.3f} {r['stop_share']:5.2f} {r['response_len_mean']:6.1f} "
              f"{r['response_len_max_over_mean']:8.2f} {r['len_target_log_corr']:5.2f} "
              f"{r['within_group_cv']:5.2f} {r['entropy']:7.2f}")
    k = max(1, min(5, len(rows) // 4))
    first = float(np.mean([r["reward_mean"] for r in rows[:k]]))
    last = float(np.mean([r["reward_mean"] for r in rows[-k:]]))
    summary = {"steps": args.steps, "lr": args.lr, "reward_first": first, "reward_last": last,
               "len_first": float(np.mean([r["response_len_mean"] for r in rows[:k]])),
               "len_last": float(np.mean([r["response_len_mean"] for r in rows[-k:]])),
               "seconds": time.time() - t0, "window": k}
    print(json.dumps(summary))
    if args.out:
        write_results(args.out, {"summary": summary, "rows": rows}, __file__, argv, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
