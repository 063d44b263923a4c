"""GPU tier: vLLM on CUDA generates with versions and log-probs, and a weight sync over NCCL from a
trainer on one GPU reaches an instance on another GPU with checksums and log-probs matching HF.

Skipped (with the reason) where CUDA is not available; the NCCL sync needs two GPUs because NCCL refuses
two ranks on one device. The trainer runs as a Ray actor so Ray gives it a GPU of its own.
"""
from __future__ import annotations

import os
import time

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.vllm,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False"),
]

PROMPT = [11, 23, 5, 42, 7, 99]


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.fixture(scope="module")
def cuda_env(tiny_model, ray_holder):
    ray = pytest.importorskip("ray")
    pytest.importorskip("vllm")
    from mindspeed_asp.runtime.platform import platform_from_name

    old = os.environ.get("ASP_PLATFORM")
    os.environ["ASP_PLATFORM"] = "cuda"
    platform = platform_from_name("cuda")
    ray_holder.ensure(platform="cuda")  # the held Ray when it is already CUDA's, else a fresh one
    yield {"ray": ray, "platform": platform, "model_dir": tiny_model}
    if old is None:
        os.environ.pop("ASP_PLATFORM", None)
    else:
        os.environ["ASP_PLATFORM"] = old


def _instance(env, slots: int = 8):
    from mindspeed_asp.runtime.instance import start_instances
    from mindspeed_asp.runtime.requests import EngineConfig

    cfg = EngineConfig(model_path=env["model_dir"], slots=slots, max_model_len=512, dtype="float32",
                       gpu_memory_utilization=0.1)
    actors, infos = start_instances([cfg], platform=env["platform"], timeout_s=600, retries=1)
    assert infos[0]["platform"] == "cuda"
    return actors[0]


def _wait(ray, actor, ids, timeout=300.0):
    got, deadline = {}, time.time() + timeout
    while set(ids) - set(got):
        assert time.time() < deadline, f"timed out waiting for {set(ids) - set(got)}"
        got.update({r.group_id: r for r in ray.get(actor.drain_finished.remote())})
        time.sleep(0.05)
    return got


def test_cuda_instance_generates_with_logprobs(cuda_env):
    from mindspeed_asp.runtime.requests import GroupRequest

    ray = cuda_env["ray"]
    inst = _instance(cuda_env)
    try:
        groups = [GroupRequest(f"g{i}", f"p{i}", PROMPT, n=4, max_new_tokens=16, seed=i, ignore_eos=True)
                  for i in range(3)]
        ray.get(inst.submit.remote(groups))
        res = _wait(ray, inst, [g.group_id for g in groups])
        for r in res.values():
            assert len(r.samples) == 4
            for s in r.samples:
                assert len(s.token_ids) == 16 and len(s.logprobs) == 16 and s.min_version == 0
                assert all(lp <= 0 for lp in s.logprobs)
    finally:
        ray.get(inst.shutdown.remote())
        ray.kill(inst)


@pytest.mark.skipif(_gpus() < 2, reason="NCCL weight sync needs 2 GPUs (trainer and instance on separate devices)")
def test_nccl_sync_matches_hf(cuda_env):
    from mindspeed_asp.runtime.requests import GroupRequest
    from mindspeed_asp.runtime.weight_sync.checksums import checksums_match

    ray = cuda_env["ray"]
    inst = _instance(cuda_env)

    @ray.remote(num_gpus=1)
    class Trainer:
        """The trainer's sending rank on its own GPU (HF model, perturbed weights)."""

        def __init__(self, model_dir):
            os.environ["ASP_PLATFORM"] = "cuda"
            from mindspeed_asp.runtime.platform import current_platform
            from mindspeed_asp.runtime.tiny_model import load_hf_model

            self.platform = current_platform()
            self.platform.set_device(0)
            self.model = load_hf_model(model_dir).to(self.platform.device(0))
            g = torch.Generator(device="cpu").manual_seed(1)
            with torch.no_grad():
                for p in self.model.parameters():
                    p.add_(torch.randn(p.shape, generator=g).to(p.device) * 0.5 * (p.std() + 0.02))

        def sync(self, instances, version):
            from mindspeed_asp.runtime.weight_sync.instance_sync import init_weight_sync, sync_weights
            from mindspeed_asp.runtime.weight_sync.sender import WeightSyncSender

            sender = WeightSyncSender(self.platform, "127.0.0.1", 0, world_size=2, bucket_bytes=256 << 10)
            init_weight_sync(sender, instances)
            stats = sync_weights(sender, instances, version, self.model.state_dict().items())
            sender.close()
            return {"verified": stats.verified, "bytes": stats.bytes, "seconds": stats.seconds,
                    "checksums": stats.checksums, "backend": self.platform.dist_backend}

        def token_logprobs(self, prompt, tokens):
            ids = torch.tensor([list(prompt) + list(tokens)], device=self.platform.device(0))
            with torch.no_grad():
                logp = torch.log_softmax(self.model(ids).logits[0].double(), dim=-1)
            return [float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(tokens)]

    trainer = Trainer.remote(cuda_env["model_dir"])
    try:
        out = ray.get(trainer.sync.remote([inst], 1), timeout=600)
        assert out["verified"] and out["bytes"] > 0 and out["backend"] == "nccl"
        assert checksums_match(out["checksums"], ray.get(inst.weights_checksum.remote())) == []
        ray.get(inst.submit.remote([GroupRequest("s", "p", PROMPT, n=2, max_new_tokens=10, seed=3,
                                                 ignore_eos=True)]))
        res = _wait(ray, inst, ["s"])["s"]
        for s in res.samples:
            assert s.min_version == 1
            ref = ray.get(trainer.token_logprobs.remote(PROMPT, s.token_ids))
            assert max(abs(a - b) for a, b in zip(s.logprobs, ref)) < 2e-3
    finally:
        ray.get(inst.shutdown.remote())
        ray.kill(inst)
        ray.kill(trainer)
