"""The async trainer's pure pieces: TransferDock rows, per-iteration ASP metrics, the metrics MindSpeed-RL's
logging needs. (The lag audit is the runtime's SampleQueue, tested in test_sample_queue.py.)"""
import pytest

torch = pytest.importorskip("torch", reason="needs the runtime extra: pip install mindspeed-asp[runtime]")

from mindspeed_asp.integrations.mindspeed_rl.async_trainer import groups_to_rows, iteration_metrics
from mindspeed_asp.integrations.mindspeed_rl.data_patches import ASP_PROMPT_ID, POLICY_VERSION, ROLLOUT_LOG_PROB
from mindspeed_asp.runtime.requests import GroupResult, SampleResult


def group(gid, version, inst=0, start=0.0, end=1.0, lens=(3, 5)):
    samples = [SampleResult(list(range(10, 10 + k)), [-0.5] * k, version, version, "stop") for k in lens]
    return GroupResult(str(gid), str(gid), inst, samples, [7, 8], start, start, end)


def test_rows_follow_msrl_layout():
    rows = groups_to_rows([group(4, 1), group(9, 2)], {4: {"labels": torch.tensor([1]), ASP_PROMPT_ID: 40},
                                                       9: {"labels": torch.tensor([2]), ASP_PROMPT_ID: 90}}, n=2)
    assert len(rows["prompts"]) == 4
    assert [int(t[0]) for t in rows[ASP_PROMPT_ID]] == [40, 40, 90, 90]
    assert [int(t[0]) for t in rows[POLICY_VERSION]] == [1, 1, 2, 2]
    assert [int(t[0]) for t in rows["response_length"]] == [3, 5, 3, 5]
    assert rows["input_ids"][1].tolist() == [7, 8, 10, 11, 12, 13, 14]
    assert rows[ROLLOUT_LOG_PROB][1].shape == (5,)
    assert [int(t[0]) for t in rows["labels"]] == [1, 1, 2, 2]
    with pytest.raises(ValueError, match="expected n=3"):
        groups_to_rows([group(4, 1)], {}, n=3)


def test_iteration_metrics_names_and_values():
    gs = [group(0, 1, inst=0, start=100.0, end=110.0), group(1, 1, inst=1, start=100.0, end=105.0)]
    from mindspeed_asp.core.metrics import colocated_devices, split_devices

    # 2 rollout instances x TP 2 beside 4 trainer NPUs: 8 devices in e2e_tps (docs/design.md#e2e_tps)
    m = iteration_metrics(gs, [0, 0, 1, 1], max_lag=1, instances=2, t_iter=20.0, wait_s=5.0, sync_s=1.0,
                          devices=split_devices(2, 2, 4))
    assert m["bubble/skewness"] == pytest.approx(1 - 7.5 / 10)
    assert m["bubble/sorting"] == pytest.approx(0.25)
    assert m["lag/max"] == 1 and m["lag/mean"] == pytest.approx(0.5) and m["lag/frac_over_bound"] == 0
    tokens = 2 * (2 * 2 + 8)
    assert m["throughput/e2e_tps"] == pytest.approx(tokens / (8 * 20.0))
    colo = iteration_metrics(gs, [0, 0, 1, 1], max_lag=1, instances=2, t_iter=20.0, wait_s=5.0, sync_s=1.0,
                             devices=colocated_devices(4))
    assert colo["throughput/e2e_tps"] == pytest.approx(tokens / (4 * 20.0))  # colocated: its 4 NPUs once
    assert m["time/rollout"] == pytest.approx(10.0) and m["time/weight_sync"] == 1.0
    assert m["lag/token_weighted_mean"] == pytest.approx(0.5)  # both groups carry 8 tokens


def test_dedicated_rollout_engines_size_memory_for_themselves(monkeypatch):
    """A rollout device holds only its engine: its vLLM memory share is asp.rollout_memory_utilization, not the
    colocated engines' generate_config.gpu_memory_utilization (0.4 leaves room for Megatron)."""
    import sys
    import types
    from mindspeed_asp.integrations.mindspeed_rl import rollout_worker
    seen = {}

    class Engine:
        def __init__(self, **kwargs):
            seen.update(kwargs)

    monkeypatch.setitem(sys.modules, "mindspeed_rl.models.rollout.vllm_engine",
                        types.SimpleNamespace(VLLMInferEngine=Engine))
    monkeypatch.setattr(rollout_worker, "bind_npu", lambda: 0)
    rollout_worker.ascend_engine_factory({"gpu_memory_utilization": 0.4, "infer_tensor_parallel_size": 2}, "/m", 0.9)
    assert seen["gpu_memory_utilization"] == 0.9 and seen["infer_tensor_parallel_size"] == 2
    assert seen["train_tensor_parallel_size"] is None and seen["load_format"] == "megatron"
