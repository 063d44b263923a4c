"""Regime advice (`experiments/advice.py`) and its use by `asp plan` and `asp simulate`: the figures are the
event simulator's on one scenario drawn from the estimate, the warning follows them, the true-bound gap uses the
independent sim.bounds bound, and `asp simulate`'s stock pipeline never steals unless asked."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mindspeed_asp.cli import main
from mindspeed_asp.experiments import sweep
from mindspeed_asp.experiments.advice import (SCENARIO_SEED, SLOWER_TOLERANCE, LagPoint, RegimeAdvice, lag_points,
                                              regime_advice)
from mindspeed_asp.scheduler.planners import get_planner
from mindspeed_asp.scheduler.scenarios import sample_scenarios
from mindspeed_asp.sim.pipeline import simulate_pipeline

from factories import base_args, rho_trainer, write_inputs

SMALL = "synthetic:prompts=96,n=4,regime=small"


def _problem(max_lag: int, rho: float = 1.0, seed: int = 0):
    cfg = sweep.SweepConfig(instances=3, slots=8, minibatch=8, rho=rho, max_lag=max_lag)
    wb = sweep.prepare(SMALL, cfg, seed)
    return sweep.problem_for(wb, "asp", "stream", cfg)


def test_lag_points_cover_zero_one_two_and_stock_staleness():
    assert lag_points(16, 1) == [0, 1, 2, 15]
    assert lag_points(16, 7) == [0, 1, 2, 7, 15]
    assert lag_points(1, 0) == [0, 1, 2]


def test_advice_figures_are_the_simulators_on_the_estimates_scenario():
    problem = _problem(max_lag=1)
    adv = regime_advice(problem, planner="lpt")
    K = -(-len(problem.prompts) // problem.minibatch)
    assert adv.minibatches == K and [p.max_lag for p in adv.points] == lag_points(K, 1)
    # recompute the stock pipeline and max_lag 2 independently
    L = np.rint(sample_scenarios(problem, 1, np.random.default_rng(SCENARIO_SEED))[0]).astype(np.int64)
    tr, r_lb = rho_trainer(problem, L, problem.rho)
    stock = simulate_pipeline(problem, get_planner("stock")(problem, np.random.default_rng(problem.seed)), L,
                              mode="stock", trainer=tr, work_stealing=False, with_bounds=False)
    assert adv.stock_e2e_s == pytest.approx(stock.metrics["time/iteration"])
    plan = get_planner("lpt")(problem, np.random.default_rng(problem.seed))
    two = simulate_pipeline(problem, plan, L, mode="stream", max_lag=2, trainer=tr, work_stealing=True,
                            with_bounds=False)
    assert adv.point(2).e2e_s == pytest.approx(two.metrics["time/iteration"])
    # the gap is against the independent bound of the same lengths, and cannot be below it
    assert adv.rollout_lb_s == pytest.approx(r_lb)
    assert adv.pred_rollout_s >= adv.rollout_lb_s * (1 - 1e-9)
    d = adv.as_dict()
    assert d["slower_than_stock"] == (d["lags"][1]["e2e_s"] > d["stock_e2e_s"] * (1 + SLOWER_TOLERANCE))


def test_warning_follows_the_numbers():
    for lag in (0, 1):
        adv = regime_advice(_problem(max_lag=lag, rho=1.5), planner="asp")
        slower = adv.chosen.e2e_s > adv.stock_e2e_s * (1 + SLOWER_TOLERANCE)
        assert adv.slower_than_stock == slower
        w = adv.warning()
        assert (w is not None) == slower
        if w:
            assert w.startswith("WARNING: max_lag") and "\n" not in w and "stock pipeline" in w


def _advice(stock_s: float, chosen_s: float) -> RegimeAdvice:
    points = [LagPoint(max_lag=lag, e2e_s=chosen_s if lag == 1 else 2 * stock_s, e2e_tps=1.0, rollout_s=1.0)
              for lag in (0, 1, 2)]
    return RegimeAdvice(planner="asp", chosen_max_lag=1, work_stealing=True, rho=1.0, groups=8, instances=2,
                        minibatches=4, shrunk=False, stock_e2e_s=stock_s, stock_e2e_tps=1.0, points=points)


def test_a_gap_below_the_tolerance_is_no_warning():
    # within 1% of stock: the one-scenario prediction cannot tell them apart, so no "0% slower" warning
    assert _advice(100.0, 100.0 * (1 + SLOWER_TOLERANCE / 2)).warning() is None
    w = _advice(100.0, 100.0 * (1 + 3 * SLOWER_TOLERANCE)).warning()
    assert w is not None and "3.0% slower" in w and "103.0 s vs 100.0 s" in w
    assert "no bound simulated here reaches it" in w
    # a bound within the tolerance is named as one that reaches stock
    near = _advice(100.0, 110.0)
    near.points[0] = LagPoint(max_lag=0, e2e_s=100.5, e2e_tps=1.0, rollout_s=1.0)
    assert "or faster: max_lag 0" in near.warning()


def test_large_windows_are_shrunk_on_fewer_instances():
    problem = _problem(max_lag=1)
    adv = regime_advice(problem, planner="lpt", max_seqs=100)
    assert adv.shrunk and adv.instances < problem.instances
    assert adv.groups * 4 <= 100 + 4 * (len(problem.prompts) // problem.instances)


def test_asp_plan_reports_advice_and_an_honest_gap(tmp_path, capsys):
    data, hist = write_inputs(tmp_path, G=64, n=4, epochs=2)
    out, js = tmp_path / "plan.parquet", tmp_path / "s.json"
    assert main(base_args(data, hist, out, "--max-lag", "0", "--json", str(js))) == 0
    cap = capsys.readouterr()
    s = json.loads(js.read_text())
    adv, gap = s["advice"], s["gap"]
    assert [p["max_lag"] for p in adv["lags"]][:3] == [0, 1, 2] and adv["chosen_max_lag"] == 0
    assert gap["rollout_lb_s"] > 0 and gap["sim_rollout_s"] >= gap["rollout_lb_s"] * (1 - 1e-9)
    assert gap["above_lb_pct"] == pytest.approx(100 * (gap["sim_rollout_s"] / gap["rollout_lb_s"] - 1))
    assert "true-bound gap" in cap.out and "regime advice" in cap.out
    chosen = next(p for p in adv["lags"] if p["max_lag"] == 0)
    assert adv["slower_than_stock"] == (chosen["e2e_s"] > adv["stock_e2e_s"] * (1 + SLOWER_TOLERANCE))
    assert ("WARNING: max_lag 0" in cap.err) == adv["slower_than_stock"]
    assert main(base_args(data, hist, tmp_path / "p2.parquet", "--no-advice", "--json", str(js))) == 0
    assert "advice" not in json.loads(js.read_text())


def test_simulate_stock_never_steals_unless_asked(tmp_path, capsys):
    def run(*extra):
        out = tmp_path / ("sim" + "".join(extra))
        rc = main(["simulate", "--workload", SMALL, "--planners", "lpt,stock@stock", "--instances", "3",
                   "--slots", "8", "--minibatch", "8", "--max-lag", "1", "--out", str(out), "--no-plots",
                   "--quiet", *extra])
        assert rc == 0
        return json.loads((out / "simulate.json").read_text())

    d = run()
    assert d["work_stealing"] == {"lpt": True, "stock@stock": False}
    assert d["mean"]["stock@stock"]["rollout/steals"] == 0
    assert d["advice"]["planner"] == "lpt" and d["advice"]["stock_e2e_s"] > 0
    assert run("--no-work-stealing")["work_stealing"] == {"lpt": False, "stock@stock": False}
    on = run("--work-stealing")
    assert on["work_stealing"] == {"lpt": True, "stock@stock": True}
    assert run("--no-advice")["advice"] is None
