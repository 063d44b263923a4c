"""`asp fit-cost`: the least-squares fit on known data, the cost-file reader, and one real engine sweep."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from mindspeed_asp.cli import main
from mindspeed_asp.errors import InputError
from mindspeed_asp.runtime.cost_fit import StepSample, fit_step_costs, read_cost_json


def _synthetic(a, b, c, p, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for batch in (1, 4, 16, 64):
        for ctx in (64, 256, 1024):
            out.append(StepSample(batch, batch * ctx, batch * ctx, a + b * batch + c * batch * ctx + p * batch * ctx))
            for k in range(1, 9):
                kv = batch * (ctx + k)
                out.append(StepSample(batch, kv, 0, a + b * batch + c * kv))
    for s in out:
        s.seconds *= 1.0 + noise * rng.standard_normal()
    return out


def test_fit_recovers_known_parameters():
    fit = fit_step_costs(_synthetic(4e-3, 3e-5, 2e-7, 5e-6))
    assert fit["method"] == "lstsq"
    for k, v in dict(a=4e-3, b=3e-5, c=2e-7, p=5e-6).items():
        assert fit[k] == pytest.approx(v, rel=1e-6)
    assert fit["residuals"]["r2"] == pytest.approx(1.0) and fit["residuals"]["max_abs_s"] < 1e-12


def test_noisy_fit_is_close_and_never_negative():
    fit = fit_step_costs(_synthetic(4e-3, 3e-5, 2e-7, 5e-6, noise=0.02, seed=1))
    assert fit["a"] == pytest.approx(4e-3, rel=0.1) and fit["c"] == pytest.approx(2e-7, rel=0.1)
    # a cost that does not depend on batch size: lstsq may go slightly negative on b, nnls clamps it
    flat = fit_step_costs(_synthetic(4e-3, 0.0, 2e-7, 5e-6, noise=0.05, seed=2))
    assert min(flat[k] for k in "abcp") >= 0.0
    with pytest.raises(ValueError, match="at least 4"):
        fit_step_costs(_synthetic(1, 1, 1, 1)[:3])


def test_read_cost_json(tmp_path):
    good = tmp_path / "cost.json"
    good.write_text(json.dumps({"a": 1e-3, "b": 2e-5, "c": 3e-7, "p": 4e-6, "source": "test"}))
    cm = read_cost_json(str(good))
    assert (cm.a, cm.b, cm.c, cm.p, cm.source) == (1e-3, 2e-5, 3e-7, 4e-6, "test")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"a": 1e-3, "b": "x", "c": 0, "p": 0}))
    with pytest.raises(InputError, match="key 'b'"):
        read_cost_json(str(bad))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(InputError, match="broken.json"):
        read_cost_json(str(broken))


def test_cli_rejects_bad_flags(tmp_path, capsys):
    assert main(["fit-cost", "--slots", "1,x", "-o", str(tmp_path / "c.json")]) == 2
    assert "--slots" in capsys.readouterr().err
    assert main(["fit-cost", "--model", str(tmp_path), "-o", str(tmp_path / "c.json")]) == 2
    assert "config.json" in capsys.readouterr().err
    assert main(["fit-cost", "-o", str(tmp_path / "missing" / "c.json")]) == 2
    assert "output directory" in capsys.readouterr().err


@pytest.mark.slow
def test_fit_cost_on_real_engine(tmp_path):
    pytest.importorskip("vllm")
    from mindspeed_asp.runtime.tiny_model import ensure_tiny_model

    model = ensure_tiny_model(str(tmp_path / "tiny"))
    out = tmp_path / "cost.json"
    # a subprocess, as a user runs it: the engine and its thread settings stay out of the test process
    proc = subprocess.run([sys.executable, "-m", "mindspeed_asp", "fit-cost", "--model", model, "--slots", "1,16",
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
    cm = read_cost_json(str(out))
    assert cm.a == doc["a"] and cm.c == doc["c"]
    prefill = [s for s in doc["samples"] if s["prefill_tokens"] > 0]
    assert sorted((s["batch"], s["context"]) for s in prefill) == [(1, 32), (1, 256), (16, 32), (16, 256)]
