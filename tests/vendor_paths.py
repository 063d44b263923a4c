"""Where the tests find MindSpeed-RL and MindSpeed's pinned sources.

`MINDSPEED_RL_SRC` / `MINDSPEED_SRC` win when set. Otherwise the unmodified pinned copies that sit beside the
checkout on developer machines and in CI (`VENDOR` below) are used, read in place. A user's clone has
neither, and the tests that need them skip with `missing_reason()`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
VENDOR = REPO.parent / "shared" / "vendor"
MSRL_PIN = "05a90d7"
MINDSPEED_PIN = "ac9f0e74"


def _pick(env: str, vendored: str, package: str) -> Optional[Path]:
    raw = os.environ.get(env)
    path = Path(raw) if raw else VENDOR / vendored
    return path.resolve() if (path / package).is_dir() else None


def mindspeed_rl_src() -> Optional[Path]:
    """MindSpeed-RL's root (holding `mindspeed_rl/`), or None."""
    return _pick("MINDSPEED_RL_SRC", f"MindSpeed-RL-{MSRL_PIN}", "mindspeed_rl")


def mindspeed_src() -> Optional[Path]:
    """The directory holding MindSpeed's `mindspeed/` package, or None."""
    return _pick("MINDSPEED_SRC", f"MindSpeed-{MINDSPEED_PIN}", "mindspeed")


def missing_reason(what: str = "MindSpeed-RL") -> str:
    env = "MINDSPEED_RL_SRC" if what == "MindSpeed-RL" else "MINDSPEED_SRC"
    raw = os.environ.get(env)
    if raw:
        return f"{env}={raw} does not hold the {what} sources"
    return (f"no {what} sources: set {env} to a checkout at the pinned commit, or run from a clone that has "
            f"the vendored pinned sources beside it (tests/vendor_paths.py VENDOR)")
