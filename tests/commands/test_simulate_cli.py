"""`asp simulate` end to end on a small synthetic workload (and a trace when shared/data is present)."""
import json

import pytest

from mindspeed_asp.cli import main

from factories import shared_data

SMALL = "synthetic:prompts=64,n=4,regime=small"


def test_simulate_writes_table_json_and_plots(tmp_path, capsys):
    out = tmp_path / "sim"
    rc = main(["simulate", "--workload", SMALL, "--planners", "asp,stock@stock,lpt,oracle_lpt,sorted_asc",
               "--instances", "2", "--slots", "16", "--minibatch", "4", "--rho", "1.0", "--max-lag", "2",
               "--seeds", "0,1", "--out", str(out), "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    for label in ("asp", "stock@stock", "oracle_lpt", "sorted_asc"):
        assert label in text
    data = json.loads((out / "simulate.json").read_text())
    assert data["seeds"] == [0, 1]
    assert set(data["runs"]) == {"asp", "stock@stock", "lpt", "oracle_lpt", "sorted_asc"}
    asp = data["mean"]["asp"]
    for key in ("bubble/padding", "bubble/skewness", "bubble/skew_gap", "bubble/tail_share", "bubble/sorting",
                "bubble/queue_cv", "bubble/arrival_gap_cv", "lag/mean", "lag/p99", "lag/max",
                "lag/frac_over_bound", "throughput/e2e_tps", "time/iteration", "time/rollout", "time/train",
                "time/weight_sync", "above:time/iteration", "bound:rollout/R_LB"):
        assert key in asp, key
    assert asp["lag/max"] <= 2
    assert data["runs"]["stock@stock"][0]["mode"] == "stock"
    assert all(r["metrics"]["time/rollout"] >= r["bounds"]["rollout/R_LB"] for rs in data["runs"].values()
               for r in rs)
    for png in ("gantt.png", "queue_occupancy.png", "bubbles.png", "lag_histogram.png"):
        assert (out / png).stat().st_size > 5000


def test_simulate_refuses_bad_input_in_one_line(tmp_path, capsys):
    rc = main(["simulate", "--workload", SMALL, "--planners", "asp,nonsense", "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nonsense" in err[0] and "--planners" in err[0]
    rc = main(["simulate", "--workload", SMALL, "--planners", "stock@single", "--out", str(tmp_path)])
    assert rc == 2 and "--single-scaling" in capsys.readouterr().err
    rc = main(["simulate", "--workload", "synthetic:prompts=8,bogus=1", "--out", str(tmp_path), "--quiet"])
    assert rc == 2 and "bogus" in capsys.readouterr().err


def test_simulate_single_mode_with_scaling_curve(tmp_path, capsys):
    rc = main(["simulate", "--workload", SMALL, "--planners", "stock@single,stock@stock", "--instances", "4",
               "--slots", "8", "--minibatch", "4", "--single-scaling", "amdahl:0.2", "--out", str(tmp_path),
               "--no-plots", "--quiet"])
    assert rc == 0
    data = json.loads((tmp_path / "simulate.json").read_text())
    single = data["runs"]["stock@single"][0]
    assert single["mode"] == "single" and single["params"]["single_scale"] == pytest.approx(1 / (0.2 + 0.8 / 4))


@pytest.mark.slow
def test_simulate_on_splitwise_trace(tmp_path, capsys):
    path = shared_data() / "splitwise_conv.csv"
    if not path.is_file():
        pytest.skip(f"shared data not found at {path} (set ASP_SHARED_DATA)")
    rc = main(["simulate", "--workload", f"splitwise:{path}", "--planners", "asp,stock@stock,verl_kk",
               "--out", str(tmp_path), "--no-plots", "--quiet", "--max-lag", "4"])
    assert rc == 0
    data = json.loads((tmp_path / "simulate.json").read_text())
    assert data["mean"]["asp"]["time/iteration"] < data["mean"]["stock@stock"]["time/iteration"]


def test_simulate_states_both_rhos_and_the_devices(tmp_path, capsys):
    """--rho keeps its meaning (train time / R_LB) and the output adds rho_stock; --rho-stock sets the trainer
    from stock's rollout instead; every row says which devices its e2e_tps divided by."""
    args = ["simulate", "--workload", SMALL, "--planners", "asp,stock@stock", "--instances", "2", "--slots", "16",
            "--minibatch", "4", "--no-plots", "--no-advice", "--quiet"]
    assert main(args + ["--rho", "1.0", "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "rho=1 (train time / R_LB)" in out and "rho_stock=" in out
    assert "asp 3 (2 rollout + 1 trainer, split)" in out and "stock@stock 2 (colocated)" in out
    mean = json.loads((tmp_path / "a" / "simulate.json").read_text())["mean"]
    assert mean["asp"]["rho"] == 1.0 and 0 < mean["asp"]["rho_stock"] <= 1.0  # stock's rollout >= R_LB
    assert main(args + ["--rho-stock", "0.5", "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    data = json.loads((tmp_path / "b" / "simulate.json").read_text())
    stock = data["runs"]["stock@stock"][0]["metrics"]
    assert stock["time/train"] / stock["time/rollout"] == pytest.approx(0.5)
    assert data["mean"]["asp"]["rho_stock"] == pytest.approx(0.5) and data["mean"]["asp"]["rho"] >= 0.5
    assert main(args + ["--rho", "1", "--rho-stock", "0.5", "--out", str(tmp_path / "c")]) == 2
    assert "--rho-stock" in capsys.readouterr().err
