"""`asp fit-cost` on a real engine: flag checks and one sweep (the fit itself: tests/test_cost_model.py)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mindspeed_asp.cli import main
from mindspeed_asp.cost_model import load_cost_json


def test_cli_rejects_bad_flags(tmp_path, capsys):
    assert main(["fit-cost", "--slots", "1,x", "-o", str(tmp_path / "c.json")]) == 2
    assert "--slots" in capsys.readouterr().err
    assert main(["fit-cost", "--model", str(tmp_path), "-o", str(tmp_path / "c.json")]) == 2
    assert "config.json" in capsys.readouterr().err
    (tmp_path / "afile").write_text("")  # an output under a file is refused before any engine starts
    assert main(["fit-cost", "-o", str(tmp_path / "afile" / "c.json")]) == 2
    assert "is not a directory" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.vllm
def test_fit_cost_on_real_engine(tmp_path, tiny_model):
    pytest.importorskip("vllm")
    out = tmp_path / "cost.json"
    # a subprocess, as a user runs it: the engine and its thread settings stay out of the test process
    proc = subprocess.run([sys.executable, "-m", "mindspeed_asp", "fit-cost", "--model", tiny_model, "--slots", "1,16",
                           "--contexts", "32,256", "--decode-steps", "6", "--no-progress", "-o", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "R^2" in proc.stdout
    doc = json.loads(out.read_text())
    assert len(doc["samples"]) == 2 * 2 * 7
    assert all(doc[k] >= 0 for k in "abcp") and doc["a"] > 0
    assert doc["residuals"]["n"] == 28 and doc["fit"]["method"]
    assert doc["source"].startswith("asp fit-cost: tiny")
    # the simulator's CostModel reads it
    cm = load_cost_json(out)
    assert cm.a == doc["a"] and cm.c == doc["c"]
    prefill = [s for s in doc["samples"] if s["prefill_tokens"] > 0]
    assert sorted((s["batch"], s["context"]) for s in prefill) == [(1, 32), (1, 256), (16, 32), (16, 256)]
