"""What a run tells its user (mindspeed_asp/utils/run_report.py): start-up lines, and instance deaths, re-dispatches,
regenerated and dropped groups in `asp train`'s report and `asp compare`'s table. Fast: summaries only."""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Dict

from mindspeed_asp.cli import main
from mindspeed_asp.commands.compare import compare_runs, compare_table
from mindspeed_asp.commands.train import format_summary
from mindspeed_asp.utils.run_report import StartupProgress, any_events, format_events, run_events

QUIET_RUN = {"mode": "asp", "steps": 8, "instances": 2, "instances_alive": 2, "redispatched": 0, "steals": 3,
             "queue/regenerated": 0, "queue/dropped_stale": 0, "events": {"instance_started": 2, "plan": 2},
             "throughput/e2e_tps": 100.0, "reward/final": 0.25}
HARD_RUN = dict(QUIET_RUN, instances_alive=1, redispatched=3, steals=5, **{"queue/regenerated": 2},
                events={"instance_started": 2, "instance_died": 1, "regenerate": 2})


def test_startup_lines_count_instances_and_say_when_each_is_ready() -> None:
    out, now = io.StringIO(), [100.0]
    p = StartupProgress(2, stream=out, clock=lambda: now[0])
    p.model_ready("runs/tiny_model")
    for j in range(2):
        p.instance_starting(j)
        now[0] += 40.0
        p.instance_ready(j, 39.5)
    p.instance_starting(1, attempt=1)
    p.all_ready()
    lines = out.getvalue().splitlines()
    assert lines == [
        "asp: [  0.0s] model ready: runs/tiny_model",
        "asp: [  0.0s] starting rollout instance 1/2",
        "asp: [ 40.0s] rollout instance 1/2 ready (started in 39.5s)",
        "asp: [ 40.0s] starting rollout instance 2/2",
        "asp: [ 80.0s] rollout instance 2/2 ready (started in 39.5s)",
        "asp: [ 80.0s] starting rollout instance 2/2 (retry)",
        "asp: [ 80.0s] all 2 rollout instances ready; trainer built, weights synced; training starts",
    ]
    quiet = io.StringIO()
    StartupProgress(2, enabled=False, stream=quiet).model_ready("x")  # --quiet
    assert quiet.getvalue() == ""


def test_event_counts_from_a_summary() -> None:
    assert run_events(HARD_RUN) == {"events/instance_deaths": 1, "events/redispatched": 3,
                                    "events/regenerated": 2, "events/dropped": 0, "events/steals": 5}
    assert any_events(HARD_RUN) and not any_events(QUIET_RUN)  # steals alone are ordinary
    # a MindSpeed-RL log's asp/ counters; deaths from the alive count when no event list is kept
    msrl = {"asp/queue/regenerated": 4, "instances": 2, "instances_alive": 2}
    assert run_events(msrl)["events/regenerated"] == 4 and run_events(msrl)["events/instance_deaths"] == 0
    assert run_events({})["events/redispatched"] is None


def test_train_report_says_what_happened() -> None:
    hard = format_summary(HARD_RUN, Path("runs/x"))
    line = next(x for x in hard.splitlines() if x.strip().startswith("events"))
    assert line.split(None, 1)[1] == ("deaths 1, re-dispatched 3, regenerated 2, dropped 0, steals 5, "
                                      "instances alive 1/2")
    quiet = format_summary(QUIET_RUN, Path("runs/x"))
    assert "deaths 0, re-dispatched 0, regenerated 0, dropped 0, steals 3, instances alive 2/2" in quiet
    assert format_events({}) == "deaths -, re-dispatched -, regenerated -, dropped -, steals -"


def _run_dir(tmp_path: Path, name: str, summary: Dict[str, Any]) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "summary.json").write_text(json.dumps(summary))
    return d


def test_compare_shows_the_event_columns_only_when_a_run_had_events(tmp_path: Path, capsys: Any) -> None:
    quiet_a, quiet_b = _run_dir(tmp_path, "a", QUIET_RUN), _run_dir(tmp_path, "b", QUIET_RUN)
    table, _ = compare_runs([quiet_a, quiet_b])
    assert "deaths" not in table and "steals" not in table  # the ordinary table stays narrow

    hard = _run_dir(tmp_path, "hard", HARD_RUN)
    assert main(["compare", str(quiet_a), str(hard)]) == 0
    printed = capsys.readouterr().out.splitlines()[0]
    titles = ("deaths", "re-dispatched", "regenerated", "dropped", "steals")
    assert all(t in printed.split() for t in titles)
    _, runs = compare_runs([quiet_a, hard])
    header, rows = compare_table(runs)
    assert header[-len(titles):] == list(titles)  # one group at the end of the table
    assert rows[1][-5:] == ["1", "3", "2", "0", "5"] and rows[0][-5:] == ["0", "0", "0", "0", "3"]


def test_compare_leaves_the_loaded_summaries_as_they_were(tmp_path: Path) -> None:
    runs = [dict(HARD_RUN, name="hard"), dict(QUIET_RUN, name="quiet")]
    header, rows = compare_table(runs)
    assert "deaths" in header and rows[0][header.index("deaths")] == "1"
    assert "events/instance_deaths" not in runs[0]  # `--json` writes what was read, not the derived counts
