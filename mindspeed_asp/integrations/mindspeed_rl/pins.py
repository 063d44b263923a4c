"""The exact MindSpeed-RL stack the patches are written against, and the start-up check of the installed commit.

MindSpeed-RL is installed from a git clone (no wheel), and its internals changed a lot between releases
(`data_strategy.py` appeared after v2.3.0, `vllm_engine.py` was rewritten for vLLM 0.11). A patch applied to
another commit may bind to a function whose meaning changed, so the launcher refuses any other commit unless
the user overrides it explicitly (`ASP_ALLOW_UNPINNED_MINDSPEED_RL=1`).
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

from mindspeed_asp.errors import AspError

MINDSPEED_RL_COMMIT = "05a90d77cb6cfad8999e2aee21068284db959579"  # master, 2026-04-22
MINDSPEED_RL_SHORT = MINDSPEED_RL_COMMIT[:7]
OVERRIDE_ENV = "ASP_ALLOW_UNPINNED_MINDSPEED_RL"


@dataclass(frozen=True)
class Pin:
    """One component of the stack: the version or commit MindSpeed-RL's install guide pins at 05a90d7."""

    name: str
    version: str
    commit: str = ""
    note: str = ""


# docs/zh/install_guide.md at MindSpeed-RL 05a90d7 (master row of the compatibility matrix)
STACK: Dict[str, Pin] = {p.name: p for p in [
    Pin("mindspeed_rl", "master", MINDSPEED_RL_COMMIT, "git clone + checkout; run from the repo root"),
    Pin("mindspeed", "master", "ac9f0e74061f968fdb285aa6a0df68a980fb0412", "copied into the MindSpeed-RL root"),
    Pin("mindspeed_llm", "master", "a2c0733b9c8674e240a0a7607ed3f973115cc6b7", "copied into the MindSpeed-RL root"),
    Pin("megatron", "core_v0.12.1", "", "git checkout core_v0.12.1; copied into the MindSpeed-RL root"),
    Pin("vllm", "0.11.0", "b8b302c", "releases/v0.11.0, VLLM_TARGET_DEVICE=empty pip install ."),
    Pin("vllm_ascend", "0.11.0-dev", "1b16c01", "v0.11.0-dev, COMPILE_CUSTOM_KERNELS=1 python setup.py install"),
    Pin("torch", "2.7.1"),
    Pin("torch_npu", "2.7.1"),
    Pin("cann", "8.5.0", "", "Ascend toolkit; source set_env.sh"),
    Pin("driver", "25.5.0"),
    Pin("python", "3.10"),
    Pin("ray", "2.54.0", "", "MindSpeed-RL requirements.txt (the install guide's 2.42.1 is stale)"),
    Pin("transformers", "4.57.1"),
]}


class PinMismatchError(AspError):
    """The installed MindSpeed-RL is not the commit the patches were written against."""


def mindspeed_rl_root(src: Optional[str] = None) -> Optional[Path]:
    """The MindSpeed-RL checkout: `src`, env MINDSPEED_RL_SRC, or where `mindspeed_rl` would import from.

    `find_spec` on a top-level name locates the package without executing its heavy `__init__`.
    """
    candidates = [src, os.environ.get("MINDSPEED_RL_SRC")]
    for c in candidates:
        if c and (Path(c) / "mindspeed_rl").is_dir():
            return Path(c).resolve()
    try:
        spec = importlib.util.find_spec("mindspeed_rl")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).resolve().parent


COMMIT_FILE = "COMMIT"  # one line, the commit a copy without .git was taken from (vendored or release trees)
_SHA = re.compile(r"^[0-9a-fA-F]{7,40}$")


def _read_git_head(root: Path) -> Optional[str]:
    """HEAD commit of the repository whose `.git` is `root/.git` itself, with `git` when present, else by
    reading .git files (worktrees included). Never a parent directory's repository: a MindSpeed-RL copy
    inside another checkout has no commit of its own there."""
    git = root / ".git"
    if not git.exists():
        return None
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(root.parent))  # belt and braces: no walking up
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, env=env)
        if out.returncode == 0 and len(out.stdout.strip()) == 40:
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    if git.is_file():  # worktree: "gitdir: <path>"
        text = git.read_text().strip()
        if text.startswith("gitdir:"):
            git = (root / text.split(":", 1)[1].strip()).resolve()
    head = git / "HEAD"
    if not head.is_file():
        return None
    ref = head.read_text().strip()
    if not ref.startswith("ref:"):
        return ref
    name = ref.split(":", 1)[1].strip()
    for base in (git, git.parent.parent if git.parent.name == "worktrees" else git):
        f = base / name
        if f.is_file():
            return f.read_text().strip()
        packed = base / "packed-refs"
        if packed.is_file():
            for line in packed.read_text().splitlines():
                if line.endswith(" " + name):
                    return line.split()[0]
    return None


def _read_commit_file(root: Path) -> Optional[str]:
    """The commit named by `root/COMMIT` (first word of its first line), or None when absent or not a sha."""
    f = root / COMMIT_FILE
    if not f.is_file():
        return None
    words = f.read_text(errors="replace").split()
    return words[0].lower() if words and _SHA.match(words[0]) else None


def installed_mindspeed_rl_commit(src: Optional[str] = None) -> Optional[str]:
    """The commit of the MindSpeed-RL checkout in use, or None when it cannot be known.

    In order: env `ASP_MINDSPEED_RL_COMMIT`; the checkout's own `.git` (its root, never an enclosing
    repository); a `COMMIT` file in its root (copies without .git).
    """
    if os.environ.get("ASP_MINDSPEED_RL_COMMIT"):
        return os.environ["ASP_MINDSPEED_RL_COMMIT"].strip()
    root = mindspeed_rl_root(src)
    if root is None:
        return None
    return _read_git_head(root) or _read_commit_file(root)


def check_mindspeed_rl_commit(src: Optional[str] = None, allow_other: Optional[bool] = None) -> str:
    """Refuse a MindSpeed-RL other than the pinned commit unless explicitly allowed; returns the commit.

    `allow_other` defaults to env ASP_ALLOW_UNPINNED_MINDSPEED_RL=1. An unknown commit (no .git, no COMMIT
    file) is refused the same way: the patches cannot know what they bind to.
    """
    if allow_other is None:
        allow_other = os.environ.get(OVERRIDE_ENV, "") in ("1", "true", "yes")
    root = mindspeed_rl_root(src)
    if root is None:
        raise PinMismatchError("MindSpeed-RL not found: run from its checkout root (as its docs require), put it "
                               "on PYTHONPATH or set MINDSPEED_RL_SRC")
    commit = installed_mindspeed_rl_commit(src)
    if commit is not None and len(commit) >= 7 and MINDSPEED_RL_COMMIT.startswith(commit.lower()):
        return commit
    if allow_other:
        return commit or "unknown"
    found = commit or f"unknown (no .git or {COMMIT_FILE} file in its root; set ASP_MINDSPEED_RL_COMMIT)"
    raise PinMismatchError(
        f"MindSpeed-RL at {root} is at commit {found}, but mindspeed-asp patches are written against "
        f"{MINDSPEED_RL_SHORT}: `git -C {root} checkout {MINDSPEED_RL_SHORT}`, or set {OVERRIDE_ENV}=1 to "
        "run anyway at your own risk")
