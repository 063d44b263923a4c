"""The peer_ut tier needs MindSpeed-RL's pinned source (with its `tests/ut`) and MindSpeed's patch manager:
`MINDSPEED_RL_SRC` / `MINDSPEED_SRC`, else the pinned copies beside the checkout (developer machines and CI).
Where either is missing every test here skips and says why."""
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vendor_paths import mindspeed_rl_src, mindspeed_src, missing_reason  # noqa: E402


def skip_reason() -> str:
    """Why the tier cannot run here, or '' when it can."""
    src = mindspeed_rl_src()
    if src is None:
        return missing_reason()
    if not (src / "tests" / "ut").is_dir():
        return f"{src} has no tests/ut (MindSpeed-RL's own unit tests)"
    if mindspeed_src() is None:
        return missing_reason("MindSpeed")
    return ""


def pytest_collection_modifyitems(config, items):
    reason = skip_reason()
    for item in items:
        if reason and "tests/msrl_ut/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.skip(reason=reason))
