"""How well are response lengths predicted? The figures of that section of docs/benchmarks.md, in one run.

    python benchmarks/bench_lengths.py --alpaca PATH/alpaca-train-10k-length.json \
        --json benchmarks/results/lengths.json

Runs the same estimators and metrics as `asp lengths eval` (`make_estimator`, `length_metrics.evaluate`):
- the public alpaca trace: predict one temperature's response from the other three (history, cold start,
  oracle), and the history estimator's variants (recency decay, one prior sample, other held-out columns);
- the synthetic RL regime (4096 prompts x 8, 3 history epochs), and with a strong global trend with and
  without the drift factor;
- group-max calibration: coverage of the q-quantile of the group maximum for several q (3000 prompts);
- the shape of the synthetic workload's predicted epoch (`tail_statistics`);
- speed: `HistoryEstimator.estimate` on 10^5 prompts x 4 epochs x n = 8, CPU seconds of this process.
Without --alpaca the alpaca rows are left out (the JSON says so); the synthetic rows need no data.
"""
from __future__ import annotations

import argparse
import time
from typing import Dict, Optional

from mindspeed_asp.config import EstimatorSection
from mindspeed_asp.scheduler.estimators import HistoryEstimator, make_estimator
from mindspeed_asp.scheduler.length_metrics import evaluate
from mindspeed_asp.workloads.spec import workload_from_spec
from mindspeed_asp.workloads.synthetic import SyntheticRLWorkload, tail_statistics
from _results import write_results

ESTIMATORS = ("history", "cold_start", "oracle")
ALPACA_VARIANTS = {  # label -> (held-out column, estimator-section overrides); history estimator only
    "default (--target t0.7)": ("t0.7", {}),
    "--recency-decay 0.8": ("t0.7", {"recency_decay": 0.8}),
    "--recency-decay 1.0": ("t0.7", {"recency_decay": 1.0}),
    "--max-epochs 1 (one prior sample)": ("t0.7", {"max_epochs": 1}),
    "--target t0.5": ("t0.5", {}),
    "--target t0.3": ("t0.3", {}),
    "--target t0.0": ("t0.0", {}),
}
SYNTHETIC = "synthetic:prompts=4096,n=8,seed=0,epochs=3"
SYNTHETIC_TREND = "synthetic:prompts=4096,n=8,seed=0,epochs=3,trend=0.15"
QUANTILES = (0.5, 0.8, 0.9, 0.95)


def score(spec: str, kinds=ESTIMATORS, **overrides) -> Dict[str, Dict[str, float]]:
    """Metrics of each estimator kind on the workload `spec` (the `asp lengths eval` computation)."""
    wl = workload_from_spec(spec)
    out = {}
    for kind in kinds:
        section = EstimatorSection().model_copy(update={"kind": kind, **overrides})
        est = make_estimator(section, true_lengths=wl.truth).estimate(wl.prompts, wl.history, wl.max_new_tokens)
        out[kind] = evaluate(est, wl.truth)
    return out


def alpaca_rows(path: Optional[str]) -> Dict[str, object]:
    if path is None:
        return {"skipped": "no --alpaca trace given"}
    main = score(f"alpaca:{path}?target=t0.7")
    variants = {label: score(f"alpaca:{path}?target={col}", ("history",), **kw)["history"]
                for label, (col, kw) in ALPACA_VARIANTS.items()}
    return {"estimators": main, "history_variants": variants}


def calibration() -> Dict[str, float]:
    wl = SyntheticRLWorkload(3000, n=8, epochs=4, seed=11)
    hist, truth = wl.history(3), wl.lengths(3)
    return {str(q): evaluate(HistoryEstimator(group_max_quantile=q).estimate(wl.prompts, hist, wl.max_new_tokens),
                             truth)["group_max_coverage"] for q in QUANTILES}


def estimate_speed(prompts: int = 100_000) -> Dict[str, float]:
    wl = SyntheticRLWorkload(prompts, n=8, epochs=5, seed=0)
    hist = wl.history(4)
    t = time.process_time()
    HistoryEstimator().estimate(wl.prompts, hist, wl.max_new_tokens)
    return {"prompts": prompts, "epochs": 4, "n": 8, "samples": prompts * 4 * 8,
            "estimate_cpu_s": time.process_time() - t}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--alpaca", default=None, help="alpaca-train-10k-length.json (the public length trace)")
    ap.add_argument("--json", required=True, help="results file to write")
    args = ap.parse_args()
    report = {
        "alpaca": alpaca_rows(args.alpaca),
        "synthetic": {"spec": SYNTHETIC, "estimators": score(SYNTHETIC),
                      "predicted_epoch_shape": tail_statistics(workload_from_spec(SYNTHETIC).truth)},
        "synthetic_trend": {"spec": SYNTHETIC_TREND,
                            "drift": score(SYNTHETIC_TREND, ("history",))["history"],
                            "no_drift": score(SYNTHETIC_TREND, ("history",), drift=False)["history"]},
        "calibration": {"workload": "SyntheticRLWorkload(3000, n=8, seed=11), 3 history epochs",
                        "coverage_by_q": calibration()},
        "speed": estimate_speed(),
    }
    print(write_results(args.json, report, __file__))


if __name__ == "__main__":
    main()
