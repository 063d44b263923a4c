"""Process set-up for one run of MindSpeed-RL's own unit tests (`tests/ut`) on a CPU, driver and Ray workers alike.

Every process of a run (the pytest process and each Ray worker) must see the same world before it imports
MindSpeed-RL: the CPU stand-ins of the msrl_e2e tier for the NPU stack, then, unless the run is the baseline,
ASP's patches exactly as a cluster applies them (`setup_hook.apply_all`). The run's configuration comes from the
environment the tier sets (`MSRL_UT_CONFIG`: baseline | stock | asp), so Ray workers, which inherit the raylet's
environment, agree with the driver without any argument passing.

Each process appends one JSON line to `MSRL_UT_MARKERS` saying what it applied, so the tier can prove that the
patches reached the driver and the Ray workers (equal outcomes with patches that never ran would prove nothing).
"""
from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List

CONFIG_ENV = "MSRL_UT_CONFIG"
MARKERS_ENV = "MSRL_UT_MARKERS"
BASELINE = "baseline"
_E2E_DIR = Path(__file__).resolve().parents[2] / "msrl_e2e"  # cpu_standins.py and cpu_engine_standins.py
_STATE: Dict[str, Any] = {"done": False, "targets": []}


def config_name() -> str:
    """The run's configuration; a missing value is an error, so a worker never silently runs the wrong one."""
    name = os.environ.get(CONFIG_ENV, "")
    if name not in (BASELINE, "stock", "asp"):
        raise RuntimeError(f"{CONFIG_ENV}={name!r}: expected baseline, stock or asp")
    return name


def _resolve(target: str) -> Any:
    """The object a dotted patch target names now (module attribute or class attribute)."""
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(target)


def in_effect(targets: List[str]) -> int:
    """How many targets now resolve to code defined in mindspeed_asp (a wrapper keeps its own code object even
    under functools.wraps), i.e. patches that are really installed, not just registered."""
    count = 0
    for target in targets:
        try:
            obj = _resolve(target)
        except (ImportError, AttributeError):
            continue
        code = getattr(obj, "__code__", None) or getattr(getattr(obj, "__func__", None), "__code__", None)
        if code is not None and f"{os.sep}mindspeed_asp{os.sep}" in code.co_filename:
            count += 1
    return count


def write_marker(role: str, **extra: Any) -> None:
    """Append this process's line to the run's marker file (one short write: appends do not interleave)."""
    path = os.environ.get(MARKERS_ENV)
    if not path:
        return
    record = {"role": role, "pid": os.getpid(), "config": os.environ.get(CONFIG_ENV),
              "patches": len(_STATE["targets"]), "asp_imported": "mindspeed_asp" in sys.modules, **extra}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def setup(role: str) -> List[str]:
    """Stand-ins, then ASP's patches unless baseline (once per process); returns the applied targets."""
    if _STATE["done"]:
        return list(_STATE["targets"])
    config = config_name()
    if str(_E2E_DIR) not in sys.path:
        sys.path.insert(0, str(_E2E_DIR))
    from cpu_standins import install
    install()
    if config != BASELINE:
        from mindspeed_asp.integrations.mindspeed_rl.setup_hook import apply_all
        _STATE["targets"] = list(apply_all())
    _STATE["done"] = True
    write_marker(role, in_effect=in_effect(_STATE["targets"]))
    return list(_STATE["targets"])


def worker_setup() -> None:
    """Ray's `worker_process_setup_hook` for the run (named in the driver's job config)."""
    setup("worker")
