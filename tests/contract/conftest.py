"""Contract tests run against MindSpeed-RL's real source: `MINDSPEED_RL_SRC` when set, else the pinned copy that
tests/vendor_paths.py finds (every developer machine and CI). Where neither exists every test here skips and says why.
"""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vendor_paths import mindspeed_rl_src, mindspeed_src, missing_reason  # noqa: E402

_SRC = mindspeed_rl_src()
if _SRC is not None:
    os.environ.setdefault("MINDSPEED_RL_SRC", str(_SRC))  # msrl_shim and subprocesses read it
_MS = mindspeed_src()
if _MS is not None:
    os.environ.setdefault("MINDSPEED_SRC", str(_MS))


#: MindSpeed-RL's source imports these at module level; a core-only install has none of them
_RUNTIME = [m for m in ("ray", "torch", "omegaconf") if importlib.util.find_spec(m) is None]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/contract/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.contract)
            if _SRC is None:
                item.add_marker(pytest.mark.skip(reason=missing_reason()))
            elif _RUNTIME:
                item.add_marker(pytest.mark.skip(reason=f"MindSpeed-RL needs {', '.join(_RUNTIME)}: "
                                                        "pip install mindspeed-asp[cpu,test]"))


@pytest.fixture(scope="session")
def msrl_src() -> Path:
    return _SRC


@pytest.fixture()
def patched(monkeypatch):
    """`apply(config_path)`: ASP's data patches in a fresh registry under that config, removed after the test."""
    from mindspeed_asp.integrations.mindspeed_rl.patch_registry import PatchRegistry
    from mindspeed_asp.integrations.mindspeed_rl.setup_hook import register, selected_patches
    registry = PatchRegistry()

    def apply(config_path):
        monkeypatch.setenv("ASP_MSRL_CONFIG", config_path)
        register(registry, selected_patches(["data"]))
        registry.apply_patches()
    yield apply
    registry.remove_patches()
