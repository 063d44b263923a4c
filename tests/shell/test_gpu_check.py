"""shell/gpu_check.sh's own logic on a CPU host: the real script under real bash.

The GPU is what the script checks for, so here: the dry run lists every precondition and step; a host
without a GPU (this one, or a PATH without nvidia-smi) stops at the named preconditions with exit 2 before
anything runs; past the preconditions (an nvidia-smi shim on PATH and ASP_GPU_CHECK_CUDA_PROBE standing for
the CUDA probe), a failing or timed-out step makes the exit non-zero, later steps are not run unless
--keep-going, one GPU skips the benchmark with the reason, and the real GPU-tier step fails when every GPU
test only skipped (which is what pytest does on this CPU host).
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "shell" / "gpu_check.sh"


def without_nvidia_smi() -> str:
    """This PATH minus every directory that holds an nvidia-smi (so the test means the same on a GPU host)."""
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not Path(d, "nvidia-smi").exists()]
    return os.pathsep.join(dirs)


@pytest.fixture()
def shim(tmp_path) -> str:
    """A PATH with an nvidia-smi that lists one fake GPU, ahead of the rest."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "GPU 0: Fake GPU (UUID: GPU-00000000)"\n')
    smi.chmod(0o755)
    return f"{bindir}{os.pathsep}{without_nvidia_smi()}"


def gpu_check(tmp_path, *args: str, path: str | None = None, timeout: float = 120, **env: str):
    full = {k: v for k, v in os.environ.items() if not k.startswith("ASP_GPU_CHECK_")}
    # the venv running these tests stands for the script's default .venv (CI's core tier runs before .venv exists)
    full.update({"ASP_GPU_CHECK_OUT": str(tmp_path / "out"), "PATH": path or without_nvidia_smi(),
                 "ASP_VENV": sys.prefix}, **env)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=full, cwd=tmp_path,
                          timeout=timeout)


def test_dry_run_lists_preconditions_and_steps(tmp_path):
    r = gpu_check(tmp_path, "--dry-run")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for words in ("nvidia-smi", "torch.cuda.is_available()", "venv", "configs/tiny_cpu_longtail.yaml exists",
                  "1. gpu-tests", "-m pytest -m gpu", "tests/runtime/test_gpu_tier.py", "2. benchmark",
                  "benchmarks/bench_runtime.py", "--config configs/tiny_cpu_longtail.yaml", "--seeds 0,1",
                  "--modes stock,async_lag1,asp_lag1", "--json benchmarks/results/runtime_gpu_longtail.json",
                  "run.platform=cuda", "must record at least one passed test", "must be complete"):
        assert words in out, words
    assert not (tmp_path / "out").exists()  # nothing run, nothing written
    r = gpu_check(tmp_path, "--dry-run", "--bench", "never")
    assert r.returncode == 0 and "benchmark: skipped (--bench never)" in r.stdout


def test_bad_usage(tmp_path):
    assert gpu_check(tmp_path, "--bogus").returncode == 64
    r = gpu_check(tmp_path, "--bench", "sometimes")
    assert r.returncode == 64 and "--bench must be auto, always or never" in r.stderr


def test_missing_gpu_is_a_named_precondition_failure(tmp_path):
    r = gpu_check(tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "precondition failed: nvidia-smi: not found on PATH" in r.stderr
    assert "nothing was run" in r.stderr and not (tmp_path / "out").exists()
    if not _cuda():
        probe_says = "torch.cuda.is_available() is False" if _has_torch() else "torch not installed in the venv"
        assert f"precondition failed: torch.cuda: {probe_says}" in r.stderr


@pytest.mark.skipif("_cuda()", reason="this host has CUDA: the probe would pass")
def test_nvidia_smi_without_cuda_names_torch(tmp_path, shim):
    pytest.importorskip("torch")
    r = gpu_check(tmp_path, path=shim)
    assert r.returncode == 2
    assert "nvidia-smi" not in r.stderr and "torch.cuda.is_available() is False" in r.stderr


def test_missing_venv_and_config_are_named(tmp_path, shim):
    r = gpu_check(tmp_path, path=shim, ASP_VENV=str(tmp_path / "novenv"), ASP_GPU_CHECK_CUDA_PROBE="echo 1",
                  ASP_GPU_CHECK_CONFIG="configs/nope.yaml")
    assert r.returncode == 2
    assert "precondition failed: venv:" in r.stderr and "novenv/bin/python not found" in r.stderr
    assert "precondition failed: benchmark config: configs/nope.yaml not found" in r.stderr
    r = gpu_check(tmp_path, path=shim, ASP_GPU_CHECK_CUDA_PROBE="echo 0")
    assert r.returncode == 2 and "no CUDA device visible" in r.stderr


def test_a_failing_step_fails_the_check(tmp_path, shim):
    r = gpu_check(tmp_path, path=shim, ASP_GPU_CHECK_CUDA_PROBE="echo 2", ASP_GPU_CHECK_TESTS_CMD="false",
                  ASP_GPU_CHECK_BENCH_CMD="echo bench-ran")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "gpu-tests  FAIL exit code 1" in r.stdout and "benchmark  -    not run" in r.stdout
    assert "bench-ran" not in r.stdout and "FAILED" in r.stdout
    # --keep-going runs the benchmark after the failure; the exit stays non-zero
    r = gpu_check(tmp_path, "--keep-going", path=shim, ASP_GPU_CHECK_CUDA_PROBE="echo 2",
                  ASP_GPU_CHECK_TESTS_CMD="false", ASP_GPU_CHECK_BENCH_CMD="echo bench-ran")
    assert r.returncode == 1 and "bench-ran" in r.stdout and "benchmark  PASS" in r.stdout
    assert (tmp_path / "out" / "logs" / "benchmark.log").read_text().strip() == "bench-ran"


def test_a_failing_benchmark_fails_the_check(tmp_path, shim):
    r = gpu_check(tmp_path, path=shim, ASP_GPU_CHECK_CUDA_PROBE="echo 2", ASP_GPU_CHECK_TESTS_CMD="true",
                  ASP_GPU_CHECK_BENCH_CMD="exit 3")
    assert r.returncode == 1 and "gpu-tests  PASS" in r.stdout and "benchmark  FAIL exit code 3" in r.stdout


def test_a_step_past_its_timeout_fails(tmp_path, shim):
    r = gpu_check(tmp_path, path=shim, ASP_GPU_CHECK_CUDA_PROBE="echo 2", ASP_GPU_CHECK_TESTS_CMD="sleep 30",
                  ASP_GPU_CHECK_TESTS_TIMEOUT="1", ASP_GPU_CHECK_BENCH_CMD="true")
    assert r.returncode == 1 and "gpu-tests  FAIL timed out after 1 s" in r.stdout


def test_all_steps_passing_and_one_gpu_skipping_the_benchmark(tmp_path, shim):
    r = gpu_check(tmp_path, path=shim, ASP_GPU_CHECK_CUDA_PROBE="echo 2", ASP_GPU_CHECK_TESTS_CMD="true",
                  ASP_GPU_CHECK_BENCH_CMD="echo bench-ran")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gpu-tests  PASS" in r.stdout and "benchmark  PASS" in r.stdout and r.stdout.rstrip().endswith("OK")
    one = dict(path=shim, ASP_GPU_CHECK_CUDA_PROBE="echo 1", ASP_GPU_CHECK_TESTS_CMD="true",
               ASP_GPU_CHECK_BENCH_CMD="echo bench-ran")
    r = gpu_check(tmp_path, **one)
    assert r.returncode == 0 and "benchmark  SKIP 1 GPU visible: the NCCL weight-sync group" in r.stdout
    assert "bench-ran" not in r.stdout
    r = gpu_check(tmp_path, "--bench", "always", **one)
    assert r.returncode == 0 and "bench-ran" in r.stdout


@pytest.mark.skipif("_cuda()", reason="this host has CUDA: the GPU tests would run for real")
def test_a_gpu_tier_that_only_skipped_fails(tmp_path, shim):
    """The real gpu-tests step (pytest -m gpu on the files with gpu tests): on a CPU host every test skips,
    which must not pass for a GPU check."""
    pytest.importorskip("torch")
    r = gpu_check(tmp_path, "--bench", "never", path=shim, ASP_GPU_CHECK_CUDA_PROBE="echo 1", timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "-m pytest -m gpu" in r.stdout and "tests/runtime/test_gpu_tier.py" in r.stdout
    assert "gpu-tests  FAIL no GPU test passed: 0 passed, 0 failed" in r.stdout
    assert (tmp_path / "out" / "gpu_tests.xml").is_file()


def _has_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
