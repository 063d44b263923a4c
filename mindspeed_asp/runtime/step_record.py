"""The record of one training update, as metrics.jsonl and the progress bar show it.

Keys are the metric names of docs/runtime.md ("What a run writes"): `time/*` split the iteration into the
wait for rollout, the update and the weight sync; `throughput/e2e_tps` counts every device the run uses;
the queue and policy counters are the rollout control's at the end of the update.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Sequence

import numpy as np

from mindspeed_asp.core.metrics import e2e_tps
from mindspeed_asp.runtime.run_recorder import offpolicy_fields


@dataclass(frozen=True)
class StepTimes:
    """Wall-clock marks of one update: the previous update's end, minibatch ready, trained, synced."""

    start: float
    ready: float
    trained: float
    end: float

    @property
    def iteration(self) -> float:
        return self.end - self.start


def step_record(step: int, version: int, times: StepTimes, run_t0: float, stats: Dict[str, Any],
                sync: Dict[str, Any], rewards: Sequence[Sequence[float]], gids: List[int],
                counters: Dict[str, int], in_flight: int, devices: int) -> Dict[str, Any]:
    """One metrics.jsonl row (the caller adds the memory sample)."""
    tokens = int(stats["tokens_total"])
    return {
        "step": step, "version": version, "t_end": times.end - run_t0,
        "time/iteration": times.iteration, "time/rollout": times.ready - times.start,
        "time/train": times.trained - times.ready, "time/weight_sync": sync.get("seconds", 0.0),
        "tokens/trained": tokens, "tokens/response": int(stats["tokens"]),
        "throughput/e2e_tps": e2e_tps(tokens, times.iteration, devices),
        "reward/mean": float(np.mean([r for rs in rewards for r in rs])),
        "loss": float(stats["loss"]), "grad_norm": float(stats["grad_norm"]),
        "clip_frac": float(stats["clip_frac"]), "kl": float(stats["kl"]),
        "bubble/padding_train": float(stats["bubble/padding_train"]),
        "response_len/mean": float(stats["response_len_mean"]),
        "queue/groups": counters["queue/occupancy"], "in_flight": in_flight,
        "weights/verified": bool(sync.get("verified", False)),
        "gids": gids, **{k: v for k, v in counters.items() if k.startswith("queue/") and k != "queue/occupancy"},
        **offpolicy_fields(stats),
    }


def bar_postfix(rec: Dict[str, Any], lags: Sequence[int]) -> Dict[str, Any]:
    """What the progress bar shows after an update."""
    return {"reward": f"{rec['reward/mean']:.3f}", "lag": max(lags) if lags else 0, "queue": rec["queue/groups"],
            "tps": f"{rec['tokens/trained'] / max(rec['time/iteration'], 1e-9):.0f}"}
