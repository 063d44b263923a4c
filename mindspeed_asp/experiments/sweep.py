"""Side-by-side runs of several planners on one workload and seeds: shared by `asp simulate` and the benchmark.

It sits above the scheduler, the simulator and the workloads (it plans, simulates and resolves workloads), so
none of those imports it (docs/design.md#layering).

Why one place: the comparison must use the same workload, estimate, trainer (alpha from rho) and seeds for
every planner, and the CLI table and the benchmark tables must mean the same thing.

Conventions:
- the trainer's alpha is set so that total train time = rho * R_LB of the workload's true lengths under the
  simulated cluster (R_LB does not depend on any planner, so every planner faces the same trainer); each run
  also reports `rho_stock`, the same trainer time over stock's simulated rollout of the window (the `stock`
  planner in the barrier mode on the same instances; docs/design.md#rho-and-rho_stock), and `rho_stock` may be given
  instead of rho (`SweepConfig.rho_stock`), converted with `mindspeed_asp.core.metrics.rho_rlb_from_stock`;
- non-oracle planners see the history estimate (or the `estimator` chosen); `oracle_*` planners see the
  OracleEstimator (true lengths);
- a planner may carry its own mode as `name@mode` (e.g. `stock@stock`); otherwise the sweep's mode is used.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindspeed_asp.config import EstimatorSection
from mindspeed_asp.errors import InputError
from mindspeed_asp.core.metrics import rho_rlb_from_stock, rho_stock_from_rlb
from mindspeed_asp.core.memory_budget import check_kv_budget
from mindspeed_asp.core.policy import DEFAULT_STALE_POLICY
from mindspeed_asp.scheduler.estimators import OracleEstimator, make_estimator
from mindspeed_asp.scheduler.planners import PLANNERS, get_planner, needs_oracle
from mindspeed_asp.sim.bounds import lower_bounds
from mindspeed_asp.sim.pipeline import MODES, SimResult, simulate_pipeline
from mindspeed_asp.sim.train_time import TrainerModel, trainer_for_rho
from mindspeed_asp.core.problem import CostModel, InstanceSpec, PlanningProblem
from mindspeed_asp.workloads.spec import workload_from_spec


@dataclass(frozen=True)
class SweepConfig:
    """Cluster, trainer and pipeline settings shared by every planner of a comparison."""

    instances: int = 8
    slots: int = 64
    kv_budget: Optional[int] = None
    minibatch: int = 32
    rho: float = 1.0  # trainer time / R_LB; ignored when rho_stock is set
    rho_stock: Optional[float] = None  # trainer time / stock's rollout (docs/design.md#rho-and-rho_stock), if given
    max_lag: int = 1
    mode: str = "stream"
    sync_time: float = 0.0
    overhead: float = 0.0
    estimator: str = "history"
    stale_policy: str = DEFAULT_STALE_POLICY  # the runtime's asp.stale_policy default
    work_stealing: Optional[bool] = None  # None: on for stream (the runtime's asp/async modes), off for stock
    cost: CostModel = CostModel()
    single_scaling: Optional[Callable[[int], float]] = None


def parse_scaling(text: Optional[str]) -> Optional[Callable[[int], float]]:
    """`power:E` -> m**E; `amdahl:F` -> 1 / (F + (1-F)/m); `table:1=1,2=1.7,4=2.6` -> interpolated in log m."""
    if text is None or text == "":
        return None
    kind, _, arg = text.partition(":")
    try:
        if kind == "power":
            e = float(arg)
            return lambda m: float(m) ** e
        if kind == "amdahl":
            f = float(arg)
            if not 0.0 <= f <= 1.0:
                raise ValueError
            return lambda m: 1.0 / (f + (1.0 - f) / float(m))
        if kind == "table":
            pts = sorted((float(k), float(v)) for k, v in (p.split("=") for p in arg.split(",")))
            xs = np.log([p[0] for p in pts])
            ys = [p[1] for p in pts]
            return lambda m: float(np.interp(np.log(m), xs, ys))
    except (ValueError, TypeError):
        pass
    raise InputError(f"bad scaling curve {text!r}: use power:E, amdahl:F (0..1) or table:1=1,2=1.7,...",
                     key="--single-scaling")


def parse_planners(text: str, default_mode: str) -> List[Tuple[str, str, str]]:
    """'asp,stock@stock' -> [(label, planner, mode)], checking names and modes."""
    out = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, mode = item.partition("@")
        mode = mode or default_mode
        if name not in PLANNERS:
            raise InputError(f"unknown planner {name!r}; choose from {', '.join(PLANNERS)}", key="--planners")
        if mode not in MODES:
            raise InputError(f"unknown mode {mode!r} in {item!r}; choose from {', '.join(MODES)}",
                             key="--planners")
        out.append((item, name, mode))
    if not out:
        raise InputError("no planners given", key="--planners")
    return out


def seeded_spec(spec: str, seed: int) -> str:
    """The workload spec for one seed: synthetic workloads are redrawn, traces stay the same."""
    if not spec.startswith("synthetic:"):
        return spec
    body = spec[len("synthetic:"):]
    items = [p for p in body.split(",") if p.strip() and not p.strip().startswith("seed=")]
    return "synthetic:" + ",".join(items + [f"seed={seed}"])


@dataclass
class Workbench:
    """One resolved workload with both estimates, ready to plan and simulate many planners."""

    workload: object  # ResolvedWorkload
    estimate: object
    oracle: object
    r_lb: float
    seed: int
    stock_rollout: Optional[float] = None  # stock's simulated rollout time of the window (`stock_rollout`)
    stock_key: Optional[tuple] = None  # the cluster settings stock_rollout was simulated with


def check_cluster(instances: int, slots: int, groups: int, n: int) -> None:
    """Refuse a cluster the planners cannot use (as `asp plan` does): more instances than the window's groups (an
    instance would get none, and planning and simulating 10^5 idle instances take minutes), or fewer slots than
    a group's n samples (a group's samples run together on one instance)."""
    if instances > groups:
        raise InputError(f"{instances} instances for the workload's {groups} groups: every instance needs at least "
                         f"one group; give at most {groups} instances", key="--instances")
    if slots < n:
        raise InputError(f"--slots {slots} is below a group's {n} samples (n={n} of --workload): a group's samples "
                         f"run together on one instance; give --slots {n} or more", key="--slots")


def prepare(spec: str, cfg: SweepConfig, seed: int) -> Workbench:
    """Resolve the workload for `seed` and build its estimates and reference rollout bound."""
    wl = workload_from_spec(seeded_spec(spec, seed))
    check_kv_budget(cfg.kv_budget, wl.prompts.prompt_lens, wl.max_new_tokens)  # before any planning
    check_cluster(cfg.instances, cfg.slots, len(wl.prompts), int(wl.prompts.n))
    est = make_estimator(EstimatorSection(kind=cfg.estimator), wl.truth).estimate(
        wl.prompts, wl.history, wl.max_new_tokens)
    orc = OracleEstimator(wl.truth).estimate(wl.prompts, wl.history, wl.max_new_tokens)
    spec_i = InstanceSpec(slots=cfg.slots, kv_budget=cfg.kv_budget)
    r_lb = lower_bounds(wl.truth, wl.prompts.prompt_lens, cfg.instances, spec_i, cfg.cost)["rollout/R_LB"]
    return Workbench(workload=wl, estimate=est, oracle=orc, r_lb=r_lb, seed=seed)


def _problem(wb: Workbench, planner: str, cfg: SweepConfig, rho: float, steal: bool) -> PlanningProblem:
    wl = wb.workload
    # the planner is told the regime it will run in (max_lag, stealing), as `asp plan --config` tells it
    return PlanningProblem(prompts=wl.prompts, estimate=wb.oracle if needs_oracle(planner) else wb.estimate,
                           instances=cfg.instances, spec=InstanceSpec(slots=cfg.slots, kv_budget=cfg.kv_budget),
                           minibatch=cfg.minibatch, cost=cfg.cost, max_new_tokens=int(wl.max_new_tokens),
                           rho=rho, seed=wb.seed, max_lag=cfg.max_lag, work_stealing=steal)


def stock_rollout(wb: Workbench, cfg: SweepConfig) -> float:
    """Stock's rollout time of the window: the `stock` planner (dataset order) in the barrier mode on the
    sweep's instances, no stealing, as MindSpeed-RL generates. The trainer does not change a barrier's rollout,
    so none is modelled. Cached on the workbench per cluster setting."""
    key = (cfg.instances, cfg.slots, cfg.kv_budget, cfg.minibatch, cfg.cost)
    if wb.stock_rollout is None or wb.stock_key != key:
        problem = _problem(wb, "stock", cfg, 1.0, False)
        assignment = get_planner("stock")(problem, np.random.default_rng(wb.seed))
        res = simulate_pipeline(problem, assignment, wb.workload.truth, mode="stock", max_lag=0,
                                trainer=TrainerModel(alpha=0.0, overhead=0.0, minibatch=cfg.minibatch),
                                work_stealing=False, with_bounds=False)
        wb.stock_rollout, wb.stock_key = float(res.metrics["time/rollout"]), key
    return wb.stock_rollout


def resolve_rho(wb: Workbench, cfg: SweepConfig) -> Tuple[float, float]:
    """(rho over R_LB, rho over stock's rollout) of this workbench: whichever the config gives, the other
    converted (`mindspeed_asp.core.metrics`)."""
    stock = stock_rollout(wb, cfg)
    if cfg.rho_stock is not None:
        return rho_rlb_from_stock(cfg.rho_stock, wb.r_lb, stock), float(cfg.rho_stock)
    return float(cfg.rho), rho_stock_from_rlb(cfg.rho, wb.r_lb, stock)


def steals(cfg: SweepConfig, mode: str) -> bool:
    """Whether a planner run in `mode` steals: cfg.work_stealing when set, else on for stream only (the stock
    pipeline never steals: MindSpeed-RL has no stealing)."""
    return (mode == "stream") if cfg.work_stealing is None else bool(cfg.work_stealing)


def problem_for(wb: Workbench, planner: str, mode: str, cfg: SweepConfig) -> PlanningProblem:
    """The window as `planner` sees it in `run_planner`: its estimate and the regime it runs in."""
    return _problem(wb, planner, cfg, resolve_rho(wb, cfg)[0], steals(cfg, mode))


def run_planner(wb: Workbench, planner: str, mode: str, cfg: SweepConfig, **sim_kw) -> Tuple[SimResult, float]:
    """Plan with `planner` and simulate in `mode`; returns the result and the planning wall time (s)."""
    wl = wb.workload
    steal = (mode == "stream") if cfg.work_stealing is None else bool(cfg.work_stealing)
    rho, rho_s = resolve_rho(wb, cfg)
    problem = _problem(wb, planner, cfg, rho, steal)
    trainer = trainer_for_rho(rho, wl.truth, wl.prompts.prompt_lens, wb.r_lb, cfg.minibatch, cfg.overhead)
    t0 = time.perf_counter()
    assignment = get_planner(planner)(problem, np.random.default_rng(wb.seed))
    plan_s = time.perf_counter() - t0
    res = simulate_pipeline(problem, assignment, wl.truth, mode=mode, max_lag=cfg.max_lag, trainer=trainer,
                            sync_time=cfg.sync_time, single_scaling=cfg.single_scaling,
                            stale_policy=cfg.stale_policy, work_stealing=steal, **sim_kw)
    res.params["plan_seconds"] = plan_s
    res.params["rho"] = rho  # trainer time / R_LB
    res.params["rho_stock"] = rho_s  # the same trainer time / stock's rollout
    res.params["stock_rollout"] = wb.stock_rollout
    res.params["rollout_R_LB"] = wb.r_lb
    # what the planner predicted for its own plan (ASP: pred_e2e_mean, selection scope), beside the simulation
    res.params["planner_params"] = {k: float(v) for k, v in assignment.params.items()}
    return res, plan_s


def compare(spec: str, planners: Sequence[Tuple[str, str, str]], cfg: SweepConfig, seeds: Sequence[int],
            progress: bool = True) -> Dict[str, List[SimResult]]:
    """Every planner on every seed: {label: [SimResult per seed]} (tqdm progress on stderr)."""
    from tqdm import tqdm

    out: Dict[str, List[SimResult]] = {label: [] for label, _, _ in planners}
    bar = tqdm(total=len(seeds) * len(planners), desc="simulate", unit="run", disable=not progress)
    for seed in seeds:
        wb = prepare(spec, cfg, seed)
        for label, name, mode in planners:
            bar.set_postfix_str(f"seed={seed} {label}")
            res, _ = run_planner(wb, name, mode, cfg)
            out[label].append(res)
            bar.update(1)
    bar.close()
    return out


def mean_metrics(results: Sequence[SimResult]) -> Dict[str, float]:
    """Mean over seeds of every metric, bound and % above bound (keys prefixed bound:/above:)."""
    keys = set()
    for r in results:
        keys.update(r.metrics)
        keys.update(f"bound:{k}" for k in r.bounds)
        keys.update(f"above:{k}" for k in r.above)
    out = {}
    for k in sorted(keys):
        vals = []
        for r in results:
            if k.startswith("bound:"):
                vals.append(r.bounds.get(k[6:], np.nan))
            elif k.startswith("above:"):
                vals.append(r.above.get(k[6:], np.nan))
            else:
                vals.append(r.metrics.get(k, np.nan))
        out[k] = float(np.nanmean(vals)) if np.any(np.isfinite(vals)) else float("nan")
    for k in ("plan_seconds", "rho", "rho_stock"):
        out[k] = float(np.mean([r.params.get(k, np.nan) for r in results]))
    return out


TABLE_COLUMNS = (
    ("mode", None, "{}"),
    ("iter s", "time/iteration", "{:.1f}"),
    ("%>LB", "above:time/iteration", "{:.1f}"),
    ("rollout s", "time/rollout", "{:.1f}"),
    ("%>R_LB", "above:rollout/makespan_busy", "{:.1f}"),
    ("pad%", "bubble/padding", "{:.1%}"),
    ("skew%", "bubble/skewness", "{:.1%}"),
    ("sort%", "bubble/sorting", "{:.1%}"),
    ("lag max", "lag/max", "{:.0f}"),
    ("e2e_tps", "throughput/e2e_tps", "{:.0f}"),
    ("plan s", "plan_seconds", "{:.2f}"),
)


def format_table(rows: Dict[str, Dict[str, float]], modes: Dict[str, str]) -> str:
    """A plain-text side-by-side table (one row per planner label)."""
    header = ["planner"] + [c for c, _, _ in TABLE_COLUMNS]
    body = []
    for label, met in rows.items():
        line = [label]
        for col, key, fmt in TABLE_COLUMNS:
            if key is None:
                line.append(modes.get(label, ""))
                continue
            v = met.get(key, float("nan"))
            line.append("nan" if v is None or not np.isfinite(v) else fmt.format(v))
        body.append(line)
    widths = [max(len(r[i]) for r in [header] + body) for i in range(len(header))]
    def fmt_row(r: List[str]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt_row(header), fmt_row(["-" * w for w in widths])] + [fmt_row(r) for r in body])


def rho_line(rows: Dict[str, Dict[str, float]]) -> str:
    """Both rho definitions of the trainer the runs faced (mean over seeds; the same for every planner)."""
    met = next(iter(rows.values()))
    return (f"trainer: rho={met['rho']:.3g} (train time / R_LB), rho_stock={met['rho_stock']:.3g} "
            "(train time / stock's rollout of the window; docs/design.md#rho-and-rho_stock)")


def e2e_line(results: Dict[str, List[SimResult]]) -> str:
    """Which devices each row's e2e_tps divided by (docs/design.md#e2e_tps: every device the run uses)."""
    seen = {label: rs[0].devices.describe() for label, rs in results.items() if rs and rs[0].devices}
    parts = sorted(set(seen.values()))
    if len(parts) == 1:
        return f"e2e_tps: tokens / (s x {parts[0]} devices) for every row"
    return "e2e_tps: tokens / (s x devices); devices: " + ", ".join(f"{k} {v}" for k, v in seen.items())

