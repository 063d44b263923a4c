"""`asp whatif`: answers for each of the five configs, the JSON and plot, calibration, and named input errors."""
from __future__ import annotations

import json

import pytest

from mindspeed_asp.cli import main

SMALL = "synthetic:n=4,median=48,cap=256,seed=1"  # short lengths: each run takes well under a second
CONFIGS = ["qwen25_7b_A3_asp", "qwen25_32b_A3_asp", "qwen25_32b_A2_asp", "qwen3_8b_A3_asp",
           "qwen3_30b_a3b_dapo_A3_asp"]


@pytest.mark.parametrize("name", CONFIGS)
def test_whatif_answers_for_each_config(name, tmp_path, capsys):
    rc = main(["whatif", "--config", f"configs/{name}.yaml", "--workload", SMALL, "--windows", "3",
               "--window-groups", "8", "--minibatch", "8", "--max-lag", "1,2", "--no-refine", "--quiet",
               "--no-plots", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "best per staleness bound" in out and "assumptions:" in out
    data = json.loads((tmp_path / "whatif.json").read_text())
    rows = data["rows"]
    stock = [r for r in rows if r["mode"] == "colocated"]
    assert len(stock) == 1 and stock[0]["trainer_devices"] == stock[0]["devices"]
    split_rows = [r for r in rows if r["mode"] in ("async", "asp")]
    devices, tp = data["setting"]["devices"], data["setting"]["tp"]
    assert {r["rollout_devices"] for r in split_rows} <= set(range(tp, devices, tp))
    assert all(r["rollout_devices"] + r["trainer_devices"] == devices for r in split_rows)
    best = data["summary"]["best_per_bound"]
    assert [b["bound"] for b in best] == [1, 2]
    for b in best:
        ok = [r["e2e_tps"] for r in split_rows if r["max_lag"] <= b["bound"]]
        assert b["best"]["e2e_tps"] == max(ok)
        assert b["speedup_vs_colocated"] == pytest.approx(b["best"]["e2e_tps"] / stock[0]["e2e_tps"])
    assert "throughput" in data["assumptions"] and "trainer" in data["assumptions"]


def test_whatif_preset_flags_plot_cost_file_and_calibration(tmp_path, capsys):
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"a": 0.02, "b": 1e-4, "c": 5e-8, "p": 1e-4, "source": "test fit"}))
    log = tmp_path / "msrl.log"
    log.write_text("".join(f"iteration: {i} / 10 | timing/rollout : 30.0 | timing/update : 6.0 | "
                           f"response_length/mean : 48.0 | prompt_length/mean : 24.0 | e2e_tps : 100.0\n"
                           for i in range(1, 5)))
    rc = main(["whatif", "--model", "qwen25_7b", "--devices", "8", "--workload", SMALL, "--windows", "3",
               "--window-groups", "8", "--minibatch", "4", "--max-lag", "1", "--splits", "2,4",
               "--planners", "stock,stock_split,async,asp", "--cost-file", str(cost), "--calibrate-log", str(log),
               "--quiet", "--out", str(tmp_path / "o"), "--json", str(tmp_path / "copy.json")])
    assert rc == 0
    data = json.loads((tmp_path / "o" / "whatif.json").read_text())
    assert (tmp_path / "o" / "whatif.png").stat().st_size > 0
    assert json.loads((tmp_path / "copy.json").read_text())["rows"] == data["rows"]
    modes = {r["mode"] for r in data["rows"]}
    assert modes == {"colocated", "stock_split", "async", "asp"}
    assert any(r.get("asp_search") == "full" for r in data["rows"])  # the refine step ran
    assert "calibration" in data["assumptions"]
    # the trainer was calibrated on timing/update: colocated update time on 8 devices = the log's 6 s per
    # iteration of 8 groups x n=4 x (24 + 48) tokens (modulo the workload's own lengths)
    stock = next(r for r in data["rows"] if r["mode"] == "colocated")
    assert stock["train_s"] > 0
    assert data["setting"]["cost"]["a"] == pytest.approx(0.02 * data["setting"]["cost"]["b"] / 1e-4)


@pytest.mark.parametrize("argv,flag", [
    (["--devices", "16"], "--model"),
    (["--model", "qwen25_7b"], "--devices"),
    (["--model", "nope", "--devices", "16"], "--model"),
    (["--model", "qwen25_7b", "--devices", "16", "--max-lag", "one"], "--max-lag"),
    (["--model", "qwen25_7b", "--devices", "16", "--planners", "magic"], "--planners"),
    (["--model", "qwen25_32b", "--devices", "32", "--tp", "4", "--splits", "7"], "--splits"),
    (["--model", "qwen25_32b", "--devices", "30", "--tp", "4"], "--tp"),
    (["--model", "qwen25_32b", "--devices", "8", "--tp", "1"], "--tp"),  # the weights do not fit one die
    (["--model", "qwen25_32b", "--devices", "8", "--tp", "2", "--mem-util-colocated", "0.3"], "--mem-util-colocated"),
    (["--model", "qwen25_7b", "--devices", "16", "--windows", "2"], "--windows"),
    (["--model", "qwen25_7b", "--devices", "16", "--train-efficiency", "2"], "--train-efficiency"),
    (["--config", "configs/none.yaml"], "--config"),
    (["--model", "qwen25_7b", "--devices", "16", "--cost-file", "/nonexistent/cost.json"], "--cost-file"),
    (["--model", "qwen25_7b", "--devices", "16", "--workload", "synthetic:prompts=40,n=4,cap=64,median=16"],
     "--workload"),
])
def test_whatif_bad_input_names_the_flag(argv, flag, capsys):
    rc = main(["whatif", "--quiet", "--no-plots"] + argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert flag in err and "Traceback" not in err


def test_an_instance_the_weights_do_not_fit_is_refused_not_simulated_without_a_kv_limit():
    """A KV budget of 0 tokens once became 'no limit' (`or None`): a 32B model on one 64 GB die was simulated
    with unbounded KV cache. The setting is refused, and the cluster model never returns an unbounded budget."""
    from mindspeed_asp.errors import InputError
    from mindspeed_asp.experiments import whatif as wi
    from mindspeed_asp.sim.model_presets import get_device, get_preset

    s = wi.Setting(preset=get_preset("qwen25_32b"), device=get_device("A3"), devices=8, tp=1)
    with pytest.raises(InputError, match="leave no KV cache.*TP 2"):
        wi.check_fits(s)
    model = wi.build_model(s)
    with pytest.raises(ValueError, match="does not fit"):
        model.kv_split(1)
    assert model.kv_split(2) == s.preset.kv_budget(2, s.device, s.mem_util_split) > 0


def test_the_default_tp_holds_the_model_in_both_layouts(tmp_path, capsys):
    # qwen25_32b (65.6 GB) fits TP 2 at a split's 0.9 but not a colocated engine's default 0.5: TP 4
    assert main(["whatif", "--quiet", "--no-plots", "--model", "qwen25_32b", "--devices", "16", "--windows", "3",
                 "--window-groups", "8", "--minibatch", "8", "--max-lag", "1", "--planners", "stock,async",
                 "--workload", "synthetic:prompts=24,n=2,cap=256,median=64", "--no-refine",
                 "--json", str(tmp_path / "w.json")]) == 0
    capsys.readouterr()
    assert json.loads((tmp_path / "w.json").read_text())["setting"]["tp"] == 4
