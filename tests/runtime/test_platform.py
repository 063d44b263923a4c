"""Platform resolution and mapping for cpu / cuda / npu, with patched probes (runs on any CPU host)."""
from __future__ import annotations

import pytest

from mindspeed_asp.errors import ConfigError
from mindspeed_asp.runtime import platform as plat
from mindspeed_asp.runtime.ray_utils import actor_env
from mindspeed_asp.runtime.tiny_model import DEFAULT_SHAPE, ensure_tiny_model

YES, NO = (lambda: True), (lambda: False)


@pytest.fixture(autouse=True)
def _no_override(monkeypatch):
    monkeypatch.delenv(plat.ENV_OVERRIDE, raising=False)


@pytest.mark.parametrize("probes, kind", [
    ({"npu": NO, "cuda": NO}, "cpu"),
    ({"npu": NO, "cuda": YES}, "cuda"),
    ({"npu": YES, "cuda": NO}, "npu"),
    ({"npu": YES, "cuda": YES}, "npu"),  # an Ascend host with a CUDA torch is still an Ascend host
])
def test_probe_order(probes, kind):
    p = plat.resolve_platform(probes=probes)
    assert p.kind == kind and p.source == "probe"


def test_mapping_of_each_kind():
    pytest.importorskip("torch", reason="devices and streams are torch's: needs the runtime extra")
    cpu = plat.resolve_platform(probes={"npu": NO, "cuda": NO})
    assert (cpu.device_type, cpu.dist_backend, cpu.visible_devices_env, cpu.ray_resource) == \
        ("cpu", "gloo", None, None)
    assert not cpu.is_accelerator and cpu.ray_actor_resources(2) == {}
    assert str(cpu.device(3)) == "cpu" and cpu.current_stream() is None and cpu.device_count() == 0

    cuda = plat.resolve_platform(probes={"npu": NO, "cuda": YES})
    assert (cuda.device_type, cuda.dist_backend, cuda.visible_devices_env, cuda.ray_resource) == \
        ("cuda", "nccl", "CUDA_VISIBLE_DEVICES", "GPU")
    assert cuda.ray_actor_resources(2) == {"num_gpus": 2.0}
    assert str(cuda.device(1)) == "cuda:1" and cuda.torch_module_name == "cuda"
    assert cuda.supports("sleep_mode") and cuda.supports("nccl_weight_sync")

    npu = plat.resolve_platform(probes={"npu": YES, "cuda": NO})
    assert (npu.device_type, npu.dist_backend, npu.visible_devices_env, npu.ray_resource) == \
        ("npu", "hccl", "ASCEND_RT_VISIBLE_DEVICES", "NPU")
    assert npu.ray_actor_resources(1) == {"resources": {"NPU": 1.0}}
    assert npu.supports("hccl_weight_sync") and not npu.supports("nccl_weight_sync")
    assert npu.torch_module_name == "npu"
    # verl's CPU mistakes must not exist here
    assert cpu.dist_backend != "nccl" and cpu.ray_resource != "NPU"


def test_env_override_wins_over_probes(monkeypatch):
    monkeypatch.setenv(plat.ENV_OVERRIDE, "cpu")
    p = plat.resolve_platform(probes={"npu": YES, "cuda": YES})
    assert p.kind == "cpu" and p.source == "env"
    monkeypatch.setenv(plat.ENV_OVERRIDE, "NPU")
    assert plat.resolve_platform(probes={"npu": NO, "cuda": NO}).kind == "npu"


def test_unknown_override_names_the_variable(monkeypatch):
    monkeypatch.setenv(plat.ENV_OVERRIDE, "tpu")
    with pytest.raises(ConfigError, match="ASP_PLATFORM"):
        plat.resolve_platform()
    with pytest.raises(ValueError):
        plat.platform_from_name("tpu")


def test_current_platform_resolved_once(monkeypatch):
    plat.current_platform.cache_clear()
    calls = []
    monkeypatch.setattr(plat, "probe_npu", lambda: calls.append("npu") or False)
    monkeypatch.setattr(plat, "probe_cuda", lambda: calls.append("cuda") or False)
    try:
        first = plat.current_platform()
        assert plat.current_platform() is first
        assert calls == ["npu", "cuda"]
    finally:
        plat.current_platform.cache_clear()


def test_real_probe_on_this_host_is_consistent():
    torch = pytest.importorskip("torch")
    p = plat.resolve_platform()
    if p.kind == "cpu":
        assert not torch.cuda.is_available() or plat.probe_npu()
    assert p.torch_module is not None


def test_actor_env_is_single_threaded_and_platform_tagged():
    cpu_env = actor_env(plat.platform_from_name("cpu"))
    assert cpu_env["OMP_NUM_THREADS"] == "1" and cpu_env["ASP_PLATFORM"] == "cpu"
    assert cpu_env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and cpu_env["GLOO_SOCKET_IFNAME"] == "lo"
    gpu_env = actor_env(plat.platform_from_name("cuda"), threads=4)
    assert gpu_env["OMP_NUM_THREADS"] == "4" and "VLLM_CPU_KVCACHE_SPACE" not in gpu_env


def test_tiny_model_is_idempotent_and_loads_in_hf(tmp_path):
    pytest.importorskip("transformers")
    d = ensure_tiny_model(str(tmp_path / "m"), seed=3)
    mtime = (tmp_path / "m" / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(str(tmp_path / "m"), seed=3) == d
    assert (tmp_path / "m" / "model.safetensors").stat().st_mtime_ns == mtime  # reused, not rewritten
    from mindspeed_asp.runtime.tiny_model import load_hf_model

    model = load_hf_model(d)
    cfg = model.config
    assert cfg.vocab_size == DEFAULT_SHAPE["vocab_size"] and cfg.head_dim >= 32
    names = {n for n, _ in model.named_parameters()}
    assert "model.layers.0.self_attn.q_proj.weight" in names and "lm_head.weight" in names
    # another seed rebuilds the directory with other weights
    ensure_tiny_model(str(tmp_path / "m"), seed=4)
    other = load_hf_model(d)
    assert not bool((other.lm_head.weight == model.lm_head.weight).all())


def test_tiny_model_refuses_foreign_dir_and_bad_shape(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "weights.bin").write_text("not ours")
    with pytest.raises(FileExistsError):
        ensure_tiny_model(str(tmp_path / "x"))
    with pytest.raises(ValueError, match="head_dim"):
        ensure_tiny_model(str(tmp_path / "y"), head_dim=16)
    with pytest.raises(ValueError, match="unknown"):
        ensure_tiny_model(str(tmp_path / "y"), layers=3)


def test_tiny_model_concurrent_creation(tmp_path):
    """Two writers racing on one directory both end with the same complete model."""
    pytest.importorskip("transformers")
    import threading

    results, errors = [], []

    def make():
        try:
            results.append(ensure_tiny_model(str(tmp_path / "race"), seed=1))
        except Exception as exc:  # noqa: BLE001  pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=make) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    assert sorted(p.name for p in (tmp_path / "race").iterdir()) == [
        "asp_tiny_model.json", "config.json", "generation_config.json", "model.safetensors"]
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]
