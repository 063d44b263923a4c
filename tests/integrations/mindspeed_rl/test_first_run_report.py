"""The first-run report (shell/ascend_first_run.sh's table): each check passes on what a good run logs and
fails, naming the number, on what a broken one logs. The msrl_e2e tier runs it on a real CPU run's outputs."""
from __future__ import annotations

import json
import re

from mindspeed_asp.integrations.mindspeed_rl import first_run_report as fr

GOOD_LOG = "\n".join([
    "mindspeed-asp: 31 patches live after initialize_megatron (pid 101)",
    "mindspeed-asp: 31 patches live after initialize_megatron (pid 102)",
    "asp: start-up: 8 rollout engines built in 312.5 s (asp.engine_start_timeout_s 1800 s)",
    "asp: start-up: 1 weight groups formed in 4.2 s (asp.sync_timeout_s 600 s)",
    "asp: weight probe at version 0: every instance's greedy decode of 16 tokens matches the trainer's forward, "
    "mean |log-prob difference| at most 0.021",
    "iteration: 1 / 2 | e2e_tps : 100.0 | asp/engine_prox_absdiff_lag0 : 0.03 | asp/weight_probe_absdiff : 0.02",
    "iteration: 2 / 2 | e2e_tps : 110.0 | asp/engine_prox_absdiff_lag0 : 0.04",
])
GOOD_AUDIT = [{"sync": {"asp/sync_bytes": 15.2e9, "time/weight_sync": 3.1, "asp/trainer_peak_mem_gib": 41.0}},
              {"sync": {"asp/sync_bytes": 15.2e9, "time/weight_sync": 2.9}}]


def _rows(log, audit, **kw):
    iterations = [r for r in (fr.parse_line(x) for x in log.splitlines()) if r]
    return {r.check: r for r in fr.evaluate(log, iterations, audit, fr.Bounds(2, device_memory_gib=64, **kw))}


def test_a_good_run_passes_every_check_with_its_numbers():
    rows = _rows(GOOD_LOG, GOOD_AUDIT)
    assert {r.status for r in rows.values()} == {fr.PASS, fr.NA}  # the state: no save directory given
    assert rows["engine build time"].value == "8 engines in 312.5 s"
    assert "5.24 GB/s" in rows["weight sync bandwidth"].value
    assert rows["functional weight probe"].value.startswith("max mean |dlogp| 0.021 nats over 2 probes")
    assert "0.04" in rows["engine vs Megatron log-probs, lag 0"].value
    assert rows["patches live after initialize_megatron"].value == "2 workers, 31 patches each"
    assert rows["trainer peak memory (export + update)"].value == "41.0 GiB per rank (max)"


def test_each_broken_run_fails_its_own_check():
    bad = GOOD_LOG.replace("at most 0.021", "at most 2.7")
    assert _rows(bad, GOOD_AUDIT)["functional weight probe"].status == fr.FAIL
    bad = GOOD_LOG.replace("asp/engine_prox_absdiff_lag0 : 0.04", "asp/engine_prox_absdiff_lag0 : 0.4")
    assert _rows(bad, GOOD_AUDIT)["engine vs Megatron log-probs, lag 0"].status == fr.FAIL
    bad = GOOD_LOG.replace("(pid 102)", "(pid 101)")  # one worker never reported
    assert _rows(bad, GOOD_AUDIT)["patches live after initialize_megatron"].status == fr.FAIL
    bad = GOOD_LOG.replace("built in 312.5 s", "built in 1500.0 s")
    assert _rows(bad, GOOD_AUDIT)["engine build time"].status == fr.WARN
    slow = [{"sync": {"asp/sync_bytes": 1e9, "time/weight_sync": 4.0}}]
    assert _rows(GOOD_LOG, slow)["weight sync bandwidth"].status == fr.FAIL
    full = [{"sync": {"asp/sync_bytes": 1e9, "time/weight_sync": 0.1, "asp/trainer_peak_mem_gib": 63.5}}]
    assert _rows(GOOD_LOG, full)["trainer peak memory (export + update)"].status == fr.FAIL
    nothing = _rows("", [])
    assert all(nothing[k].status == fr.FAIL for k in ("engine build time", "weight groups (HCCL init)",
                                                       "weight sync bandwidth", "functional weight probe"))


def test_the_command_prints_the_table_and_fails_on_a_failed_check(tmp_path, capsys):
    log, audit = tmp_path / "train.log", tmp_path / "audit.jsonl"
    log.write_text(GOOD_LOG)
    audit.write_text("\n".join(json.dumps(r) for r in GOOD_AUDIT))
    save = tmp_path / "ckpt"
    (save / "asp_state").mkdir(parents=True)
    (save / "asp_state" / "iter_0000002.json").write_text("{}")
    args = ["--log", str(log), "--audit", str(audit), "--trainer-ranks", "2", "--save-dir", str(save),
            "--train-iters", "2", "--json", str(tmp_path / "rows.json")]
    assert fr.main(args) == 0
    out = capsys.readouterr().out
    assert re.search(r"ASP state beside the checkpoint\s+PASS", out) and "8 of 8 checks pass" in out
    assert fr.main(args[:-4] + ["--train-iters", "3"]) == 1  # no state beside iteration 3
    assert "FAILED: ASP state beside the checkpoint" in capsys.readouterr().out
    audit.write_text("{not json")
    assert fr.main(args) == 2 and "line 1 is not JSON" in capsys.readouterr().err
