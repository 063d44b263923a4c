"""docs/benchmarks.md is generated from benchmarks/results/*.json: a pasted or stale figure fails here.

Runs no benchmark: it only re-renders the page from the committed results files.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
sys.path.insert(0, str(BENCH))

import _results  # noqa: E402
import render_docs  # noqa: E402


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / "render_docs.py"), "--check", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=120)


def test_benchmarks_page_matches_the_results_files():
    r = check()
    assert r.returncode == 0, r.stderr


def test_a_hand_edited_figure_fails_the_check(tmp_path):
    text = render_docs.DOC.read_text()
    begin = text.index("<!-- BEGIN generated: lengths -->")
    end = text.index("<!-- END generated: lengths -->")
    block = text[begin:end]
    assert "| history |" in block
    edited = tmp_path / "benchmarks.md"
    edited.write_text(text[:begin] + block.replace("| history |", "| history (pasted) |", 1) + text[end:])
    r = check("--doc", str(edited))
    assert r.returncode == 1 and "out of date" in r.stderr


def test_missing_results_file_is_named_unless_the_block_is_pending(tmp_path):
    doc = "<!-- BEGIN generated: lengths -->\n<!-- END generated: lengths -->\n"
    with pytest.raises(render_docs.RenderError, match=r"benchmarks/results/lengths\.json"):
        render_docs.render(doc, tmp_path)
    pending = doc.replace("lengths -->\n", "lengths (pending) -->\n", 1)
    assert "Not measured yet: `benchmarks/results/lengths.json`" in render_docs.render(pending, tmp_path)


def test_unstamped_results_file_is_refused(tmp_path):
    (tmp_path / "lengths.json").write_text(json.dumps({"alpaca": {}}))
    doc = "<!-- BEGIN generated: lengths -->\n<!-- END generated: lengths -->\n"
    with pytest.raises(render_docs.RenderError, match="lacks command, measured_at, commit"):
        render_docs.render(doc, tmp_path)


def test_unknown_block_and_unpaired_marker_are_errors(tmp_path):
    with pytest.raises(render_docs.RenderError, match="no renderer registered for block 'nosuch'"):
        render_docs.render("<!-- BEGIN generated: nosuch -->\n<!-- END generated: nosuch -->\n", tmp_path)
    with pytest.raises(render_docs.RenderError, match="without a matching partner"):
        render_docs.render("<!-- BEGIN generated: lengths -->\ntext\n", tmp_path)


def test_rendered_block_prints_command_date_and_commit(tmp_path):
    stamped = _results.stamp({"summary": {"steps": 2, "lr": 0.003, "reward_first": 0.1, "reward_last": 0.5,
                                          "len_first": 40.0, "len_last": 20.0, "seconds": 9.0, "window": 1},
                              "rows": [{"stop_share": 0.2}, {"stop_share": 0.9}]},
                             str(BENCH / "bench_demo_learning.py"), ["--steps", "2"])
    (tmp_path / "demo_learning.json").write_text(json.dumps(stamped))
    out = render_docs.render("<!-- BEGIN generated: demo_learning -->\n<!-- END generated: demo_learning -->\n",
                             tmp_path)
    assert "python benchmarks/bench_demo_learning.py --steps 2" in out
    assert f"Measured {stamped['measured_at']} at commit {stamped['commit']}" in out
    assert "| mean reward | 0.100 | 0.500 |" in out


def test_commands_never_record_paths_outside_the_repository(tmp_path):
    outside = tmp_path / "data" / "alpaca-train-10k-length.json"
    assert (_results.public_arg(f"alpaca:{outside}?target=t0.5")
            == "alpaca:PATH/alpaca-train-10k-length.json?target=t0.5")
    assert _results.public_arg("benchmarks/results/x.json") == "benchmarks/results/x.json"
    assert _results.command_line(str(BENCH / "bench_lengths.py"), ["--alpaca", str(outside)]) == \
        "python benchmarks/bench_lengths.py --alpaca PATH/alpaca-train-10k-length.json"
    for path in (BENCH / "results").rglob("*.json"):
        command = json.loads(path.read_text()).get("command", "")
        assert not any(arg.startswith("/") or "../" in arg for arg in command.split()), (path, command)


def test_e2e_basis_names_the_devices_or_the_old_denominator():
    import doc_tables
    from mindspeed_asp.core.metrics import split_devices

    new = [{"devices": split_devices(2, 1, 1).to_dict()}] * 2
    assert doc_tables.e2e_basis(new).endswith("3 (2 rollout + 1 trainer, split)")
    assert "rollout instances only" in doc_tables.e2e_basis([{"throughput/e2e_tps": 1.0}])
    assert "rollout instances only" in doc_tables.e2e_basis([])  # results that kept no per-run records
