"""`asp doctor` checks the installed vllm-ascend's commit, not only its version string.

MindSpeed-RL's install guide clones the `v0.11.0-dev` branch, whose tip is 108 commits past the pinned 1b16c01
(sampler, model runner and worker changed) under the same version. Each test builds a fake install under
tmp_path (a package directory, a git checkout's files, a dist-info) and puts it first on sys.path, so the
check's own discovery (find_spec, importlib.metadata) finds it.
"""
import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Optional

import pytest

from mindspeed_asp.integrations.mindspeed_rl import doctor_checks as dc
from mindspeed_asp.integrations.mindspeed_rl.pins import (
    STACK, VLLM_ASCEND_COMMIT, VLLM_ASCEND_COMMIT_ENV, installed_vllm_ascend_commit, is_pinned_commit)

TIP = "b30408353a8397471ba675a0893b47a15481b4b3"  # v0.11.0-dev branch tip, 2026-01-19


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(VLLM_ASCEND_COMMIT_ENV, raising=False)
    yield
    for name in [m for m in sys.modules if m == "vllm_ascend" or m.startswith("vllm_ascend.")]:
        del sys.modules[name]  # the fake package the check's find_spec imported
    importlib.invalidate_caches()


def _package(root: Path) -> Path:
    """A vllm_ascend package with the PyHccl module the NPU check looks for."""
    pkg = root / "vllm_ascend"
    comm = pkg / "distributed" / "device_communicators"
    comm.mkdir(parents=True)
    for d in (pkg, pkg / "distributed", comm):
        (d / "__init__.py").write_text("")
    (comm / "pyhccl.py").write_text("")
    return pkg


def _on_path(monkeypatch: pytest.MonkeyPatch, where: Path) -> None:
    monkeypatch.syspath_prepend(str(where))
    importlib.invalidate_caches()


def _dist_info(site: Path, version: str, direct_url: Optional[dict] = None) -> None:
    info = site / f"vllm_ascend-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm_ascend\nVersion: {version}\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


def _fake_clone(root: Path, head: str, packed: bool = False) -> Path:
    """vllm-ascend's source tree with a .git whose HEAD is branch v0.11.0-dev at `head` (files only)."""
    _package(root)
    (root / "setup.py").write_text('setup(\n    name="vllm_ascend",\n)\n')
    git = root / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/v0.11.0-dev\n")
    if packed:
        (git / "packed-refs").write_text(f"# pack-refs with: peeled fully-peeled sorted\n{head} "
                                         "refs/heads/v0.11.0-dev\n")
    else:
        (git / "refs" / "heads" / "v0.11.0-dev").write_text(head + "\n")
    return root


def test_pin_is_the_install_guides_commit() -> None:
    assert VLLM_ASCEND_COMMIT.startswith(STACK["vllm_ascend"].commit) and len(VLLM_ASCEND_COMMIT) == 40
    assert is_pinned_commit("1b16c01af", VLLM_ASCEND_COMMIT) and not is_pinned_commit(TIP, VLLM_ASCEND_COMMIT)
    assert not is_pinned_commit("1b16c0", VLLM_ASCEND_COMMIT)  # too short to name anything


@pytest.mark.parametrize("packed", [False, True])
def test_branch_tip_checkout_fails_naming_both_commits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        packed: bool) -> None:
    clone = _fake_clone(tmp_path / "vllm-ascend", TIP, packed)
    _on_path(monkeypatch, clone)  # `python setup.py develop` / `pip install -e .`
    probe = installed_vllm_ascend_commit()
    assert probe.commit == TIP and str(clone) in probe.source
    c = dc.check_vllm_ascend("npu")
    assert c.status == dc.FAIL
    assert TIP[:10] in c.found and VLLM_ASCEND_COMMIT[:10] in c.found and "git checkout 1b16c01" in c.fix
    assert dc.check_vllm_ascend("cpu").status == dc.WARN  # not used off Ascend: no hard failure there


def test_pinned_checkout_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _on_path(monkeypatch, _fake_clone(tmp_path / "vllm-ascend", VLLM_ASCEND_COMMIT))
    c = dc.check_vllm_ascend("npu")
    assert c.status == dc.OK and VLLM_ASCEND_COMMIT[:10] in c.found and "PyHcclCommunicator" in c.found


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_real_git_checkout_at_another_commit_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clone = tmp_path / "vllm-ascend"
    _package(clone)
    (clone / "setup.py").write_text("setup(name='vllm-ascend')\n")
    run = lambda *a: subprocess.run(["git", "-C", str(clone), *a], check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    run("add", ".")
    run("-c", "user.email=a@b", "-c", "user.name=t", "commit", "-qm", "x")
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    _on_path(monkeypatch, clone)
    c = dc.check_vllm_ascend("npu")
    assert c.status == dc.FAIL and head[:10] in c.found and VLLM_ASCEND_COMMIT[:10] in c.found


def test_an_enclosing_projects_repository_is_not_vllm_ascends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A vllm_ascend copy whose parent is some other checkout: that HEAD says nothing about vllm-ascend."""
    other = _fake_clone(tmp_path / "project", TIP)
    (other / "setup.py").write_text('setup(name="something_else")\n')
    _on_path(monkeypatch, other)
    assert installed_vllm_ascend_commit().commit is None
    assert dc.check_vllm_ascend("npu").status == dc.WARN


@pytest.mark.parametrize("commit,status", [(TIP, dc.FAIL), (VLLM_ASCEND_COMMIT, dc.OK)])
def test_pip_vcs_install_is_read_from_direct_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 commit: str, status: str) -> None:
    site = tmp_path / "site-packages"
    _package(site)
    _dist_info(site, "0.11.0rc1.dev161", {"url": "https://github.com/vllm-project/vllm-ascend.git",
                                          "vcs_info": {"vcs": "git", "commit_id": commit,
                                                       "requested_revision": "v0.11.0-dev"}})
    _on_path(monkeypatch, site)
    probe = installed_vllm_ascend_commit()
    assert probe.commit == commit and "direct_url.json" in probe.source
    c = dc.check_vllm_ascend("npu")
    assert c.status == status and commit[:10] in c.found


@pytest.mark.parametrize("version,status", [("0.11.1.dev6+gb30408353", dc.FAIL),
                                            ("0.11.1.dev6+gb30408353.d20260119", dc.FAIL),
                                            ("0.11.0rc1.dev161+g1b16c01af", dc.OK)])
def test_setup_py_install_is_read_from_the_scm_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       version: str, status: str) -> None:
    """The install guide's `python setup.py install` from a clone: setuptools_scm puts +g<sha> in the version."""
    site = tmp_path / "site-packages"
    _package(site)
    _dist_info(site, version)
    _on_path(monkeypatch, site)
    c = dc.check_vllm_ascend("npu")
    assert c.status == status and version in c.found
    if status == dc.FAIL:
        assert "b30408353" in c.found and VLLM_ASCEND_COMMIT[:10] in c.found


def test_version_file_written_at_build_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site-packages"
    pkg = _package(site)
    (pkg / "_version.py").write_text("__version__ = version = '0.11.1.dev6+gb30408353'\n"
                                     "__commit_id__ = commit_id = 'gb30408353'\n")
    _on_path(monkeypatch, site)  # no dist-info
    probe = installed_vllm_ascend_commit()
    assert probe.commit == "b30408353" and probe.source.endswith("_version.py")
    assert dc.check_vllm_ascend("npu").status == dc.FAIL
    (pkg / "_version.py").write_text("__version__ = version = '0.11.0rc1.dev161+g1b16c01af'\n")
    assert installed_vllm_ascend_commit().commit == "1b16c01af"


def test_no_readable_commit_warns_saying_what_was_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site-packages"
    _package(site)
    _dist_info(site, "0.11.0rc0")  # a tagged build: no +g<sha>
    _on_path(monkeypatch, site)
    c = dc.check_vllm_ascend("npu")
    assert c.status == dc.WARN and "commit unknown" in c.found
    for what in ("direct_url.json", "'0.11.0rc0'", "_version.py", VLLM_ASCEND_COMMIT_ENV):
        assert what in c.found
    assert VLLM_ASCEND_COMMIT[:10] in c.fix and VLLM_ASCEND_COMMIT_ENV in c.fix
    monkeypatch.setenv(VLLM_ASCEND_COMMIT_ENV, VLLM_ASCEND_COMMIT[:7])  # the user states it
    assert dc.check_vllm_ascend("npu").status == dc.OK
