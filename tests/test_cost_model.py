"""The one cost model (mindspeed_asp.cost_model): the fit rule, the cost file, the config section, and
`asp fit-cost --timings`, which fits measured timings with the same rule and no engine."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mindspeed_asp.cli import main
from mindspeed_asp.config import CostSection
from mindspeed_asp.cost_model import (cost_from_section, fit_cost_model, fit_timings_file, load_cost_json,
                                      load_step_timings, save_cost_json)
from mindspeed_asp.errors import InputError
from mindspeed_asp.core.problem import CostModel

TRUE = CostModel(a=4e-3, b=3e-5, c=2e-7, p=5e-6)


def _sweep(cost: CostModel, noise: float = 0.0, seed: int = 0):
    """Steps as `asp fit-cost` measures them: one prefill step, then decode steps, per (batch, context)."""
    rng = np.random.default_rng(seed)
    rows = []
    for batch in (1, 4, 16, 64):
        for ctx in (64, 256, 1024):
            rows.append((batch, batch * ctx, batch * ctx))
            rows.extend((batch, batch * (ctx + k), 0) for k in range(1, 9))
    act, kv, pf = (np.array(c, dtype=np.float64) for c in zip(*rows))
    y = cost.step_time(act, kv, pf) * (1.0 + noise * rng.standard_normal(len(act)))
    return act, kv, pf, y


def test_fit_recovers_exact_parameters():
    act, kv, pf, y = _sweep(TRUE)
    fit = fit_cost_model(act, kv, y, pf)
    for k in "abcp":
        assert getattr(fit.cost, k) == pytest.approx(getattr(TRUE, k), rel=1e-6)
    assert fit.r2 == pytest.approx(1.0) and fit.max_abs_s < 1e-12 and fit.samples == len(y)


def test_noisy_fit_is_close_and_never_negative():
    act, kv, pf, y = _sweep(TRUE, noise=0.02, seed=1)
    fit = fit_cost_model(act, kv, y, pf)
    assert fit.cost.a == pytest.approx(4e-3, rel=0.1) and fit.cost.c == pytest.approx(2e-7, rel=0.1)
    # a cost that does not depend on batch size: plain least squares goes negative on b, the fit clamps it
    flat = CostModel(a=4e-3, b=0.0, c=2e-7, p=5e-6)
    act, kv, pf, y = _sweep(flat, noise=0.05, seed=3)
    assert min(np.linalg.lstsq(np.stack([np.ones_like(y), act, kv, pf], 1), y, rcond=None)[0]) < 0
    f2 = fit_cost_model(act, kv, y, pf)
    assert min(getattr(f2.cost, k) for k in "abcp") >= 0.0 and f2.cost.a == pytest.approx(4e-3, rel=0.1)


def test_prefill_fitted_only_when_it_varies():
    act, kv, _, y = _sweep(CostModel(a=4e-3, b=3e-5, c=2e-7, p=0.0))
    fit = fit_cost_model(act, kv, y)  # no prefill column: three parameters
    assert fit.cost.p == 0.0 and fit.cost.a == pytest.approx(4e-3, rel=1e-6)
    with pytest.raises(ValueError, match="at least 3"):
        fit_cost_model(act[:2], kv[:2], y[:2])
    with pytest.raises(ValueError, match="finite and > 0"):
        fit_cost_model(act, kv, -y)


def test_cost_file_round_trip_and_document(tmp_path):
    act, kv, pf, y = _sweep(TRUE)
    fit = fit_cost_model(act, kv, y, pf, source="unit")
    path = save_cost_json(fit, tmp_path / "cost.json")
    doc = json.loads(path.read_text())
    assert doc["fit"]["method"] == "nnls" and doc["residuals"]["n"] == fit.samples
    cm = load_cost_json(path)
    assert (cm.a, cm.b, cm.c, cm.p, cm.source) == (fit.cost.a, fit.cost.b, fit.cost.c, fit.cost.p, "unit")


@pytest.mark.parametrize("body, match", [
    ({"a": 1e-3, "b": "x", "c": 0, "p": 0}, r"cost.json key 'b'"),
    ({"a": 1e-3, "b": -1, "c": 0}, r"key 'b'.*>= 0"),
    ({"a": 1e-3, "c": 0}, r"key 'b'.*missing"),
    ([1, 2], "JSON object"),
])
def test_bad_cost_files_name_file_and_key(tmp_path, body, match):
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(body))
    with pytest.raises(InputError, match=match):
        load_cost_json(path)


def test_broken_or_missing_cost_file(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{\n not json")
    with pytest.raises(InputError, match=r"broken.json:2: invalid JSON"):
        load_cost_json(broken)
    with pytest.raises(InputError, match=r"nope.json key 'asp.cost.file': cost file not found"):
        cost_from_section(CostSection(file=str(tmp_path / "nope.json")))


def test_section_file_wins_over_inline_numbers(tmp_path):
    inline = cost_from_section(CostSection(a=1e-3, b=0.0, c=0.0, p=0.0), origin="cfg.yaml asp.cost")
    assert (inline.a, inline.source) == (1e-3, "cfg.yaml asp.cost")
    path = tmp_path / "cost.json"
    path.write_text(json.dumps({"a": 2e-3, "b": 1e-5, "c": 1e-7}))
    assert cost_from_section(CostSection(a=1e-3, file=str(path))).a == 2e-3


def test_step_timings_name_file_line_and_column(tmp_path):
    bad = tmp_path / "steps.csv"
    bad.write_text("active,kv_tokens,step_time\n4,100,0.01\n4,abc,0.01\n")
    with pytest.raises(InputError, match=r"steps.csv:3.*kv_tokens"):
        load_step_timings(bad)
    js = tmp_path / "steps.jsonl"
    js.write_text('{"active": 1, "kv_tokens": 2, "step_time": 0.1}\n{"active": 1, "kv_tokens": 2}\n')
    with pytest.raises(InputError, match=r"steps.jsonl:2.*step_time"):
        load_step_timings(js)
    few = tmp_path / "few.jsonl"
    few.write_text('{"active": 1, "kv_tokens": 2, "step_time": 0.1}\n')
    with pytest.raises(InputError, match=r"few.jsonl: need at least 3"):
        fit_timings_file(few)


def test_a_sweep_that_cannot_determine_b_or_c_says_so(tmp_path, capsys):
    act, kv, pf, y = _sweep(TRUE)
    assert fit_cost_model(act, kv, y, pf).unidentified == ()  # a full sweep determines every coefficient
    ctx = np.linspace(100, 600, 6)
    one_batch = TRUE.a + TRUE.b * 4 + TRUE.c * ctx  # every step at active = 4
    fit = fit_cost_model(np.full(6, 4.0), ctx, one_batch)
    assert [w[0] for w in fit.unidentified] == ["b"] and "active = 4" in fit.unidentified[0]
    steps = np.array([1.0, 2, 4, 8])
    lock = fit_cost_model(steps, 100 * steps, TRUE.a + TRUE.b * steps + TRUE.c * 100 * steps)
    assert lock.unidentified and lock.unidentified[0].startswith("b, c: kv_tokens moves in step with active")
    timings = tmp_path / "one_batch.csv"
    timings.write_text("active,kv_tokens,step_time\n" + "".join(f"4,{k:g},{t:.17g}\n" for k, t in zip(ctx, one_batch)))
    out = tmp_path / "cost.json"
    assert main(["fit-cost", "--timings", str(timings), "-o", str(out)]) == 0
    assert "WARNING: not determined by these timings: b: every timing has active = 4" in capsys.readouterr().err
    assert json.loads(out.read_text())["unidentified"][0].startswith("b:")


def test_fit_cost_cli_fits_measured_timings(tmp_path, capsys):
    act, kv, pf, y = _sweep(TRUE, noise=0.01, seed=3)
    timings = tmp_path / "steps.csv"
    timings.write_text("active,kv_tokens,prefill_tokens,step_time\n" +
                       "".join(f"{a:g},{k:g},{p:g},{t:.17g}\n" for a, k, p, t in zip(act, kv, pf, y)))
    out = tmp_path / "cost.json"
    assert main(["fit-cost", "--timings", str(timings), "-o", str(out)]) == 0
    assert "R^2" in capsys.readouterr().out
    cm = load_cost_json(out)
    assert cm.a == pytest.approx(4e-3, rel=0.05) and cm.c == pytest.approx(2e-7, rel=0.05)
    # the same rule as the library call on the same numbers
    assert cm.b == fit_timings_file(timings).cost.b
