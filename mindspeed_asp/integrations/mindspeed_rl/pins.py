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
from importlib import metadata
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from mindspeed_asp.errors import AspError

MINDSPEED_RL_COMMIT = "05a90d77cb6cfad8999e2aee21068284db959579"  # master, 2026-04-22
MINDSPEED_RL_SHORT = MINDSPEED_RL_COMMIT[:7]
# vllm-ascend v0.11.0-dev @ 1b16c01 (2025-10-25), the install guide's pin. The guide's `git clone -b v0.11.0-dev`
# gives the branch tip instead (b30408353a, 108 commits later, touching sample/sampler.py, model_runner_v1.py
# and worker_v1.py), so `asp doctor` reads the installed commit rather than trusting the version string.
VLLM_ASCEND_COMMIT = "1b16c01afd26f5f8f17d2e5e603622ed503d119c"
VLLM_ASCEND_COMMIT_ENV = "ASP_VLLM_ASCEND_COMMIT"  # states the commit of a copy nothing else identifies
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


@dataclass(frozen=True)
class CommitProbe:
    """What was found about an installed package's commit: the commit (None when nothing says), where it was
    read, and every place that was looked at (for the message when none answered)."""

    commit: Optional[str]
    source: str
    checked: Tuple[str, ...]


_SCM_VERSION = re.compile(r"\+(?:.*\.)?g([0-9a-f]{7,40})(?:\.|$)")  # setuptools_scm: 0.11.0rc1.dev161+g1b16c01af
_SCM_COMMIT_ID = re.compile(r"""commit_id\s*=\s*['"]g?([0-9a-f]{7,40})['"]""")


def _package_dir(name: str) -> Optional[Path]:
    """Where `name` would import from, without running its `__init__` (find_spec of a top-level name)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def _distribution(names: Tuple[str, ...]) -> Optional[metadata.Distribution]:
    for n in names:
        try:
            return metadata.distribution(n)
        except metadata.PackageNotFoundError:
            continue
    return None


_SOURCE_NAME = re.compile(r"""name\s*=\s*['"]vllm[-_]ascend['"]""")


def _is_vllm_ascend_source(root: Path) -> bool:
    """`root` is vllm-ascend's own source tree (its setup.py or pyproject.toml names the project)."""
    for name in ("setup.py", "pyproject.toml"):
        f = root / name
        if f.is_file() and _SOURCE_NAME.search(f.read_text(errors="replace")):
            return True
    return False


def _scm_commit(version: str) -> Optional[str]:
    m = _SCM_VERSION.search(version or "")
    return m.group(1) if m else None


def installed_vllm_ascend_commit(package_dir: Optional[Path] = None,
                                 dist: Optional[metadata.Distribution] = None) -> CommitProbe:
    """The commit of the vllm_ascend in use, read without importing it or running git's network side.

    In order: a git checkout the package runs from (its own directory's or its parent's `.git`: `setup.py
    develop`, `pip install -e`); pip's `direct_url.json` in the dist-info (`vcs_info.commit_id`: `pip install
    git+...`); setuptools_scm's `+g<sha>` local version in the metadata or the `commit_id`/`version` written to
    `vllm_ascend/_version.py` at build time (`python setup.py install` from a clone, the install guide's way);
    env ASP_VLLM_ASCEND_COMMIT last. Defaults: the importable `vllm_ascend` and its installed metadata.
    """
    checked: List[str] = []
    pkg = package_dir if package_dir is not None else _package_dir("vllm_ascend")
    dist = dist if dist is not None else _distribution(("vllm_ascend", "vllm-ascend"))
    if pkg is not None:
        for root in (pkg, pkg.parent):
            if root == pkg.parent and not _is_vllm_ascend_source(root):
                continue  # e.g. a copy inside another project's checkout: that repository's HEAD says nothing
            checked.append(f"{root}/.git")
            head = _read_git_head(root)
            if head and _SHA.match(head):
                return CommitProbe(head.lower(), f"git checkout {root}", tuple(checked))
    if dist is not None:
        checked.append("direct_url.json of the vllm-ascend dist-info")
        try:
            import json
            info = json.loads(dist.read_text("direct_url.json") or "{}")
        except (OSError, ValueError):
            info = {}
        commit = str((info.get("vcs_info") or {}).get("commit_id") or "") if isinstance(info, dict) else ""
        if _SHA.match(commit):
            return CommitProbe(commit.lower(), "pip direct_url.json vcs_info.commit_id", tuple(checked))
        version = dist.version or ""
        checked.append(f"the installed version {version!r} (+g<sha>)")
        commit = _scm_commit(version) or ""
        if commit:
            return CommitProbe(commit, f"version {version}", tuple(checked))
    if pkg is not None:
        f = pkg / "_version.py"
        checked.append(str(f))
        if f.is_file():
            text = f.read_text(errors="replace")
            m = _SCM_COMMIT_ID.search(text)
            commit = m.group(1) if m else _scm_commit(" ".join(re.findall(r"""['"]([^'"]*\+[^'"]*)['"]""", text)))
            if commit:
                return CommitProbe(commit, str(f), tuple(checked))
    checked.append(f"env {VLLM_ASCEND_COMMIT_ENV}")
    stated = os.environ.get(VLLM_ASCEND_COMMIT_ENV, "").strip()
    if _SHA.match(stated):
        return CommitProbe(stated.lower(), f"env {VLLM_ASCEND_COMMIT_ENV}", tuple(checked))
    return CommitProbe(None, "", tuple(checked))


def is_pinned_commit(found: str, pinned: str) -> bool:
    """`found` names `pinned`: one is a prefix of the other, with at least 7 hex digits."""
    a, b = found.lower(), pinned.lower()
    return len(a) >= 7 and (b.startswith(a) or a.startswith(b))
