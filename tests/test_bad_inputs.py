"""Every command over a catalogue of bad inputs: each is refused with one line naming the file, line or key.

For every case: a non-zero exit, exactly one line on stderr (`asp <command>: error: ...`) that names what is
wrong, no traceback, and the workspace byte-for-byte unchanged (nothing half-written, no temporary file left,
no previous output lost: the outputs the cases aim at exist beforehand with known content). The refusals all
happen before Ray or vLLM could start; the Ray entry points are replaced by tripwires to prove it. A few cases
run through a real subprocess (`python -m mindspeed_asp`) to show the same in real use.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Dict, List, Sequence

import pytest

from mindspeed_asp.cli import build_parser, main

SENTINEL = b"previous output: must survive\n"
NOT_UTF8 = b"\xff\xfe"


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _write_tiny_plans(root: Path) -> None:
    """Plans for the packaged tiny run's dataset: one built with another minibatch, one with a NaN prediction."""
    from mindspeed_asp.runtime.tasks import task_and_prompts
    from mindspeed_asp.runtime.run_config import load_run_config, packaged_config_path
    from mindspeed_asp.scheduler.build import build_plan, estimate_lengths

    cfg = load_run_config(packaged_config_path())
    _, prompts = task_and_prompts(cfg)
    est = estimate_lengths(prompts, None, cfg.data.max_new_tokens)
    window = cfg.asp.replan_every * cfg.asp.minibatch_groups
    plan = build_plan(prompts, est, instances=cfg.asp.instances, slots=cfg.asp.slots, minibatch=4,
                      max_new_tokens=cfg.data.max_new_tokens, planner="stock", groups_per_iteration=window,
                      progress=False).plan
    plan.save(root / "plan_mb4.jsonl")
    lines = (root / "plan_mb4.jsonl").read_bytes().splitlines(keepends=True)
    row = json.loads(lines[1])
    row["pred_median"] = float("nan")
    _write(root / "plan_nan.jsonl", lines[0] + json.dumps(row).encode() + b"\n" + b"".join(lines[2:]))
    # a header giving slots twice (json alone keeps the last), in JSON Lines and in Parquet's schema metadata
    _write(root / "plan_dupkey.jsonl", b'{"slots": 99, ' + lines[0][1:] + b"".join(lines[1:]))
    import pyarrow.parquet as pq
    from mindspeed_asp.scheduler.plan_file import META_KEY

    plan.save(root / "plan_dupkey.parquet")
    table = pq.read_table(root / "plan_dupkey.parquet")
    header = table.schema.metadata[META_KEY]
    pq.write_table(table.replace_schema_metadata({META_KEY: b'{"slots": 99, ' + header[1:]}),
                   root / "plan_dupkey.parquet")


def _write_parquet_histories(root: Path) -> None:
    """Parquet histories whose lengths a numpy cast would have taken: booleans (True became a length of 1), a
    uint64 beyond int64 (wrapped to a negative), a lengths column that is no list (an AttributeError)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids, epochs = pa.array(["a", "b"]), pa.array([0, 0], type=pa.int64())
    for name, lengths in (("bool", pa.array([[True, True], [True]], type=pa.list_(pa.bool_()))),
                          ("uint", pa.array([[3, 2**63 + 5], [4]], type=pa.list_(pa.uint64()))),
                          ("flat", pa.array([3, 4], type=pa.int64()))):
        pq.write_table(pa.table({"prompt_id": ids, "epoch": epochs, "lengths": lengths}),
                       root / f"{name}_hist.parquet")


def _write_checkpoint(run: Path, version: int, steps: int) -> None:
    """A run directory holding a checkpoint at `version` of a `steps`-update tiny run (what --resume reads)."""
    from mindspeed_asp.runtime.checkpoint import FORMAT
    from mindspeed_asp.runtime.run_config import dump_config, load_run_config, packaged_config_path

    config = dump_config(load_run_config(packaged_config_path(), [f"run.steps={steps}"]))
    _write(run / "metrics.jsonl", SENTINEL)
    _write(run / "checkpoint" / "latest.json", b'{"dir": "ckpt-000002-1", "version": 2}\n')
    _write(run / "checkpoint" / "ckpt-000002-1" / "state.json",
           json.dumps({"format": FORMAT, "version": version, "config": config}).encode())
    # a well-formed zip archive (torch.save's container format), written without torch so the catalogue also
    # runs in a core-only install: --resume refuses these runs before it reads the archive
    with zipfile.ZipFile(run / "checkpoint" / "ckpt-000002-1" / "trainer.pt", "w") as archive:
        archive.writestr("trainer/data.pkl", b"refused before it is read")


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """The workspace every case starts from: good inputs, bad inputs and outputs that must survive."""
    root = tmp_path_factory.mktemp("bad_inputs")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert main(["lengths", "synth", "--prompts", "16", "--epochs", "2", "--n", "4", "--small",
                     "-o", "h.jsonl"]) == 0
    finally:
        os.chdir(cwd)
    good = (root / "h.prompts.jsonl").read_bytes().splitlines(keepends=True)
    _write(root / "bad.jsonl", good[0] + b'{"prompt_id": "x' + NOT_UTF8 + b'", "prompt_len": 3}\n')
    hist = (root / "h.jsonl").read_bytes().splitlines(keepends=True)
    _write(root / "bad_hist.jsonl", hist[0] + b'{"prompt_id": "' + NOT_UTF8 + b'", "epoch": 0, "lengths": [1]}\n')
    # a length beyond int64, one of 10^12 tokens, a zero one in the latest epoch (the truth a back-test simulates)
    for name, value in (("huge", b"99999999999999999999"), ("tera", b"1000000000000"), ("zero", b"0")):
        last = hist[-1].replace(b'"lengths": [', b'"lengths": [' + value + b", ", 1)
        _write(root / f"{name}_hist.jsonl", b"".join(hist[:-1]) + last)
    _write(root / "bad.yaml", b"asp:\n  slots: 4  # " + NOT_UTF8 + b"\n")
    asp = "asp:\n  instances: 2\n  slots: 8\n  minibatch_groups: 4\n"
    _write(root / "cfg_nope.yaml", (asp + "  planner: nope\n").encode())
    _write(root / "cfg_nan.yaml", (asp + "  rho: .nan\n").encode())
    _write(root / "cfg_hist.yaml", (asp + "  history_path: nowhere.jsonl\n").encode())
    _write(root / "cfg_dup.yaml", (asp + "  slots: 16\n").encode())  # slots twice: YAML alone keeps the last
    _write(root / "cfg_bool.yaml", b"asp:\n  instances: true\n  slots: 8\n  minibatch_groups: 4\n")
    _write(root / "run_dup.yaml", b"run:\n  steps: 2\n  seed: 1\n  steps: 3\n")
    _write(root / "run_seed.yaml", b"run:\n  seed: 100000000000000000000000\n")
    _write_tiny_plans(root)
    _write(root / "cost_nan.json", b'{"a": NaN, "b": 0.0, "c": 0.0}\n')
    _write(root / "cost_huge.json", b'{"a": 1' + b"0" * 400 + b', "b": 0.0, "c": 0.0}\n')  # beyond float's range
    _write(root / "timings_huge.jsonl", b'{"active": 1, "kv_tokens": 1' + b"0" * 400 + b', "step_time": 0.1}\n')
    _write(root / "cost_bad.json", b'{"a": 0.1, "b": 0.0, "c": 0.0, "source": "' + NOT_UTF8 + b'"}\n')
    # a key given twice in each kind of JSON input (json alone keeps the last value silently)
    _write(root / "cost_dup.json", b'{"a": 0.1,\n "b": 0.0,\n "a": 0.2, "c": 0.0}\n')
    _write(root / "cfg_cost_dup.yaml", (asp + "  cost: {file: cost_dup.json}\n").encode())
    _write(root / "dupkey_hist.jsonl", hist[0] + b'{"prompt_id": "zz", "epoch": 0, "lengths": [5], "epoch": 1}\n')
    _write(root / "dupkey_prompts.jsonl", good[0] + b'{"prompt_id": "q", "prompt_len": 3, "prompt_len": 4}\n')
    _write(root / "dupkey_prompts.json", b'[{"prompt_id": "a", "prompt_len": 3},\n {"prompt_id": "b",\n'
           b'  "prompt_len": 4, "prompt_len": 5}]\n')
    _write(root / "timings_dup.jsonl", b'{"active": 1, "kv_tokens": 10, "step_time": 0.1, "step_time": 0.2}\n')
    _write(root / "run_dupkey" / "summary.json", b'{"mode": "asp", "steps": 2,\n "mode": "stock"}\n')
    _write_parquet_histories(root)
    _write(root / "afile", SENTINEL)
    (root / "adir.jsonl").mkdir()
    for out in ("p.jsonl", "s.json", "c.json", "x.jsonl", "sim/simulate.json"):
        _write(root / out, SENTINEL)
    for f in ("summary.json", "rollout_log.jsonl", "metrics.jsonl"):
        _write(root / "run_old" / f, SENTINEL)
    _write(root / "demo_old" / "stock" / "summary.json", SENTINEL)
    _write(root / "run_bad" / "summary.json", b'{"mode": "' + NOT_UTF8 + b'"}\n')
    _write_checkpoint(root / "run_ckpt", version=2, steps=4)
    _write_checkpoint(root / "run_torn", version=2, steps=4)
    torn = root / "run_torn" / "checkpoint" / "ckpt-000002-1" / "trainer.pt"
    torn.write_bytes(torn.read_bytes()[:100])  # a copy cut short
    return root


@pytest.fixture
def workspace(template, tmp_path, monkeypatch) -> Path:
    """A fresh copy of the template as the working directory, with Ray and the run loop as tripwires."""
    ws = tmp_path / "ws"
    shutil.copytree(template, ws)
    monkeypatch.chdir(ws)
    from mindspeed_asp.runtime import driver, ray_utils

    def tripwire(*args, **kwargs):
        raise AssertionError("a bad input reached Ray / the run loop instead of being refused first")

    for mod, name in ((ray_utils, "start_local_ray"), (ray_utils, "connect_ray"), (driver, "run_training")):
        monkeypatch.setattr(mod, name, tripwire)
    return ws


def _snapshot(root: Path) -> Dict[str, bytes]:
    """Every file under `root` (hidden ones too: a leftover temporary file counts) with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


PLAN = ["plan", "--dataset", "h.prompts.jsonl", "--history", "h.jsonl", "--instances", "2", "--slots", "8",
        "--minibatch", "4", "--no-progress", "-o", "p.jsonl"]
SIM = ["simulate", "--workload", "synthetic:prompts=8,n=2,regime=small", "--planners", "asp", "--instances", "2",
       "--slots", "8", "--minibatch", "2", "--out", "sim", "--no-plots", "--quiet"]
SYNTH = ["lengths", "synth", "--prompts", "8", "--epochs", "1", "-o", "x.jsonl"]
EVAL = ["lengths", "eval", "--trace", "synthetic:prompts=8,n=2"]
FIT = ["fit-cost", "--slots", "1,2", "--contexts", "16,32", "-o", "c.json"]
TRAIN = ["train", "--quiet", "--out", "run_new"]
DEMO = ["demo", "--quiet", "--out", "demo_new"]


def _plan(*extra: str) -> List[str]:
    """PLAN with `extra` flag/value pairs; a flag given again replaces the default one."""
    argv = list(PLAN)
    for flag in extra[0::2]:
        if flag in argv:
            j = argv.index(flag)
            del argv[j:j + 2]
    return argv + list(extra)


WHATIF = ["whatif", "--model", "qwen25_7b", "--devices", "8", "--planners", "asp", "--max-lag", "1", "--no-refine",
          "--no-plots", "--quiet"]

# (case id, argv, substrings the one error line must contain)
CATALOGUE = [
    # asp lengths synth
    ("synth-prompts-0", SYNTH[:3] + ["0"] + SYNTH[4:], ["--prompts"]),
    ("synth-epochs-0", SYNTH[:5] + ["0"] + SYNTH[6:], ["--epochs"]),
    ("synth-median-nan", SYNTH + ["--median", "nan"], ["--median"]),
    ("synth-trend-inf", SYNTH + ["--trend", "inf"], ["--trend"]),
    ("synth-n-huge", SYNTH + ["--n", "99999999999"], ["--n"]),
    ("synth-too-large", ["lengths", "synth", "--prompts", "2000000000", "--epochs", "50", "-o", "x.jsonl"],
     ["--prompts", "GiB"]),
    ("synth-parent-is-file", SYNTH[:-1] + ["afile/h.jsonl"], ["afile", "-o"]),
    ("synth-target-is-dir", SYNTH[:-1] + ["adir.jsonl"], ["adir.jsonl", "directory"]),
    ("synth-dataset-parent-file", SYNTH + ["--dataset", "afile/d.jsonl"], ["--dataset"]),
    # asp lengths eval / describe
    ("eval-spec-nan", ["lengths", "eval", "--trace", "synthetic:prompts=8,median=nan"], ["median"]),
    ("eval-quantile-nan", EVAL + ["--quantile", "nan"], ["--quantile"]),
    ("eval-decay-inf", EVAL + ["--recency-decay", "inf"], ["--recency-decay"]),
    ("eval-not-utf8", ["lengths", "eval", "--trace", "history:bad_hist.jsonl"], ["bad_hist.jsonl:2", "UTF-8"]),
    ("eval-too-large", ["lengths", "eval", "--trace", "synthetic:prompts=90000000000,n=64"], ["prompts", "GiB"]),
    ("eval-json-parent-file", EVAL + ["--json", "afile/e.json"], ["--json"]),
    ("eval-history-length-beyond-int64", ["lengths", "eval", "--trace", "history:huge_hist.jsonl"],
     ["huge_hist.jsonl:32", "'lengths'", "99999999999999999999"]),
    ("eval-history-length-tera", ["lengths", "eval", "--trace", "history:tera_hist.jsonl"],
     ["tera_hist.jsonl:32", "'lengths'", "out of range"]),
    ("eval-max-new-tokens-huge", EVAL + ["--max-new-tokens", "100000000"], ["--max-new-tokens"]),
    ("synth-seed-huge", SYNTH + ["--seed", str(2**32)], ["--seed", "4294967295"]),
    ("synth-cap-huge", SYNTH + ["--cap", "100000000"], ["--cap", "10000000"]),
    ("describe-json-parent-file", ["lengths", "describe", "--trace", "synthetic:prompts=8", "--json",
                                   "afile/e.json"], ["--json"]),
    # asp plan
    ("plan-rho-nan", _plan("--rho", "nan"), ["--rho"]),
    ("plan-rho-inf", _plan("--rho", "inf"), ["--rho"]),
    ("plan-rho-negative", _plan("--rho", "-1"), ["--rho"]),
    ("plan-instances-0", _plan("--instances", "0"), ["--instances"]),
    ("plan-n-out-of-range", _plan("--n", str(2**40)), ["--n"]),
    ("plan-too-large", _plan("--instances", "100000000", "--slots", "100000000"), ["--slots", "GiB"]),
    ("plan-dataset-not-utf8", _plan("--dataset", "bad.jsonl"), ["bad.jsonl:2", "UTF-8"]),
    ("plan-history-not-utf8", _plan("--history", "bad_hist.jsonl"), ["bad_hist.jsonl:2", "UTF-8"]),
    ("plan-history-missing", _plan("--history", "nowhere.jsonl"), ["nowhere.jsonl", "--history"]),
    ("plan-config-not-utf8", _plan("--config", "bad.yaml"), ["bad.yaml:2", "UTF-8"]),
    ("plan-config-planner", _plan("--config", "cfg_nope.yaml"), ["cfg_nope.yaml", "asp.planner"]),
    ("plan-config-rho-nan", _plan("--config", "cfg_nan.yaml"), ["cfg_nan.yaml", "asp.rho"]),
    ("plan-config-history-missing", ["plan", "--dataset", "h.prompts.jsonl", "--config", "cfg_hist.yaml",
                                     "--max-new-tokens", "64", "-o", "p.jsonl"], ["asp.history_path"]),
    ("plan-planner", _plan("--planner", "nope"), ["--planner"]),
    ("plan-cost-nan", _plan("--cost", "cost_nan.json"), ["cost_nan.json", "'a'"]),
    ("plan-cost-not-utf8", _plan("--cost", "cost_bad.json"), ["cost_bad.json:1", "UTF-8"]),
    ("plan-cost-beyond-float", _plan("--cost", "cost_huge.json"), ["cost_huge.json", "'a'", "finite number"]),
    ("plan-out-parent-file", _plan("-o", "afile/p.jsonl"), ["afile", "-o"]),
    ("plan-out-is-dir", _plan("-o", "adir.jsonl"), ["adir.jsonl", "directory"]),
    ("plan-json-parent-file", _plan("--json", "afile/s.json"), ["--json"]),
    ("plan-kv-budget-below-one-sequence", _plan("--kv-budget", "10"), ["--kv-budget", "cannot hold one sequence"]),
    ("plan-history-length-beyond-int64", _plan("--history", "huge_hist.jsonl"),
     ["huge_hist.jsonl:32", "'lengths'", "99999999999999999999", "10,000,000 tokens"]),
    ("plan-history-length-tera", _plan("--history", "tera_hist.jsonl"),
     ["tera_hist.jsonl:32", "'lengths'", "1000000000000", "out of range"]),
    ("plan-history-length-zero", _plan("--history", "zero_hist.jsonl"),
     ["zero_hist.jsonl:32", "'lengths'", "length 0", "at least one token"]),
    ("plan-max-new-tokens-huge", _plan("--max-new-tokens", "100000000"), ["--max-new-tokens", "10000000"]),
    ("plan-seed-huge", _plan("--seed", str(2**32)), ["--seed", "4294967295"]),
    ("plan-config-duplicate-key", PLAN[:3] + ["--config", "cfg_dup.yaml", "--no-progress", "-o", "p.jsonl"],
     ["cfg_dup.yaml:5", "asp.slots", "duplicate key", "line 3"]),
    ("plan-config-bool-int", PLAN[:3] + ["--config", "cfg_bool.yaml", "--no-progress", "-o", "p.jsonl"],
     ["cfg_bool.yaml", "asp.instances", "boolean"]),
    ("plan-instances-over-groups", _plan("--instances", "100000"), ["--instances", "16 groups per iteration"]),
    ("plan-instances-over-window", _plan("--instances", "8", "--groups-per-iteration", "4"),
     ["--instances", "--groups-per-iteration 4"]),
    ("plan-slots-below-n", _plan("--slots", "1", "--n", "4"), ["--slots 1", "--n 4"]),
    # a JSON key given twice, in every JSON input `asp plan` reads (json alone keeps the last value silently)
    ("plan-cost-duplicate-key", _plan("--cost", "cost_dup.json"), ["cost_dup.json:3", "'a'", "duplicate key",
                                                                   "first given on line 1"]),
    ("plan-config-cost-file-duplicate-key", _plan("--config", "cfg_cost_dup.yaml"),
     ["cost_dup.json:3", "'a'", "duplicate key"]),
    ("plan-history-duplicate-key", _plan("--history", "dupkey_hist.jsonl"),
     ["dupkey_hist.jsonl:2", "'epoch'", "duplicate key"]),
    ("plan-dataset-duplicate-key", _plan("--dataset", "dupkey_prompts.jsonl"),
     ["dupkey_prompts.jsonl:2", "'prompt_len'", "duplicate key"]),
    ("plan-dataset-array-duplicate-key", _plan("--dataset", "dupkey_prompts.json"),
     ["dupkey_prompts.json:3", "'prompt_len'", "duplicate key", "first given on line 3"]),
    # asp simulate
    ("sim-sync-time-nan", SIM + ["--sync-time", "nan"], ["--sync-time"]),
    ("sim-overhead-negative", SIM + ["--overhead", "-1"], ["--overhead"]),
    ("sim-rho-inf", SIM + ["--rho", "inf"], ["--rho"]),
    ("sim-seed-conflict", SIM[:2] + ["synthetic:prompts=8,n=2,seed=3"] + SIM[3:] + ["--seeds", "1"], ["--seeds"]),
    ("sim-seeds-too-many", SIM + ["--seeds", "0-100000000"], ["--seeds"]),
    ("sim-seeds-descending", SIM + ["--seeds", "3-1"], ["--seeds", "'3-1' is empty", "1-3"]),
    ("sim-too-large", SIM + ["--instances", "100000000", "--slots", "100000000"], ["--slots", "GiB"]),
    ("sim-cost-not-utf8", SIM + ["--cost-file", "cost_bad.json"], ["cost_bad.json:1"]),
    ("sim-out-is-file", SIM[:-3] + ["afile", "--no-plots", "--quiet"], ["afile", "--out"]),
    ("sim-kv-budget-below-one-sequence", SIM + ["--kv-budget", "10"], ["--kv-budget", "cannot hold one sequence"]),
    ("sim-history-length-beyond-int64", SIM[:2] + ["history:huge_hist.jsonl"] + SIM[3:],
     ["huge_hist.jsonl:32", "'lengths'", "10,000,000 tokens"]),
    ("sim-history-length-zero", SIM[:2] + ["history:zero_hist.jsonl"] + SIM[3:],
     ["zero_hist.jsonl:32", "'lengths'", "length 0"]),
    ("sim-spec-seed-huge", SIM[:2] + ["synthetic:prompts=8,n=2,seed=" + "9" * 23] + SIM[3:], ["seed", "4294967295"]),
    ("sim-spec-cap-huge", SIM[:2] + ["synthetic:prompts=8,n=2,cap=" + "9" * 20] + SIM[3:], ["cap", "10,000,000"]),
    ("sim-seeds-huge", SIM + ["--seeds", str(2**32)], ["--seeds", "4294967295"]),
    ("sim-instances-over-groups", SIM[:5] + ["--instances", "100000"] + SIM[7:], ["--instances", "8 groups"]),
    ("sim-slots-below-n", SIM[:7] + ["--slots", "1"] + SIM[9:], ["--slots 1", "n=2"]),
    ("sim-cost-duplicate-key", SIM + ["--cost-file", "cost_dup.json"], ["cost_dup.json:3", "'a'", "duplicate key"]),
    ("sim-history-parquet-bool-lengths", SIM[:2] + ["history:bool_hist.parquet"] + SIM[3:],
     ["bool_hist.parquet", "'lengths'", "must be integers", "bool"]),
    ("sim-history-parquet-uint64-length", SIM[:2] + ["history:uint_hist.parquet"] + SIM[3:],
     ["uint_hist.parquet", "row 1", "'lengths'", "9223372036854775813", "out of range"]),
    ("sim-history-parquet-lengths-not-a-list", SIM[:2] + ["history:flat_hist.parquet"] + SIM[3:],
     ["flat_hist.parquet", "'lengths'", "list column"]),
    # asp whatif: its shape flags bounded as asp plan/simulate bound theirs
    ("whatif-slots-huge", WHATIF + ["--slots", "2000000000"], ["--slots", "GiB"]),
    ("whatif-slots-below-n", WHATIF + ["--slots", "4"], ["--slots 4", "n=8"]),
    ("whatif-window-groups-huge", WHATIF + ["--window-groups", "2000000000"], ["--window-groups", "GiB"]),
    ("whatif-windows-huge", WHATIF + ["--windows", "300000000"], ["--windows", "GiB"]),
    # asp fit-cost (refused before any engine starts)
    ("fit-gmu-nan", FIT + ["--gpu-memory-utilization", "nan"], ["--gpu-memory-utilization"]),
    ("fit-decode-steps-0", FIT + ["--decode-steps", "0"], ["--decode-steps"]),
    ("fit-out-parent-file", FIT[:-1] + ["afile/c.json"], ["afile", "-o"]),
    ("fit-timings-beyond-float", ["fit-cost", "--timings", "timings_huge.jsonl", "-o", "c.json"],
     ["timings_huge.jsonl:1", "'kv_tokens'", "not a number"]),
    ("fit-timings-duplicate-key", ["fit-cost", "--timings", "timings_dup.jsonl", "-o", "c.json"],
     ["timings_dup.jsonl:1", "'step_time'", "duplicate key"]),
    # asp train (refused before Ray starts)
    ("train-out-holds-run", ["train", "--quiet", "--out", "run_old"], ["run_old", "--overwrite", "--resume"]),
    ("train-out-is-file", ["train", "--quiet", "--out", "afile"], ["afile", "--out"]),
    ("train-planner", TRAIN + ["asp.planner=nope"], ["asp.planner"]),
    ("train-history-missing", TRAIN + ["asp.history_path=nowhere.jsonl"], ["asp.history_path"]),
    ("train-cost-file-missing", TRAIN + ["asp.cost.file=nowhere.json"], ["asp.cost.file"]),
    ("train-rho-nan", TRAIN + ["asp.rho=.nan"], ["asp.rho"]),
    ("train-lr-inf", TRAIN + ["trainer.lr=.inf"], ["trainer.lr"]),
    ("train-n-over-slots", TRAIN + ["data.n=64"], ["data.n"]),
    ("train-n-one", TRAIN + ["data.n=1"], ["data.n", "greater than or equal to 2"]),
    ("train-seed-huge", TRAIN + ["run.seed=100000000000000000000000"],
     ["run.seed", "4294967295", "'run.seed=100000000000000000000000'"]),
    ("train-seed-negative", TRAIN + ["data.seed=-1"], ["data.seed", "a seed must be in 0 .. 4294967295"]),
    ("train-init-seed-2-32", TRAIN + [f"model.init_seed={2**32}"], ["model.init_seed", "4294967295"]),
    ("train-seed-in-yaml", TRAIN + ["--config", "run_seed.yaml"], ["run_seed.yaml", "run.seed", "4294967295"]),
    ("train-override-twice", TRAIN + ["run.steps=3", "run.steps=x"],
     ["run.steps", "'run.steps=3'", "'run.steps=x'", "set twice"]),
    ("train-override-twice-good-then-bad", TRAIN + ["run.steps=x", "run.steps=3"], ["'run.steps=x'", "set twice"]),
    ("train-flag-and-override", TRAIN + ["--mode", "stock", "asp.mode=asp"], ["asp.mode", "--mode stock",
                                                                             "'asp.mode=asp'"]),
    ("train-out-flag-and-override", TRAIN + ["run.out=elsewhere"], ["run.out", "--out run_new"]),
    ("train-override-bool-int", TRAIN + ["asp.slots=yes"], ["asp.slots", "boolean", "'asp.slots=yes'"]),
    ("train-override-bool-float", TRAIN + ["trainer.lr=true"], ["trainer.lr", "boolean"]),
    ("train-override-bad-yaml", TRAIN + ["run.steps=["], ["run.steps", "invalid YAML", "'run.steps=['"]),
    ("train-override-duplicate-yaml-key", TRAIN + ["asp.estimator={kind: history, kind: oracle}"],
     ["asp.estimator.kind", "duplicate key"]),
    ("train-config-duplicate-key", TRAIN + ["--config", "run_dup.yaml"], ["run_dup.yaml:4", "run.steps", "line 2"]),
    ("train-max-model-len-huge", TRAIN + ["model.max_model_len=100000000"], ["model.max_model_len", "10000000"]),
    ("train-timeout-beyond-a-week", TRAIN + ["run.step_timeout_s=1e9"],
     ["run.step_timeout_s", "a timeout is at most 604800 s", "'run.step_timeout_s=1e9'"]),
    ("train-stock-with-a-lag", TRAIN + ["--mode", "stock", "asp.max_lag=2"],
     ["asp.max_lag", "asp.mode=stock trains at lag 0 only", "(--mode stock)", "'asp.max_lag=2'"]),
    ("train-plan-other-minibatch", TRAIN + ["asp.plan_path=plan_mb4.jsonl"],
     ["asp.plan_path", "minibatch_groups=4", "asp.minibatch_groups=8", "asp plan --minibatch 8"]),
    ("train-plan-nan-prediction", TRAIN + ["asp.plan_path=plan_nan.jsonl"],
     ["asp.plan_path", "plan_nan.jsonl:2", "'pred_median'", "nan"]),
    ("train-plan-header-duplicate-key", TRAIN + ["asp.plan_path=plan_dupkey.jsonl"],
     ["asp.plan_path", "plan_dupkey.jsonl:1", "'slots'", "duplicate key"]),
    ("train-plan-parquet-header-duplicate-key", TRAIN + ["asp.plan_path=plan_dupkey.parquet"],
     ["asp.plan_path", "plan_dupkey.parquet", "'mindspeed_asp.plan.slots'", "duplicate key"]),
    ("train-cost-file-duplicate-key", TRAIN + ["asp.cost.file=cost_dup.json"],
     ["asp.cost.file", "cost_dup.json:3", "'a'", "duplicate key"]),
    ("train-cost-file-nan", TRAIN + ["asp.cost.file=cost_nan.json"], ["asp.cost.file", "cost_nan.json", "'a'"]),
    ("train-config-not-utf8", TRAIN + ["--config", "bad.yaml"], ["bad.yaml:2", "UTF-8"]),
    ("train-msrl-training-yaml", TRAIN + ["--config", str(Path(__file__).resolve().parents[1] / "configs"
                                                          / "qwen25_7b_A3_asp.yaml")],
     ["MindSpeed-RL training YAML", "shell/"]),
    ("train-resume-no-checkpoint", ["train", "--quiet", "--resume", "run_old"], ["run_old", "no checkpoint"]),
    ("train-resume-overwrite", ["train", "--quiet", "--resume", "run_ckpt", "--overwrite"], ["--overwrite"]),
    ("train-resume-config", ["train", "--quiet", "--resume", "run_ckpt", "--config", "bad.yaml"], ["--config"]),
    ("train-resume-max-lag", ["train", "--quiet", "--resume", "run_ckpt", "asp.max_lag=3"],
     ["asp.max_lag", "state.json", "cannot change"]),
    ("train-resume-mode", ["train", "--quiet", "--resume", "run_ckpt", "--mode", "stock"], ["asp.mode"]),
    ("train-resume-steps-reached", ["train", "--quiet", "--resume", "run_ckpt", "run.steps=2"],
     ["run.steps", "nothing left to run"]),
    ("train-resume-torn-trainer-file", ["train", "--quiet", "--resume", "run_torn"],
     ["run_torn/checkpoint/ckpt-000002-1/trainer.pt", "--resume", "truncated"]),
    # asp compare
    ("compare-summary-not-utf8", ["compare", "run_bad", "run_old"], ["run_bad/summary.json:1", "UTF-8"]),
    ("compare-summary-duplicate-key", ["compare", "run_dupkey", "run_old"],
     ["run_dupkey/summary.json:2", "'mode'", "duplicate key"]),
    ("compare-json-parent-file", ["compare", "run_old", "--json", "afile/c.json"], ["--json"]),
    # asp demo (refused before Ray starts)
    ("demo-out-holds-run", ["demo", "--quiet", "--out", "demo_old"], ["demo_old", "--overwrite"]),
    ("demo-planner", DEMO + ["asp.planner=nope"], ["asp.planner"]),
    ("demo-out-is-file", ["demo", "--quiet", "--out", "afile"], ["afile", "--out"]),
    ("demo-override-twice", DEMO + ["asp.max_lag=2", "asp.max_lag=3"], ["asp.max_lag", "set twice"]),
    ("demo-mode-override", DEMO + ["asp.mode=stock"], ["asp.mode", "--modes"]),
]


def _assert_one_error_line(err: str, out: str, expect: Sequence[str]) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one error line, got:\n{err}"
    line = lines[0]
    assert line.startswith("asp") and ": error: " in line, line
    assert "Traceback" not in err + out
    for want in expect:
        assert want in line, f"{want!r} not named in: {line}"
    return line


@pytest.mark.parametrize("argv,expect", [c[1:] for c in CATALOGUE], ids=[c[0] for c in CATALOGUE])
def test_bad_input_is_refused_with_one_named_line(workspace, capsys, argv, expect):
    before = _snapshot(workspace)
    rc = main(list(argv))
    captured = capsys.readouterr()
    assert rc != 0, captured.out
    _assert_one_error_line(captured.err, captured.out, expect)
    assert _snapshot(workspace) == before, "a refused command changed, removed or half-wrote a file"


@pytest.mark.parametrize("argv,command", [(FIT, "fit-cost"), (TRAIN, "train"), (DEMO, "demo")],
                         ids=["fit-cost", "train", "demo"])
def test_missing_extra_names_the_pip_line(workspace, capsys, monkeypatch, argv, command):
    monkeypatch.setitem(sys.modules, "vllm", None)  # what a core-only install looks like to import
    before = _snapshot(workspace)
    assert main(list(argv)) != 0
    captured = capsys.readouterr()
    line = _assert_one_error_line(captured.err, captured.out, ["vllm", 'pip install "mindspeed-asp['])
    assert line.startswith(f"asp {command}: error: ")
    assert _snapshot(workspace) == before


@pytest.mark.parametrize("argv,expect", [
    (TRAIN + ["asp.planner=nope"], "asp.planner"),
    (DEMO + ["asp.planner=nope"], "asp.planner"),
    (["train", "--quiet", "--out", "run_old"], "--overwrite"),
    (["train", "--quiet", "--out", "run_old", "--overwrite"], "vllm"),
    (["demo", "--quiet", "--out", "demo_old", "--overwrite"], "vllm"),
], ids=["train-config", "demo-config", "train-output", "train-overwrite", "demo-overwrite"])
def test_user_mistakes_come_before_a_missing_extra(workspace, capsys, monkeypatch, argv, expect):
    """Without the runtime extra, a typo in the config or the output is still what the user hears about; and a
    refusal for the missing extra comes before `--overwrite` clears anything (the old run stays whole)."""
    monkeypatch.setitem(sys.modules, "vllm", None)
    before = _snapshot(workspace)
    assert main(list(argv)) != 0
    captured = capsys.readouterr()
    _assert_one_error_line(captured.err, captured.out, [expect])
    assert _snapshot(workspace) == before


def test_doctor_names_a_bad_config_in_its_report(workspace, capsys):
    """doctor reports every check (it is a report, not a refusal): the config row names file and line."""
    assert main(["doctor", "--config", "bad.yaml"]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    fails = [line for line in captured.out.splitlines() if "[FAIL] config" in line]
    assert len(fails) == 1 and "bad.yaml:2" in fails[0] and "UTF-8" in fails[0]


def test_every_numeric_option_is_typed():
    """No command takes a bare float (accepts nan/inf) or a bare int (any size): see mindspeed_asp.utils.argtypes."""
    untyped = []

    def walk(parser: argparse.ArgumentParser, prog: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{prog} {name}")
            elif action.type in (float, int):
                untyped.append(f"{prog} {'/'.join(action.option_strings)}")

    walk(build_parser(), "asp")
    assert not untyped, f"options parsed with bare float/int: {untyped}"


def test_overwrite_clears_only_the_old_runs_files(tmp_path):
    from mindspeed_asp.errors import OutputError
    from mindspeed_asp.utils.run_dir import RUN_FILES, prepare_run_dir

    run = tmp_path / "run"
    for name in RUN_FILES:
        _write(run / name, SENTINEL)
    _write(run / "notes.txt", SENTINEL)
    with pytest.raises(OutputError, match="--overwrite"):
        prepare_run_dir(run, overwrite=False)
    assert all((run / name).exists() for name in RUN_FILES)
    prepare_run_dir(run, overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]
    assert prepare_run_dir(tmp_path / "fresh", overwrite=False) == tmp_path / "fresh"


def test_interrupted_plan_write_keeps_the_previous_plan(workspace, monkeypatch, capsys):
    """SIGINT while `asp plan` writes over an existing plan: the old plan stays whole, no partial file."""
    import pyarrow.parquet as pq

    assert main(_plan("-o", "old.parquet")) == 0
    old = (workspace / "old.parquet").read_bytes()
    before = _snapshot(workspace)

    def interrupted(table, where, *args, **kwargs):
        Path(where).write_bytes(b"PAR1 half a plan")  # part of the new file is on disk ...
        raise KeyboardInterrupt  # ... when the user presses Ctrl-C

    monkeypatch.setattr(pq, "write_table", interrupted)
    assert main(_plan("-o", "old.parquet", "--seed", "1")) == 130
    assert (workspace / "old.parquet").read_bytes() == old
    assert _snapshot(workspace) == before
    capsys.readouterr()


def test_atomic_write_is_whole_or_absent(tmp_path):
    from mindspeed_asp.utils.atomic import atomic_open, write_json

    target = tmp_path / "out.json"
    write_json(target, {"v": 1})
    mode = target.stat().st_mode
    with pytest.raises(TypeError):
        write_json(target, {"v": object()})  # unserialisable: built before the file is touched
    with pytest.raises(RuntimeError):
        with atomic_open(target) as fh:
            fh.write('{"v": 2, "half')
            raise RuntimeError("crash mid-write")
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
    write_json(target, {"v": 3})
    assert json.loads(target.read_text()) == {"v": 3} and target.stat().st_mode == mode


SUBPROCESS_CASES = [
    ("plan-rho-nan", _plan("--rho", "nan"), "--rho", ""),
    ("plan-dataset-not-utf8", _plan("--dataset", "bad.jsonl"), "bad.jsonl:2", ""),
    ("synth-too-large", ["lengths", "synth", "--prompts", "2000000000", "--epochs", "50", "-o", "x.jsonl"], "GiB", ""),
    ("train-core-only", TRAIN, 'pip install "mindspeed-asp[',
     "import sys; sys.modules['vllm'] = None; "),
]


@pytest.mark.parametrize("argv,expect,prelude", [c[1:] for c in SUBPROCESS_CASES],
                         ids=[c[0] for c in SUBPROCESS_CASES])
def test_refusals_in_a_real_process(template, tmp_path, argv, expect, prelude):
    ws = tmp_path / "ws"
    shutil.copytree(template, ws)
    before = _snapshot(ws)
    code = prelude + "from mindspeed_asp.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", "import sys; " + code, *argv], cwd=ws, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    _assert_one_error_line(proc.stderr, proc.stdout, [expect])
    assert _snapshot(ws) == before


# ============================================================================ MindSpeed-RL's plan path
@pytest.fixture(scope="module")
def msrl_plan(tmp_path_factory):
    """What node 0 builds before a MindSpeed-RL + ASP run (shell/msrl_common.sh: asp_prepare, asp_build_plan)
    for qwen3_8b_A3_asp and 64 exported prompts, with the composed config the run then reads."""
    pytest.importorskip("hydra", reason="the launchers compose configs with Hydra: pip install mindspeed-asp[contract]")
    import numpy as np
    from factories import SHELL, fake_msrl

    tmp = tmp_path_factory.mktemp("msrl_plan")
    rng = np.random.default_rng(0)
    dataset = [{"input_ids": np.arange(int(rng.integers(5, 300)))} for _ in range(64)]
    with open(tmp / "prompts.jsonl", "w") as fh:  # what export_prompts.py writes
        for i, item in enumerate(dataset):
            fh.write(json.dumps({"prompt_id": str(i), "prompt_len": len(item["input_ids"])}) + "\n")
    env = dict(os.environ, MINDSPEED_RL_ROOT=str(fake_msrl(tmp)), RUN_DIR=str(tmp / "run"),
               ASP_PYTHON=sys.executable, ASP_MINDSPEED_RL_COMMIT="05a90d7", ASP_PROMPTS=str(tmp / "prompts.jsonl"))
    env.pop("ASP_PLAN", None)
    out = subprocess.run(["bash", "-c", f"source {SHELL / 'msrl_common.sh'}; asp_prepare qwen3_8b_A3_asp; "
                          "asp_build_plan; echo \"CONFIG_FILE=$CONFIG_FILE\""], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    config = [x.split("=", 1)[1] for x in out.stdout.splitlines() if x.startswith("CONFIG_FILE=")][-1]
    return tmp / "run" / "plan.parquet", config, dataset


def test_msrl_plan_is_checked_against_every_setting_it_depends_on(msrl_plan, monkeypatch):
    """The plan-ordered loader of a MindSpeed-RL run (data_patches.open_plan with the run's topology) accepts
    the plan its launcher built, and refuses one built for another value of any setting the plan depends on
    (scheduler/plan_file.py SETTINGS), naming the MindSpeed-RL key to change and the `asp plan` line: every setting, not
    just the instance count and the dataset, so a plan for another batch, n, cap, slots, lag bound or planner
    cannot drive the run."""
    import dataclasses

    from mindspeed_asp.errors import PlanMismatchError
    from mindspeed_asp.integrations.mindspeed_rl.config_section import load_topology
    from mindspeed_asp.integrations.mindspeed_rl.data_patches import (MSRL_PLAN_SETTING_KEYS, open_plan,
                                                                      prompt_set_from_dataset)
    from mindspeed_asp.scheduler.plan_file import SETTINGS

    path, config, dataset = msrl_plan
    monkeypatch.setenv("ASP_PLAN", str(path))
    topo = load_topology(config)
    assert set(MSRL_PLAN_SETTING_KEYS) == set(SETTINGS)  # a new setting must say where MindSpeed-RL keeps it
    plan = open_plan(str(path), topo.instances, prompt_set_from_dataset(dataset, topo.n), topo=topo)
    assert plan.instances == topo.instances and plan.num_iterations == 2

    def asp(**kw):
        return dataclasses.replace(topo, asp=topo.asp.model_copy(update=kw))

    other = {"n": dataclasses.replace(topo, n=topo.n * 2), "instances": asp(instances=topo.instances * 2),
             "slots": asp(slots=topo.asp.slots // 2), "kv_budget": asp(kv_budget_tokens=100_000),
             "minibatch_groups": asp(minibatch_groups=topo.asp.minibatch_groups // 2),
             "groups_per_iteration": dataclasses.replace(topo, gbs=topo.gbs // 2),
             "max_new_tokens": dataclasses.replace(topo, max_tokens=topo.max_tokens // 2),
             "max_lag": asp(max_lag=topo.asp.max_lag + 1),
             "work_stealing": asp(work_stealing=not topo.asp.work_stealing),
             "planner": asp(planner="lpt")}
    assert set(other) == set(SETTINGS)
    for setting, changed in other.items():
        with pytest.raises(PlanMismatchError) as exc:
            open_plan(str(path), topo.instances, topo=changed)
        message = str(exc.value)
        assert f"built with {setting}=" in message and f"the run has {MSRL_PLAN_SETTING_KEYS[setting]}=" in message
        assert "rebuild the plan for this run (`asp plan" in message and "\n" not in message, message
