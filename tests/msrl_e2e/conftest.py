"""The msrl_e2e tier needs MindSpeed-RL's pinned source: `MINDSPEED_RL_SRC`, else the vendored copy that
tests/vendor_paths.py finds (developer machines and CI). Where neither exists every test here skips and says why."""
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vendor_paths import mindspeed_rl_src, missing_reason  # noqa: E402

_SRC = mindspeed_rl_src()
if _SRC is not None:
    os.environ.setdefault("MINDSPEED_RL_SRC", str(_SRC))  # run_msrl.py and its Ray workers read it


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/msrl_e2e/" in str(item.fspath).replace(os.sep, "/") and _SRC is None:
            item.add_marker(pytest.mark.skip(reason=missing_reason()))
