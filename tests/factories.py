"""Inputs several test directories build the same way: one definition each, imported by name.

Plain functions rather than fixtures because tests call them with arguments and inside parametrize lists.
`tests/` is on the import path for every test (pytest puts the root conftest's directory there).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Tuple

import numpy as np

from mindspeed_asp.core.problem import CostModel, InstanceSpec, LengthEstimate, PlanningProblem, PromptSet
from mindspeed_asp.sim.bounds import lower_bounds
from mindspeed_asp.sim.train_time import TrainerModel, trainer_for_rho

ROOT = Path(__file__).resolve().parents[1]
SHELL = ROOT / "shell"


# ------------------------------------------------------------------------------------------ `asp plan` inputs
def write_inputs(tmp: Path, G: int = 40, n: int = 4, epochs: int = 2, seed: int = 0) -> Tuple[Path, Path]:
    """A prompt file and a length history of `epochs` epochs (lognormal per-prompt medians, capped at 1024),
    the two inputs `asp plan` reads."""
    rng = np.random.default_rng(seed)
    data = tmp / "prompts.jsonl"
    hist = tmp / "history.jsonl"
    mu = rng.lognormal(5, 0.9, G)
    with data.open("w") as fh:
        for i in range(G):
            fh.write(json.dumps({"prompt_id": f"q{i}", "prompt_len": int(rng.integers(10, 300))}) + "\n")
    with hist.open("w") as fh:
        for e in range(epochs):
            for i in range(G):
                lens = np.minimum(np.rint(mu[i] * rng.lognormal(0, 0.4, n)), 1024).astype(int).tolist()
                fh.write(json.dumps({"prompt_id": f"q{i}", "epoch": e, "lengths": lens}) + "\n")
    return data, hist


def base_args(data: Path, hist: Path, out: Path, *extra: str) -> list:
    """`asp plan`'s arguments for those inputs on 4 instances x 16 slots, minibatch 4, n 4."""
    return ["plan", "--dataset", str(data), "--history", str(hist), "--instances", "4", "--slots", "16",
            "--minibatch", "4", "--n", "4", "--no-progress", "-o", str(out), *extra]


# ------------------------------------------------------------------------------------------ MindSpeed-RL root
def fake_msrl(tmp_path: Path) -> Path:
    """A MindSpeed-RL root as the launcher needs it without NPUs: the package directory, and the model group
    of configs/ that every ASP config's defaults list names (one empty file per model, for Hydra's compose)."""
    import yaml
    msrl = tmp_path / "MindSpeed-RL"
    (msrl / "mindspeed_rl").mkdir(parents=True, exist_ok=True)
    (msrl / "configs" / "model").mkdir(parents=True, exist_ok=True)
    for cfg in (ROOT / "configs").glob("*_asp.yaml"):
        for entry in yaml.safe_load(cfg.read_text()).get("defaults", []):
            for name in (entry.get("model", []) if isinstance(entry, dict) else []):
                (msrl / "configs" / "model" / f"{name}.yaml").write_text(f"{name}_marker: 1\n")
    return msrl


# ------------------------------------------------------------------------------------------ real length traces
def shared_data() -> Path:
    """The directory of the real response-length traces (Alpaca, Splitwise): $ASP_SHARED_DATA, else the data
    directory beside the checkout. Callers skip when a trace is missing, so a bare checkout still passes."""
    env = os.environ.get("ASP_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"


# ------------------------------------------------------------------------------------------ planning problems
def prompt_set(prompt_lens: np.ndarray, n: int, *, prefix: str = "", ids: Optional[Iterable[Any]] = None,
               origin: str = "", sources: Optional[np.ndarray] = None) -> PromptSet:
    """A window's prompts named `{prefix}{id}` (ids default to 0..G-1): tests only need distinct, readable ids.
    `sources` (none by default) is for the cold-start tests, whose feature is the prompt's data source."""
    keys = range(len(prompt_lens)) if ids is None else ids
    return PromptSet(prompt_ids=np.array([f"{prefix}{k}" for k in keys], dtype=object), prompt_lens=prompt_lens,
                     n=n, sources=sources, origin=origin)


def length_estimate(median: np.ndarray, group_max: np.ndarray, *, sigma: float = 0.0,
                    samples: Optional[np.ndarray] = None, estimator: str = "",
                    params: Optional[Dict[str, float]] = None) -> LengthEstimate:
    """A prediction every group has history for, nothing truncated: tests vary only the lengths and the spread.
    `params` (empty by default) is for the tests of what a plan file records of its estimator."""
    G = len(median)
    return LengthEstimate(median=median, group_max=group_max, sigma=np.full(G, float(sigma)), p_trunc=np.zeros(G),
                          has_history=np.ones(G, dtype=bool), estimator=estimator,
                          params={} if params is None else params, samples=samples)


def oracle_estimate(lengths: np.ndarray, estimator: str = "oracle") -> LengthEstimate:
    """The exact lengths [G, n] as the estimate (median, max and samples of the truth): planners and bounds
    then see what the simulator will run. `group_max` keeps the lengths' dtype."""
    return length_estimate(np.median(lengths, 1), lengths.max(1), samples=lengths.astype(np.float64),
                           estimator=estimator)


def planning_problem(prompts: PromptSet, estimate: LengthEstimate, *, instances: int, slots: int, minibatch: int,
                     max_new_tokens: int, kv_budget: Optional[int] = None, cost: Optional[CostModel] = None,
                     rho: float = 1.0, seed: int = 0, max_lag: int = 1, work_stealing: bool = True) -> PlanningProblem:
    """One window on `instances` instances of `slots` slots; the cost model defaults to the package's."""
    return PlanningProblem(prompts=prompts, estimate=estimate, instances=instances,
                           spec=InstanceSpec(slots=slots, kv_budget=kv_budget), minibatch=minibatch,
                           cost=CostModel() if cost is None else cost, max_new_tokens=max_new_tokens, rho=rho,
                           seed=seed, max_lag=max_lag, work_stealing=work_stealing)


def skewed_problem(G: int, m: int = 4, n: int = 8, slots: int = 64, seed: int = 0, oracle: bool = False,
                   minibatch: int = 4, rho: float = 1.0, cap: int = 16384) -> PlanningProblem:
    """A skewed RL-like window: lognormal per-prompt medians, lognormal within-group spread; the estimate is the
    truth (`oracle`) or a noisy history-like one. The planner tests of more than one file plan this window."""
    rng = np.random.default_rng(seed)
    mu = rng.lognormal(np.log(1500), 0.9, G)
    truth = np.minimum(np.rint(mu[:, None] * rng.lognormal(0, 0.5, (G, n))), cap)
    prompts = prompt_set(rng.integers(50, 500, G), n, prefix="p", origin="synthetic")
    if oracle:
        est = oracle_estimate(truth)
    else:
        noisy = mu * rng.lognormal(0, 0.3, G)
        est = length_estimate(noisy, np.minimum(noisy * 2.1, cap), sigma=0.5, estimator="history")
    return planning_problem(prompts, est, instances=m, slots=slots, minibatch=minibatch, max_new_tokens=cap,
                            rho=rho, seed=seed)


# ------------------------------------------------------------------------------------------ simulator trainers
def rho_trainer(problem: PlanningProblem, lengths: np.ndarray, rho: float,
                overhead: float = 0.0) -> Tuple[TrainerModel, float]:
    """A trainer whose work over the window is `rho` times the rollout lower bound R_LB, and that R_LB: the
    simulator tests set the regime (trainer- or rollout-bound) relative to the best possible rollout."""
    r_lb = lower_bounds(lengths, problem.prompts.prompt_lens, problem.instances, problem.spec,
                        problem.cost)["rollout/R_LB"]
    return trainer_for_rho(rho, lengths, problem.prompts.prompt_lens, r_lb, problem.minibatch,
                           overhead=overhead), r_lb
