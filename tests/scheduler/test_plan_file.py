"""DispatchPlan file: round trip in both formats with provenance, accessors, refusals."""
from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from mindspeed_asp import __version__
from mindspeed_asp.errors import InputError, PlanMismatchError
from mindspeed_asp.scheduler.build import build_plan, iteration_starts
from mindspeed_asp.scheduler.plan_file import META_KEY, SCHEMA_VERSION, DispatchPlan, load_plan
from mindspeed_asp.core.problem import CostModel

from factories import length_estimate, planning_problem, prompt_set


def dataset(G: int = 50, n: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    prompts = prompt_set(rng.integers(10, 200, G), n, prefix="id-", origin="train.jsonl")
    med = rng.lognormal(5, 0.8, G)
    est = length_estimate(med, med * 1.8, sigma=0.4, estimator="history", params={"recency_decay": 0.5})
    return prompts, est


@pytest.fixture(scope="module")
def built():
    prompts, est = dataset()
    result = build_plan(prompts, est, instances=3, slots=16, minibatch=4, max_new_tokens=2048, planner="asp",
                        groups_per_iteration=20, cost=CostModel(a=0.01, b=1e-4, c=1e-7, source="test"),
                        rho=0.5, seed=7, provenance={"history": "hist.parquet"})
    return prompts, est, result


def test_iteration_windows():
    assert iteration_starts(50, 20) == [0, 20, 40, 50]
    assert iteration_starts(7, None) == [0, 7]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_round_trip_with_provenance(tmp_path, built, suffix):
    prompts, est, result = built
    plan = result.plan
    path = plan.save(tmp_path / f"plan{suffix}")
    back = DispatchPlan.load(path, prompts)
    for k, v in plan.cols.items():
        assert (np.asarray(back.cols[k]) == np.asarray(v)).all(), k
    h = back.header
    assert h["schema_version"] == SCHEMA_VERSION
    assert h["dataset_fingerprint"] == prompts.fingerprint()
    assert h["estimator"] == "history" and h["estimator_params"]["recency_decay"] == 0.5
    assert h["planner"] == "asp" and len(h["planner_params"]) == 3 and "theta" in h["planner_params"][0]
    assert h["package_version"] == __version__ and h["created_at"].endswith("+00:00")
    assert h["cost"]["source"] == "test" and h["rho"] == 0.5 and h["seed"] == 7
    assert h["sources"] == {"history": "hist.parquet"}
    assert h["iteration_starts"] == [0, 20, 40, 50] and h["instances"] == 3 and h["n"] == 4
    assert len(h["summary"]) == 3 and h["summary"][0]["makespan"] >= h["summary"][0]["bound"] * 0.999


def test_accessors_match_the_built_assignments(built):
    prompts, est, result = built
    plan = result.plan
    assert plan.iterations() == [0, 1, 2]
    seen = []
    for it in plan.iterations():
        a = plan.assignment(it)
        rows = plan.iteration_rows(it)
        a.validate(len(rows))
        for j in range(plan.instances):
            queue = plan.instance_queue(it, j)
            assert queue == [str(prompts.prompt_ids[rows[g]]) for g in a.orders[j]]
            assert (plan.instance_rows(it, j) == rows[a.orders[j]]).all()
            seen += queue
        for g, row in enumerate(rows):
            pid = str(prompts.prompt_ids[row])
            assert plan.minibatch_of(pid) == a.minibatch[g] >= 0
            assert plan.iteration_of(pid) == it
        sub = plan.iteration_prompts(it, prompts)
        assert list(sub.prompt_ids) == list(prompts.prompt_ids[rows])
    assert sorted(seen) == sorted(map(str, prompts.prompt_ids))
    first = str(prompts.prompt_ids[0])
    assert plan.predicted(first)["median"] == pytest.approx(est.median[0])
    with pytest.raises(KeyError, match="not in plan"):
        plan.minibatch_of("nope")
    with pytest.raises(IndexError):
        plan.instance_queue(3, 0)


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_fingerprint_mismatch_is_refused(tmp_path, built, suffix):
    prompts, _, result = built
    path = result.plan.save(tmp_path / f"plan{suffix}")
    other = prompt_set(prompts.prompt_lens + 1, prompts.n, ids=prompts.prompt_ids, origin="other.jsonl")
    with pytest.raises(PlanMismatchError) as exc:
        load_plan(path, other)
    msg = str(exc.value)
    assert prompts.fingerprint() in msg and other.fingerprint() in msg
    assert "other.jsonl" in msg and "rebuild" in msg
    reordered = prompts.subset(np.arange(len(prompts))[::-1])
    with pytest.raises(PlanMismatchError):
        load_plan(path, reordered)


def test_unknown_schema_version_is_refused(tmp_path, built):
    _, _, result = built
    path = result.plan.save(tmp_path / "plan.jsonl")
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    head["schema_version"] = 99
    path.write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")
    with pytest.raises(PlanMismatchError, match="schema version 99"):
        load_plan(path)

    ppath = result.plan.save(tmp_path / "plan.parquet")
    table = pq.read_table(ppath)
    meta = json.loads(table.schema.metadata[META_KEY])
    meta["schema_version"] = 2
    pq.write_table(table.replace_schema_metadata({META_KEY: json.dumps(meta)}), ppath)
    with pytest.raises(PlanMismatchError, match="schema version 2"):
        load_plan(ppath)


def test_malformed_files_name_file_and_line(tmp_path, built):
    _, _, result = built
    path = result.plan.save(tmp_path / "plan.jsonl")
    lines = path.read_text().splitlines()
    lines[3] = lines[3][:-5]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"plan\.jsonl:4"):
        load_plan(path)

    lines = result.plan.save(tmp_path / "plan2.jsonl").read_text().splitlines()
    row = json.loads(lines[2])
    row["instance"] = "zero"
    lines[2] = json.dumps(row)
    (tmp_path / "plan2.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"plan2\.jsonl:3.*instance"):
        load_plan(tmp_path / "plan2.jsonl")

    lines = result.plan.save(tmp_path / "plan3.jsonl").read_text().splitlines()
    (tmp_path / "plan3.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # a group missing
    with pytest.raises(InputError, match="exactly once"):
        load_plan(tmp_path / "plan3.jsonl")

    pq.write_table(pq.read_table(result.plan.save(tmp_path / "p.parquet")).replace_schema_metadata({}),
                   tmp_path / "bare.parquet")
    with pytest.raises(InputError, match="not a mindspeed-asp dispatch plan"):
        load_plan(tmp_path / "bare.parquet")
    with pytest.raises(InputError, match="not found"):
        load_plan(tmp_path / "missing.parquet")
    with pytest.raises(InputError, match=r"\.parquet or \.jsonl"):
        result.plan.save(tmp_path / "plan.csv")


def test_baseline_plan_is_untagged_and_stock_is_contiguous(tmp_path):
    prompts, est = dataset(G=12)
    plan = build_plan(prompts, est, instances=3, slots=8, minibatch=2, max_new_tokens=1024,
                      planner="stock").plan
    back = load_plan(plan.save(tmp_path / "stock.parquet"), prompts)
    assert back.instance_queue(0, 0) == [f"id-{i}" for i in range(4)]
    assert back.instance_queue(0, 2) == [f"id-{i}" for i in range(8, 12)]
    assert back.minibatch_of("id-5") == -1


def test_estimate_lengths_measures_prediction_error_and_windows_reuse_the_search():
    from mindspeed_asp.scheduler.build import estimate_lengths, prediction_log_error
    from mindspeed_asp.scheduler.history import LengthHistory

    rng = np.random.default_rng(0)
    G, n = 64, 4
    prompts = prompt_set(np.full(G, 20), n, prefix="h")
    base = rng.lognormal(5, 0.8, G)
    hist = LengthHistory()
    moved = base * np.exp(rng.normal(0, 0.4, G))  # epoch 1 medians moved by ~0.4 in log
    hist.add_epoch(prompts.prompt_ids, 0, np.rint(np.repeat(base[:, None], n, 1)).astype(int))
    hist.add_epoch(prompts.prompt_ids, 1, np.rint(np.repeat(moved[:, None], n, 1)).astype(int))
    tau = prediction_log_error(hist, prompts)
    assert 0.3 < tau < 0.5
    est = estimate_lengths(prompts, hist, 4096)
    assert est.params["pred_log_error"] == pytest.approx(tau)
    res = build_plan(prompts, est, instances=2, slots=8, minibatch=2, max_new_tokens=4096,
                     groups_per_iteration=8, reselect_every=4)
    params = res.plan.header["planner_params"]
    assert "reused_from" not in params[0] and params[1]["reused_from"] == 0.0 and params[5]["reused_from"] == 4.0
    assert params[1]["theta"] == params[0]["theta"] and params[1]["order_rule"] == params[0]["order_rule"]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_a_shared_iteration_survives_the_file(tmp_path, suffix):
    """An iteration the selection left unpinned (one queue in plan order) is read back as one: the runtime's
    dispatcher and the simulator take its queue from the file, position by position."""
    from mindspeed_asp.scheduler import baselines
    from mindspeed_asp.core.problem import Assignment

    prompts, est = dataset(G=12)
    problems = [planning_problem(prompts.subset(np.arange(lo, lo + 6)), est.subset(np.arange(lo, lo + 6)),
                                 instances=2, slots=8, minibatch=3, max_new_tokens=2048,
                                 cost=CostModel(a=0.01, b=1e-4, c=1e-7)) for lo in (0, 6)]
    shared = baselines.plan_shared_desc(problems[0], np.random.default_rng(0))
    pinned = baselines.plan_lpt(problems[1], np.random.default_rng(0))
    plan = DispatchPlan.from_assignments(prompts, [0, 6, 12], [shared, pinned], est.median, est.group_max, {})
    back = DispatchPlan.load(plan.save(tmp_path / f"plan{suffix}"), prompts)
    assert back.is_shared(0) and not back.is_shared(1)
    assert back.assignment(0).shared and not back.assignment(1).shared
    queue = [str(prompts.prompt_ids[g]) for g in shared.shared_order()]
    assert back.shared_queue(0) == queue
    assert np.array_equal(back.assignment(0).shared_order(), shared.shared_order())
    assert queue[0] == str(prompts.prompt_ids[int(np.argmax(est.median[:6]))])  # longest predicted first
    bad = dict(back.header, shared_iterations=[5])
    with pytest.raises(InputError, match="shared_iterations"):
        DispatchPlan(bad, back.cols, path="p")
    assert isinstance(Assignment(orders=[], minibatch=np.zeros(0), planner="x").shared_order(), np.ndarray)


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_isolated_groups_survive_the_file(tmp_path, suffix):
    """The groups a plan isolated (their instance steals nothing while they run) are read back per iteration,
    as rows, prompt ids and in the Assignment; a bad list is refused naming the key."""
    from mindspeed_asp.scheduler import baselines

    prompts, est = dataset(G=12)
    problems = [planning_problem(prompts.subset(np.arange(lo, lo + 6)), est.subset(np.arange(lo, lo + 6)),
                                 instances=2, slots=8, minibatch=3, max_new_tokens=2048,
                                 cost=CostModel(a=0.01, b=1e-4, c=1e-7)) for lo in (0, 6)]
    first = baselines.plan_lpt(problems[0], np.random.default_rng(0))
    second = baselines.plan_lpt(problems[1], np.random.default_rng(0))
    first.isolated, second.isolated = np.array([4], dtype=np.int64), np.array([0, 5], dtype=np.int64)
    plan = DispatchPlan.from_assignments(prompts, [0, 6, 12], [first, second], est.median, est.group_max, {})
    back = DispatchPlan.load(plan.save(tmp_path / f"plan{suffix}"), prompts)
    assert back.isolated_rows(0).tolist() == [4] and back.isolated_rows(1).tolist() == [6, 11]
    assert back.isolated_ids(1) == ["id-6", "id-11"]
    assert back.assignment(0).isolated.tolist() == [4] and back.assignment(1).isolated.tolist() == [0, 5]
    for bad_rows in ([12], [-1], "4"):
        with pytest.raises(InputError, match="isolated_rows"):
            DispatchPlan(dict(back.header, isolated_rows=bad_rows), back.cols, path="p")
    old = {k: v for k, v in back.header.items() if k != "isolated_rows"}  # a plan written before isolation
    assert DispatchPlan(old, back.cols, path="p").isolated_rows(0).tolist() == []


def _edit_jsonl(path, edit_header=None, edit_row=None, row_index=0):
    """Rewrite a saved JSON Lines plan with its header or one row changed (as a hand edit would)."""
    lines = path.read_text().splitlines()
    head, rows = json.loads(lines[0]), [json.loads(x) for x in lines[1:]]
    if edit_header:
        edit_header(head)
    if edit_row:
        edit_row(rows[row_index])
    path.write_text("\n".join(json.dumps(x) for x in [head] + rows) + "\n")
    return path


@pytest.mark.parametrize("column,value,match", [
    ("minibatch", -2, "minibatch tag -2"),
    ("pred_median", float("nan"), "not a finite number"),
    ("pred_group_max", float("inf"), "not a finite number"),
    ("pred_group_max", -1.0, "not a finite number >= 0"),
    ("position", -1, "position -1 is out of range"),
    ("row", 10**20, "out of range"),  # beyond int64: refused before numpy overflows on it
])
def test_a_bad_column_value_is_refused_naming_column_and_line(tmp_path, built, column, value, match):
    prompts, _, result = built
    path = _edit_jsonl(result.plan.save(tmp_path / "plan.jsonl"), edit_row=lambda r: r.update({column: value}),
                       row_index=4)
    with pytest.raises(InputError, match=match) as exc:
        load_plan(path, prompts)
    assert exc.value.key == column and exc.value.line == 6 and f"{path}:6" in str(exc.value)


def test_a_bad_parquet_column_value_names_the_row(tmp_path, built):
    import pyarrow as pa

    prompts, _, result = built
    path = result.plan.save(tmp_path / "plan.parquet")
    table = pq.read_table(path)
    med = table.column("pred_median").to_numpy().copy()
    med[7] = np.nan
    table = table.set_column(table.column_names.index("pred_median"), "pred_median", pa.array(med))
    pq.write_table(table, path)
    with pytest.raises(InputError, match=r"row 8: prediction nan") as exc:
        load_plan(path, prompts)
    assert exc.value.key == "pred_median"


def test_the_plan_fingerprint_covers_its_settings(tmp_path, built):
    """The header records what the plan depends on and a hash of it; an edited setting is refused on load."""
    from mindspeed_asp.scheduler.plan_file import SETTINGS, plan_fingerprint

    prompts, _, result = built
    h = result.plan.header
    assert all(k in h for k in SETTINGS) and h["plan_fingerprint"] == plan_fingerprint(h)
    for suffix in (".jsonl", ".parquet"):
        assert load_plan(result.plan.save(tmp_path / f"plan{suffix}"), prompts).header["plan_fingerprint"] == \
            h["plan_fingerprint"]
    other = dict(h, minibatch_groups=8)
    assert plan_fingerprint(other) != h["plan_fingerprint"]
    edited = _edit_jsonl(result.plan.save(tmp_path / "edited.jsonl"),
                         edit_header=lambda head: head.update(minibatch_groups=8))
    with pytest.raises(PlanMismatchError, match="edited after `asp plan` wrote it"):
        load_plan(edited, prompts)


def test_a_plan_written_before_the_fingerprint_still_loads_and_is_checked(tmp_path, built):
    """Plans without plan_fingerprint (older files) load: schema 1 has always recorded the settings, so
    check_settings still compares them; only a hand edit of the header would go unnoticed in such a file."""
    prompts, _, result = built
    old = _edit_jsonl(result.plan.save(tmp_path / "old.jsonl"), edit_header=lambda head: head.pop("plan_fingerprint"))
    plan = load_plan(old, prompts)
    want = {k: plan.header[k] for k in ("n", "instances", "slots", "minibatch_groups", "max_lag", "planner")}
    assert plan.check_settings(want) == []
    with pytest.raises(PlanMismatchError, match=r"minibatch_groups=4, but the run has asp.minibatch_groups=8"):
        plan.check_settings(dict(want, minibatch_groups=8), {"minibatch_groups": "asp.minibatch_groups"})
    bare = _edit_jsonl(result.plan.save(tmp_path / "bare.jsonl"),
                       edit_header=lambda head: [head.pop(k) for k in ("plan_fingerprint", "slots", "max_lag")])
    assert load_plan(bare, prompts).check_settings(dict(want, slots=99, max_lag=7)) == ["slots", "max_lag"]
    # windows compare as cut (both sides capped at the plan's groups): 20 groups per iteration is not 10
    assert plan.check_settings({"groups_per_iteration": 20}) == []
    with pytest.raises(PlanMismatchError, match="groups_per_iteration"):
        plan.check_settings({"groups_per_iteration": 10})
