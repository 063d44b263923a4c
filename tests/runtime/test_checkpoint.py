"""Checkpoint round trips without vLLM or Ray: dispatcher, lag policy, sample queue, recorder, length history,
RNG, the files on disk, the config a resume accepts, the run directory's refusal, the stop signals and
`asp compare`'s mark of an interrupted run. The end-to-end kill-and-resume is tests/runtime/test_resume.py."""
from __future__ import annotations

import json
import random
import signal

import numpy as np
import pytest

from mindspeed_asp.errors import ConfigError, InputError, OutputError
from mindspeed_asp.core.policy import LagPolicy
from mindspeed_asp.runtime import checkpoint as ck
from mindspeed_asp.runtime.dispatcher import Dispatcher, Ticket
from mindspeed_asp.runtime.run_recorder import GroupSpan, RunRecorder, read_steps
from mindspeed_asp.runtime.sample_queue import SampleQueue
from mindspeed_asp.runtime.stop_signals import RunAborted, RunInterrupted, StopSignals
from mindspeed_asp.runtime.requests import GroupResult, RequestId, SampleResult


def through_json(obj):
    """What a checkpoint does to a state: encode, JSON text, decode."""
    return ck.decode(json.loads(json.dumps(ck.encode(obj))))


def result(gid: int, attempt: int = 0, version: int = 0, lengths=(3, 5)) -> GroupResult:
    samples = [SampleResult(token_ids=list(range(2, 2 + n)), logprobs=[-0.5] * n, min_version=version,
                            max_version=version, finish_reason="stop", token_versions=[version] * n)
               for n in lengths]
    return GroupResult(group_id=RequestId(gid, attempt), prompt_id=f"p{gid}", instance=0, samples=samples,
                       prompt_token_ids=[2, 3], t_enqueued=1.0, t_started=2.0, t_finished=3.0, minibatch=gid % 2)


# --------------------------------------------------------------------------------------------- dispatcher
def plan_dispatcher(lag: LagPolicy) -> Dispatcher:
    d = Dispatcher("plan", 2, capacity=2, clock=lambda: 7.0, lag=lag)
    d.load_window([Ticket(g, float(10 + g)) for g in range(8)], plan_queues=[[0, 1, 2, 3], [4, 5, 6, 7]])
    return d


def test_dispatcher_and_policy_round_trip_then_in_flight_groups_come_back_first():
    lag = LagPolicy(max_lag=1, minibatch_groups=2)
    d = plan_dispatcher(lag)
    picks = d.fill(0)
    assert len(picks) == 4  # (0 + 1 + 1) * 2 admitted
    d.on_finished(0, 0)
    lag.on_finished(0)
    in_flight = sorted(g for q in d.in_flight for g in q)
    lag2 = LagPolicy(max_lag=1, minibatch_groups=2)
    lag2.load_state_dict(through_json(lag.state_dict()))
    d2 = Dispatcher("plan", 2, capacity=2, clock=lambda: 7.0, lag=lag2)
    d2.load_state_dict(through_json(d.state_dict()))
    assert d2.state_dict() == d.state_dict() and lag2.state_dict() == lag.state_dict()

    back = d2.abandon_in_flight()
    assert sorted(back) == in_flight and d2.in_flight_count() == 0
    assert lag2.accepted == lag.accepted - len(in_flight) and lag2.running == 0
    assert d2.done == {0} and d2.queued() == d.queued() + len(in_flight)
    again = d2.fill(0)
    assert sorted(t.gid for _, t in again[:len(in_flight)]) == in_flight  # regenerated before new work
    assert all(t.attempt == 1 for _, t in again[:len(in_flight)])


def test_dispatcher_refuses_a_checkpoint_of_another_shape():
    d = Dispatcher("plan", 2)
    with pytest.raises(ValueError, match="least_loaded over 2"):
        d.load_state_dict(Dispatcher("least_loaded", 2).state_dict())
    with pytest.raises(ValueError, match="max_lag=2"):
        LagPolicy(1, 2).load_state_dict(LagPolicy(2, 2).state_dict())


def test_least_loaded_in_flight_groups_go_to_the_front_of_the_fifo():
    lag = LagPolicy(max_lag=0, minibatch_groups=2)
    d = Dispatcher("least_loaded", 2, capacity=1, lag=lag)
    d.load_window([Ticket(g) for g in range(4)])
    assert [t.gid for _, t in d.fill(0)] == [0, 1]
    assert d.abandon_in_flight() == [0, 1]
    assert [t.gid for t in d.fifo] == [0, 1, 2, 3] and lag.accepted == 0


# --------------------------------------------------------------------------------------------- sample queue
def test_sample_queue_round_trip_keeps_waiting_groups_and_trained_ids():
    lag = LagPolicy(max_lag=1, minibatch_groups=2)
    lag.on_dispatched(0, 4)
    q = SampleQueue(lag)
    for g in range(3):
        q.put(result(g), version=0)
    first = q.next_minibatch(0, prefer="plan_tag")
    assert len(first) == 2
    lag2 = LagPolicy(max_lag=1, minibatch_groups=2)
    lag2.load_state_dict(through_json(lag.state_dict()))
    q2 = SampleQueue(lag2)
    q2.load_state_dict(through_json(q.state_dict()))
    assert q2.counters() == q.counters() and q2.occupancy() == 1
    assert q2.was_trained(first[0].group_id) and q2.log_rows[0].group_ids == q.log_rows[0].group_ids
    assert q2.put(result(first[0].group_id.gid), version=0) == 0  # a trained group is refused after a restart
    q.put(result(3), version=0)
    q2.put(result(3), version=0)
    a, b = q.next_minibatch(1, prefer="plan_tag"), q2.next_minibatch(1, prefer="plan_tag")
    assert [g.group_id for g in a] == [g.group_id for g in b]
    assert b[0].samples[0].token_ids == a[0].samples[0].token_ids and lag2.state_dict() == lag.state_dict()


# --------------------------------------------------------------------------------------------- recorder
def test_recorder_continues_metrics_and_clock(tmp_path):
    now = [100.0]
    rec = RunRecorder(tmp_path, mode="asp", instances=2, slots=8, minibatch_groups=2, max_lag=1,
                      clock=lambda: now[0])
    rec.group(GroupSpan(0, 0, 0.0, 0.5, 2.0, 4, 8, [3, 5], 0, 0, trained=True))
    for step in range(2):
        now[0] += 5
        rec.log_step({"step": step, "version": step + 1, "t_end": rec.now(), "reward/mean": 0.1}, [0, 1])
    rec.event("steal", gid=1)
    state = through_json(rec.state_dict())
    now[0] += 1
    rec.log_step({"step": 2, "version": 3, "t_end": rec.now()}, [0])  # after the checkpoint: lost in a crash
    rec.close()

    now[0] = 5000.0  # a new process, much later
    rec2 = RunRecorder(tmp_path, mode="asp", instances=2, slots=8, minibatch_groups=2, max_lag=1,
                       clock=lambda: now[0])
    rec2.load_state_dict(state)
    assert [r["step"] for r in read_steps(tmp_path)] == [0, 1]
    assert rec2.now() == pytest.approx(10.0)
    now[0] += 90  # start-up of the resumed run
    rec2.event("instance_started", instance=0)
    rec2.continue_clock()
    assert rec2.events[-1]["t"] == pytest.approx(10.0) and rec2.now() == pytest.approx(10.0)
    now[0] += 5
    rec2.log_step({"step": 2, "version": 3, "t_end": rec2.now(), "reward/mean": 0.3}, [1])
    summary = rec2.write()
    assert [r["step"] for r in read_steps(tmp_path)] == [0, 1, 2]
    assert summary["steps"] == 3 and summary["time/run"] == pytest.approx(15.0) and rec2.lags == [0, 1, 0, 1, 1]
    assert rec2.groups[0].trained and isinstance(rec2.groups[0], GroupSpan)


# --------------------------------------------------------------------------------------------- history
def test_window_planner_round_trip_cuts_the_rollout_log_to_the_checkpoint(tmp_path):
    from mindspeed_asp.runtime.tasks import task_and_prompts
    from mindspeed_asp.runtime.replan import WindowPlanner
    from mindspeed_asp.runtime.run_config import load_run_config, packaged_config_path

    cfg = load_run_config(packaged_config_path(), ["data.num_prompts=8", "asp.minibatch_groups=2"])
    _, prompts = task_and_prompts(cfg)
    log = tmp_path / "rollout_log.jsonl"
    p = WindowPlanner(cfg.asp, prompts, 32, 2, rollout_log=log, seed=3)
    for i in range(3):
        p.observe(f"p{i}", 0, [i + 1] * 4, instance=0)
    p.plan(list(range(4)))  # draws from the planner's rng
    state = through_json(p.state_dict())
    p.observe("p3", 0, [9] * 4)  # after the checkpoint: a group that was still generating, or a crash
    assert len(log.read_text().splitlines()) == 4

    q = WindowPlanner(cfg.asp, prompts, 32, 2, rollout_log=log, seed=99)
    q.load_state_dict(state)
    assert len(log.read_text().splitlines()) == 3 and len(q.history) == 3 and q.observed == 3
    assert q.rng.bit_generator.state == state["rng"]
    assert q.history.epoch_matrix(["p0", "p1", "p2"], 0).tolist() == [[1] * 4, [2] * 4, [3] * 4]
    log.write_text("")
    with pytest.raises(InputError, match="changed after the checkpoint"):
        WindowPlanner(cfg.asp, prompts, 32, 2, rollout_log=log).load_state_dict(state)


# --------------------------------------------------------------------------------------------- files and RNG
class FakeTrainer:
    def save_checkpoint(self, path):
        torch = pytest.importorskip("torch", reason="needs the runtime extra: pip install mindspeed-asp[runtime]")
        torch.save({"weights": torch.zeros(3)}, path)  # the archive format the real trainer writes
        return str(path)


def test_checkpoint_files_are_replaced_atomically_and_found_again(tmp_path):
    with pytest.raises(InputError, match="no checkpoint"):
        ck.latest_checkpoint(tmp_path)
    first = ck.write_checkpoint(tmp_path, {"version": 2, "queue": [result(1)]}, FakeTrainer())
    (ck.checkpoint_root(tmp_path) / ".tmp-ckpt-000004-9").mkdir()  # an interrupted write
    second = ck.write_checkpoint(tmp_path, {"version": 4, "queue": [result(5, attempt=1)]}, FakeTrainer())
    assert not first.exists() and second.is_dir()
    assert sorted(p.name for p in ck.checkpoint_root(tmp_path).iterdir()) == [second.name, "latest.json"]
    assert ck.latest_checkpoint(tmp_path) == second and ck.checkpoint_info(tmp_path)["version"] == 4
    state = ck.read_state(second)
    assert state["queue"][0].group_id == RequestId(5, 1) and isinstance(state["queue"][0].samples[0], SampleResult)
    (second / "state.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(InputError, match="state.json"):
        ck.read_state(second)
    whole = (second / "trainer.pt").read_bytes()
    (second / "trainer.pt").write_bytes(whole[:len(whole) // 2])  # a copy cut short
    with pytest.raises(InputError, match="trainer.pt.*truncated"):
        ck.latest_checkpoint(tmp_path)
    (second / "trainer.pt").unlink()
    with pytest.raises(InputError, match="no trainer.pt"):
        ck.latest_checkpoint(tmp_path)


def test_rng_states_round_trip():
    state = through_json(ck.rng_state())
    a = (random.random(), np.random.rand())
    ck.set_rng_state(state)
    assert (random.random(), np.random.rand()) == a


# --------------------------------------------------------------------------------------------- resume config
def test_resume_config_allows_extending_and_refuses_changing_the_run(tmp_path):
    from mindspeed_asp.runtime.resume import resume_config
    from mindspeed_asp.runtime.run_config import dump_config, load_run_config, packaged_config_path

    saved = dump_config(load_run_config(packaged_config_path(), ["run.steps=6"]))
    where = str(tmp_path / "state.json")
    cfg = resume_config(saved, str(tmp_path), 4, ["run.steps=10", "run.checkpoint_every=1"], where)
    assert cfg.run.steps == 10 and cfg.run.out == str(tmp_path) and cfg.asp.max_lag == saved["asp"]["max_lag"]
    assert resume_config(saved, str(tmp_path), 4, [f"asp.max_lag={saved['asp']['max_lag']}"], where).run.steps == 6
    for override, key in (("asp.max_lag=2", "asp.max_lag"), ("asp.mode=async", "asp.mode"),
                          ("asp.minibatch_groups=4", "asp.minibatch_groups"), ("run.seed=5", "run.seed")):
        with pytest.raises(ConfigError, match="cannot change") as exc:
            resume_config(saved, str(tmp_path), 4, [override], where)
        assert exc.value.key == key
    with pytest.raises(ConfigError, match=r"asp\.mode=stock trains at lag 0 only") as exc:
        resume_config(saved, str(tmp_path), 4, ["asp.mode=stock"], where)  # refused by the config itself first
    assert exc.value.key == "asp.max_lag"
    with pytest.raises(ConfigError, match="nothing left to run") as exc:
        resume_config(saved, str(tmp_path), 6, [], where)
    assert exc.value.key == "run.steps"
    # a checkpoint written before a key existed (trainer.devices) resumes at the key's default, not otherwise
    older = {**saved, "trainer": {k: v for k, v in saved["trainer"].items() if k != "devices"}}
    assert resume_config(older, str(tmp_path), 4, [], where).trainer.devices == 1
    with pytest.raises(ConfigError, match="cannot change") as exc:
        resume_config(older, str(tmp_path), 4, ["trainer.devices=2"], where)
    assert exc.value.key == "trainer.devices"


# --------------------------------------------------------------------------------------------- run directory
def test_run_dir_refusal_names_resume_and_overwrite_removes_the_checkpoint(tmp_path):
    from mindspeed_asp.utils.run_dir import prepare_run_dir

    (tmp_path / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(OutputError, match="no checkpoint for --resume"):
        prepare_run_dir(tmp_path, overwrite=False, resume_flag="--resume")
    ck.write_checkpoint(tmp_path, {"version": 1}, FakeTrainer())
    with pytest.raises(OutputError, match=f"use --resume {tmp_path} to continue"):
        prepare_run_dir(tmp_path, overwrite=False, resume_flag="--resume")
    (tmp_path / "notes.txt").write_text("mine")
    prepare_run_dir(tmp_path, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


# --------------------------------------------------------------------------------------------- signals
def test_first_signal_asks_for_a_stop_second_aborts_later_ones_are_ignored():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    stop = StopSignals(announce=False)
    assert stop.install()
    try:
        stop.arm()
        signal.raise_signal(signal.SIGTERM)
        assert stop.requested == signal.SIGTERM and stop.requested_name == "SIGTERM" and not stop.aborted
        with pytest.raises(RunAborted):
            signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)  # while unwinding: ignored, the shutdown goes on
    finally:
        stop.restore()
    assert {s: signal.getsignal(s) for s in before} == before


def test_signal_before_the_loop_interrupts_at_once():
    stop = StopSignals(announce=False)
    stop.install()
    try:
        with pytest.raises(RunInterrupted) as exc:
            signal.raise_signal(signal.SIGINT)
        assert exc.value.signum == signal.SIGINT
    finally:
        stop.restore()


def test_compare_marks_an_interrupted_run():
    from mindspeed_asp.commands.compare import compare_table

    runs = [{"name": "a", "mode": "asp", "steps": 6}, {"name": "b", "mode": "asp", "interrupted": True, "steps": 3,
                                                       "steps_planned": 6}]
    _, rows = compare_table(runs)
    assert rows[0][0] == "a" and rows[1][0] == "b [interrupted 3/6]"


def test_a_stock_checkpoint_that_recorded_another_max_lag_resumes_at_lag_0(tmp_path):
    """Stock checkpoints written while a stock config could still say max_lag 1 (the driver trained at 0) resume
    at lag 0; the config now refuses stock with another max_lag, which would otherwise refuse them."""
    from mindspeed_asp.runtime.resume import resume_config
    from mindspeed_asp.runtime.run_config import dump_config, load_run_config, packaged_config_path

    saved = dump_config(load_run_config(packaged_config_path(), ["asp.mode=stock", "run.steps=6"]))
    saved["asp"]["max_lag"] = 1  # as such a checkpoint recorded it
    cfg = resume_config(saved, str(tmp_path), 4, ["run.steps=8"], str(tmp_path / "state.json"))
    assert cfg.asp.mode == "stock" and cfg.asp.max_lag == 0 and cfg.run.steps == 8
