"""`asp plan` end to end through `mindspeed_asp.cli.main`, including malformed inputs."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mindspeed_asp.cli import main
from mindspeed_asp.scheduler.plan_file import load_plan
from mindspeed_asp.workloads.prompts import load_prompt_set

from factories import base_args, shared_data, write_inputs


@pytest.mark.parametrize("planner", ["asp", "stock", "verl_kk", "least_loaded"])
def test_plan_end_to_end(tmp_path, capsys, planner):
    data, hist = write_inputs(tmp_path)
    out = tmp_path / "plan.parquet"
    rc = main(base_args(data, hist, out, "--planner", planner, "--groups-per-iteration", "16",
                        "--json", str(tmp_path / "summary.json")))
    assert rc == 0
    text = capsys.readouterr().out
    assert "40 (160 samples) in 3 iteration(s) on 4 instance(s)" in text
    assert "bound" in text and "max/mean" in text
    prompts = load_prompt_set(data, n=4)
    plan = load_plan(out, prompts)
    assert plan.iterations() == [0, 1, 2] and plan.header["planner"] == planner
    assert plan.header["max_new_tokens"] == 1024  # inferred from the history's longest length
    assert plan.header["sources"]["history"] == str(hist)
    queues = [q for it in plan.iterations() for j in range(4) for q in plan.instance_queue(it, j)]
    assert sorted(queues) == sorted(f"q{i}" for i in range(40))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["groups"] == 40 and summary["pred_makespan_s"] >= summary["pred_bound_s"] * 0.999


def test_plan_jsonl_cost_file_and_oracle(tmp_path, capsys):
    data, hist = write_inputs(tmp_path, epochs=3)
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"a": 0.004, "b": 1e-5, "c": 2e-7, "p": 1e-6}))
    out = tmp_path / "plan.jsonl"
    assert main(base_args(data, hist, out, "--cost", str(cost), "--rho", "0.5", "--max-new-tokens", "2048")) == 0
    plan = load_plan(out, load_prompt_set(data, n=4))
    assert plan.header["cost"] == {"a": 0.004, "b": 1e-5, "c": 2e-7, "p": 1e-6, "source": str(cost)}
    assert plan.header["rho"] == 0.5 and plan.header["max_new_tokens"] == 2048
    out2 = tmp_path / "oracle.parquet"
    assert main(base_args(data, hist, out2, "--planner", "oracle_asp", "--truth", str(hist))) == 0
    oplan = load_plan(out2)
    assert oplan.header["estimator"] == "oracle" and oplan.header["sources"]["truth_epoch"] == 2


def test_cold_start_without_history(tmp_path):
    data, _ = write_inputs(tmp_path)
    out = tmp_path / "plan.parquet"
    args = ["plan", "--dataset", str(data), "--instances", "2", "--slots", "8", "--minibatch", "2", "--n", "4",
            "--max-new-tokens", "512", "--no-progress", "-o", str(out)]
    assert main(args) == 0
    assert load_plan(out).num_groups == 40


def run_error(capsys, args):
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("asp plan: error: ") and err.count("\n") == 1
    return err


def test_malformed_dataset_line_is_named(tmp_path, capsys):
    data, hist = write_inputs(tmp_path)
    lines = data.read_text().splitlines()
    lines[2] = '{"prompt_id": "q2", "prompt_len": '
    data.write_text("\n".join(lines) + "\n")
    err = run_error(capsys, base_args(data, hist, tmp_path / "p.parquet"))
    assert f"{data}:3" in err
    lines[2] = '{"prompt_id": "q1", "prompt_len": 5}'  # duplicate id
    data.write_text("\n".join(lines) + "\n")
    err = run_error(capsys, base_args(data, hist, tmp_path / "p.parquet"))
    assert f"{data}:3" in err and "duplicate" in err
    lines[2] = '{"prompt_id": "q2"}'
    data.write_text("\n".join(lines) + "\n")
    err = run_error(capsys, base_args(data, hist, tmp_path / "p.parquet"))
    assert f"{data}:3" in err and "prompt_len" in err


def test_malformed_history_line_is_named(tmp_path, capsys):
    data, hist = write_inputs(tmp_path)
    lines = hist.read_text().splitlines()
    lines[4] = '{"prompt_id": "q4", "epoch": 0, "lengths": "long"}'
    hist.write_text("\n".join(lines) + "\n")
    err = run_error(capsys, base_args(data, hist, tmp_path / "p.parquet"))
    assert f"{hist}:5" in err
    lines[4] = "not json"
    hist.write_text("\n".join(lines) + "\n")
    err = run_error(capsys, base_args(data, hist, tmp_path / "p.parquet"))
    assert f"{hist}:5" in err


def test_bad_flags_and_side_files_are_named(tmp_path, capsys):
    data, hist = write_inputs(tmp_path)
    out = tmp_path / "p.parquet"
    err = run_error(capsys, base_args(data, hist, out, "--planner", "fast"))
    assert "unknown planner" in err and "(got 'fast')" in err and "(--planner fast)" in err  # as asp.planner=fast
    assert "--truth" in run_error(capsys, base_args(data, hist, out, "--planner", "oracle_lpt"))
    assert "--instances" in run_error(capsys, base_args(data, hist, out, "--instances", "0"))
    assert ".parquet or .jsonl" in run_error(capsys, base_args(data, hist, tmp_path / "p.csv"))
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"a": 0.01, "c": 1e-7}))
    err = run_error(capsys, base_args(data, hist, out, "--cost", str(cost)))
    assert str(cost) in err and "key 'b'" in err
    assert "not found" in run_error(capsys, base_args(data, tmp_path / "nohist.parquet", out))
    args = ["plan", "--dataset", str(data), "--slots", "8", "--minibatch", "2", "-o", str(out)]
    assert "--instances" in run_error(capsys, args)
    assert not out.exists()


def test_plan_on_the_alpaca_trace(tmp_path, capsys):
    """Real lengths: three temperatures of each Alpaca prompt as history, planned over 8 instances."""
    src = shared_data() / "alpaca-train-10k-length.json"
    if not src.is_file():
        pytest.skip(f"shared data not found at {src} (set ASP_SHARED_DATA)")
    rows = json.loads(src.read_text())[:2000]
    data, hist = tmp_path / "alpaca.jsonl", tmp_path / "alpaca_hist.jsonl"
    with data.open("w") as fd, hist.open("w") as fh:
        for r in rows:
            fd.write(json.dumps({"prompt_id": str(r["id"]), "prompt_len": 64}) + "\n")
            lens = [int(r[k]) for k in ("L_t0.0", "L_t0.3", "L_t0.5")]
            fh.write(json.dumps({"prompt_id": str(r["id"]), "epoch": 0, "lengths": lens}) + "\n")
    out = tmp_path / "alpaca_plan.parquet"
    args = ["plan", "--dataset", str(data), "--history", str(hist), "--instances", "8", "--slots", "32",
            "--minibatch", "16", "--n", "3", "--groups-per-iteration", "512", "--no-progress", "-o", str(out),
            "--json", str(tmp_path / "s.json")]
    assert main(args) == 0
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["iterations"] == 4 and s["with_history"] == 2000 and s["max_new_tokens"] == 512
    assert s["pred_max_over_mean_worst"] < 1.05  # balanced by predicted work


def test_config_section_supplies_defaults_and_flags_win(tmp_path):
    data, hist = write_inputs(tmp_path)
    cfg = tmp_path / "run.yaml"
    cfg.write_text("asp:\n  instances: 3\n  slots: 8\n  minibatch_groups: 2\n  planner: lpt\n"
                   "  cost: {a: 0.002, b: 0.0, c: 0.0, p: 0.0}\n")
    out = tmp_path / "plan.parquet"
    args = ["plan", "--dataset", str(data), "--history", str(hist), "--config", str(cfg), "--n", "4",
            "--no-progress", "-o", str(out)]
    assert main(args) == 0
    h = load_plan(out).header
    assert (h["instances"], h["slots"], h["minibatch_groups"], h["planner"]) == (3, 8, 2, "lpt")
    assert h["cost"]["a"] == 0.002 and str(cfg) in h["cost"]["source"]
    assert main(args + ["--instances", "2", "--planner", "stock"]) == 0
    h = load_plan(out).header
    assert (h["instances"], h["planner"]) == (2, "stock")


def test_unknown_config_key_is_named(tmp_path, capsys):
    data, hist = write_inputs(tmp_path)
    cfg = tmp_path / "run.yaml"
    cfg.write_text("asp:\n  instances: 3\n  slotz: 8\n")
    err = run_error(capsys, ["plan", "--dataset", str(data), "--config", str(cfg), "-o", str(tmp_path / "p.jsonl")])
    assert str(cfg) in err and "asp.slotz" in err


def test_max_lag_and_stealing_come_from_config_and_flags(tmp_path, capsys):
    data, hist = write_inputs(tmp_path)
    cfg = tmp_path / "run.yaml"
    cfg.write_text("asp:\n  instances: 2\n  slots: 8\n  minibatch_groups: 2\n  max_lag: 4\n  work_stealing: false\n")
    out = tmp_path / "plan.parquet"
    args = ["plan", "--dataset", str(data), "--history", str(hist), "--config", str(cfg), "--n", "4",
            "--no-progress", "-o", str(out)]
    assert main(args) == 0
    h = load_plan(out).header
    assert (h["max_lag"], h["work_stealing"]) == (4, False)
    assert h["planner_params"][0]["scored_max_lag"] == 4.0 and h["planner_params"][0]["scored_work_stealing"] == 0.0
    assert main(args + ["--max-lag", "2"]) == 0
    assert load_plan(out).header["max_lag"] == 2
    assert main(base_args(data, hist, out)) == 0  # no config: the asp: defaults (max_lag 1, stealing on)
    h = load_plan(out).header
    assert (h["max_lag"], h["work_stealing"]) == (1, True)
    assert main(base_args(data, hist, out, "--no-work-stealing")) == 0
    assert load_plan(out).header["work_stealing"] is False
    capsys.readouterr()  # the regime advice may have warned on stderr above
    err = run_error(capsys, base_args(data, hist, out, "--max-lag", "-1"))
    assert "--max-lag" in err


def test_plan_reports_the_groups_it_isolated(tmp_path, capsys):
    """Tiny decodes with one long outlier, at a loose lag bound (max_lag K-1): the plan isolates the outlier's
    group, writes its row to the file, and the summary says so (and what it means at run time)."""
    rng = np.random.default_rng(5)
    G, n = 400, 8
    data, hist = tmp_path / "prompts.jsonl", tmp_path / "history.jsonl"
    with data.open("w") as fh:
        for i in range(G):
            fh.write(json.dumps({"prompt_id": f"q{i}", "prompt_len": int(rng.integers(100, 600))}) + "\n")
    with hist.open("w") as fh:
        for e in range(2):
            for i in range(G):
                lens = np.clip(np.rint(rng.lognormal(np.log(13), 0.7, n)), 1, 2000)
                if i == 17:
                    lens = np.clip(rng.normal(1500, 200, n), 1, 1900).round()
                fh.write(json.dumps({"prompt_id": f"q{i}", "epoch": e, "lengths": lens.astype(int).tolist()}) + "\n")
    out = tmp_path / "plan.parquet"
    rc = main(["plan", "--dataset", str(data), "--history", str(hist), "--truth", str(hist), "--planner", "oracle_asp",
               "--instances", "8", "--slots", "64", "--minibatch", "16", "--n", str(n), "--rho", "0.1",
               "--max-new-tokens", "2000", "--max-lag", "24", "--no-progress", "-o", str(out)])
    assert rc == 0
    assert "dominant group(s) isolated" in capsys.readouterr().out
    plan = load_plan(out)
    assert 17 in plan.header["isolated_rows"] and "q17" in plan.isolated_ids(0)


def test_the_configs_kv_budget_is_planned_with(tmp_path, capsys):
    """asp.kv_budget_tokens is the runtime re-planner's KV budget (runtime/replan.py); `asp plan --config` plans
    with it too (not unbounded when --kv-budget is absent), and --kv-budget still wins."""
    data, hist = write_inputs(tmp_path)
    cfg = tmp_path / "run.yaml"
    cfg.write_text("asp:\n  instances: 2\n  slots: 8\n  minibatch_groups: 2\n  kv_budget_tokens: 20000\n")
    out = tmp_path / "plan.parquet"
    args = ["plan", "--dataset", str(data), "--history", str(hist), "--config", str(cfg), "--n", "4",
            "--no-progress", "--no-advice", "-o", str(out)]
    assert main(args) == 0
    assert load_plan(out).header["kv_budget"] == 20000
    assert main(args + ["--kv-budget", "30000"]) == 0
    assert load_plan(out).header["kv_budget"] == 30000
    cfg.write_text("asp:\n  instances: 2\n  slots: 8\n  minibatch_groups: 2\n  kv_budget_tokens: 10\n")
    err = run_error(capsys, args)
    assert "asp.kv_budget_tokens" in err and "cannot hold one sequence" in err


def test_flags_are_validated_as_overrides_of_their_keys(tmp_path, capsys):
    """A flag is an override of its asp: key, validated with the file: --max-lag 2 on a stock config is refused
    as `asp.max_lag=2` would be, naming the flag (a flag is never merged in after validation, unchecked)."""
    data, hist = write_inputs(tmp_path)
    cfg = tmp_path / "stock.yaml"
    cfg.write_text("asp:\n  mode: stock\n  instances: 2\n  slots: 8\n  minibatch_groups: 2\n")
    args = ["plan", "--dataset", str(data), "--history", str(hist), "--config", str(cfg), "--n", "4",
            "--no-progress", "--no-advice", "-o", str(tmp_path / "plan.parquet")]
    err = run_error(capsys, args + ["--max-lag", "2"])
    assert str(cfg) in err and "asp.max_lag" in err and "asp.mode=stock trains at lag 0 only" in err
    assert "command-line override 'asp.max_lag=2' (--max-lag 2)" in err
    assert main(args) == 0  # unset: stock's lag 0
    assert load_plan(tmp_path / "plan.parquet").header["max_lag"] == 0


def test_a_plain_yaml_is_read_without_the_mindspeed_rl_adapter(tmp_path):
    """A run config or an asp:-only YAML goes through mindspeed_asp/config.py's reader; the MindSpeed-RL adapter
    is loaded only for a MindSpeed-RL training YAML (told by its own sections)."""
    import subprocess
    import sys

    cfg = tmp_path / "run.yaml"
    cfg.write_text("asp:\n  instances: 3\n  kv_budget_tokens: 5000\n")
    code = ("import sys\nfrom mindspeed_asp.commands.plan import read_config\n"
            f"asp, topo = read_config({str(cfg)!r}, ['asp.slots=8'], {{}})\n"
            "print(asp.instances, asp.slots, asp.kv_budget_tokens, topo,"
            " 'mindspeed_asp.integrations.mindspeed_rl.config_section' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3", "8", "5000", "None", "False"]
