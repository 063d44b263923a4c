"""ASP's state beside MindSpeed-RL's checkpoints (integrations/mindspeed_rl/resume_state.py) and the rollout
driver's snapshot/restore: what a resumed MindSpeed-RL run continues from. Fast: no vLLM, no Ray cluster."""
import json
import types

import pytest

from mindspeed_asp.errors import ConfigError, InputError
from mindspeed_asp.integrations.mindspeed_rl import resume_state as rs
from mindspeed_asp.runtime.requests import GroupRequest, GroupResult, SampleResult

SETTINGS = {"mode": "asp", "max_lag": 1, "instances": 2, "gbs": 2, "n": 2}


def request(gid: int) -> GroupRequest:
    return GroupRequest(str(gid), str(100 + gid), [5, 6, gid + 7], 2, 8, 1.0, 11 + gid)


def result(gid: int, version: int) -> GroupResult:
    samples = [SampleResult([1, 2, 3], [-0.5, -0.25, -1.0 / 3.0], version, version, "stop", [version] * 3)
               for _ in range(2)]
    return GroupResult(str(gid), str(100 + gid), gid % 2, samples, [5, 6, gid + 7], 1.0, 2.0, 3.5)


def snapshot() -> dict:
    return {"trained_gids": [0, 1, 2, 3], "ready": [(request(4), result(4, 1), 1)],
            "unfinished": [(request(5), 1), (request(6), 0)],
            "counters": {"queue/trained": 4, "queue/received": 5, "policy/dispatched": 7}, "isolated": [6]}


def test_state_round_trips_through_an_atomic_file_named_after_the_iteration(tmp_path):
    torch = pytest.importorskip("torch")
    extra = {4: {"labels": torch.tensor([[3, 4]], dtype=torch.int32), "asp_prompt_id": 104},
             5: {"labels": torch.tensor([7], dtype=torch.int32)}, 6: {}}
    state = rs.build_state(2, SETTINGS, snapshot(), version=2, windows_fed=4, next_gid=8, extra=extra,
                           plan_path="plan.parquet")
    path = rs.write_state(tmp_path, state)
    assert path == tmp_path / "asp_state" / "iter_0000002.json"
    assert [p.name for p in path.parent.iterdir()] == ["iter_0000002.json"]  # no temporary file left
    back = rs.read_state(tmp_path, 2, SETTINGS)
    assert back["policy_version"] == 2 and back["plan"] == {"path": "plan.parquet", "windows_fed": 4, "next_gid": 8}
    (req, res, v, ext), = rs.ready_groups(back)
    assert (req, res, v) == (request(4), result(4, 1), 1)  # behaviour log-probs exact through JSON
    assert ext["asp_prompt_id"] == 104
    assert ext["labels"].dtype == torch.int32 and ext["labels"].tolist() == [[3, 4]]
    assert [(q, j) for q, j, _ in rs.unfinished_groups(back)] == [(request(5), 1), (request(6), 0)]
    assert rs.unfinished_groups(back)[0][2]["labels"].tolist() == [7]
    assert back["isolated"] == [6]


def test_a_missing_or_foreign_state_is_refused_naming_the_file_and_key(tmp_path):
    with pytest.raises(InputError, match=r"iter_0000003\.json.*missing.*twice"):
        rs.read_state(tmp_path, 3, SETTINGS)
    rs.write_state(tmp_path, rs.build_state(3, SETTINGS, snapshot(), version=3, windows_fed=4, next_gid=8,
                                            extra={}, plan_path=None))
    with pytest.raises(ConfigError, match=r"key 'asp\.max_lag'.*max_lag=1"):
        rs.read_state(tmp_path, 3, dict(SETTINGS, max_lag=2))
    with pytest.raises(ConfigError, match=r"megatron_training\.global_batch_size"):
        rs.read_state(tmp_path, 3, dict(SETTINGS, gbs=4))
    bad = rs.state_path(tmp_path, 5)
    bad.write_text(json.dumps({"format": "other"}))
    with pytest.raises(InputError, match="not an ASP checkpoint state"):
        rs.read_state(tmp_path, 5, SETTINGS)


def test_save_hook_writes_after_msrl_saved_and_only_for_asp_runs(tmp_path):
    calls = []

    def orig(self, iteration):
        calls.append(("msrl", iteration, rs.state_path(tmp_path, iteration).exists()))
        return "saved"

    save = rs.save_checkpoint_wrapper(orig)
    trainer = types.SimpleNamespace(actor_worker=types.SimpleNamespace(megatron_config=types.SimpleNamespace(
        save=str(tmp_path))))
    assert save(trainer, 1) == "saved" and not (tmp_path / "asp_state").exists()  # stock: no hook, no file
    setattr(trainer, rs.STATE_HOOK, lambda it: rs.colocated_state(it, SETTINGS, it, None))
    save(trainer, 2)
    assert calls[-1] == ("msrl", 2, False)  # MindSpeed-RL's checkpoint first
    assert rs.read_state(tmp_path, 2, SETTINGS)["plan"]["windows_fed"] == 2
    trainer.actor_worker.megatron_config.save = None  # MindSpeed-RL saves nothing: neither does ASP
    save(trainer, 3)
    assert not rs.state_path(tmp_path, 3).exists()


@pytest.fixture
def fresh_driver():
    pytest.importorskip("ray")
    from mindspeed_asp.integrations.mindspeed_rl.lockstep_rollout import LockstepRollout
    made = []

    def make():
        d = LockstepRollout([[object()], [object()]], "asp", max_lag=1, minibatch_groups=2, slots=2, n=2)
        d.pause()  # nothing loaded yet, so nothing was issued: the instances are never called
        made.append(d)
        return d
    yield make
    for d in made:
        d.stop()


def test_driver_restores_a_snapshot_and_trains_the_kept_groups_at_their_versions(fresh_driver):
    snap = snapshot()
    snap["ready"].append((request(7), result(7, 2), 2))
    d = fresh_driver()
    assert d.restore(2, snap["trained_gids"], snap["ready"], snap["unfinished"], snap["counters"],
                     snap["isolated"]) == 2
    again = d.snapshot()
    assert again["isolated"] == [6]  # still isolated: its instance will not steal while it runs
    assert again["trained_gids"] == [0, 1, 2, 3]
    assert [(q, r, v) for q, r, v in again["ready"]] == snap["ready"]
    assert sorted((int(q.group_id), j) for q, j in again["unfinished"]) == [(5, 1), (6, 0)]  # on their queues
    # the lag policy counts the trained and kept groups as the saved run did: of (2 + 1 + 1) * 2 places at
    # version 2, 4 trained + 2 kept are taken, which leaves exactly the 2 unfinished groups to dispatch again
    assert d.control.lag_policy.accepted == 6 and d.control.lag_policy.budget(2) == 2
    got = d.next_minibatch(2, timeout=5)
    assert sorted(int(g.group_id) for g in got["groups"]) == [4, 7]
    assert got["lags"] == [1, 1, 0, 0] and got["counters"]["queue/trained"] == 6  # counters continue
    assert d.snapshot()["trained_gids"] == [0, 1, 2, 3, 4, 7] and d.snapshot()["ready"] == []


def test_restore_needs_a_fresh_driver(fresh_driver):
    d = fresh_driver()
    d.load_window([request(0)], {}, [[0], []])
    with pytest.raises(RuntimeError, match="fresh"):
        d.restore(1, [], [], [], {})
