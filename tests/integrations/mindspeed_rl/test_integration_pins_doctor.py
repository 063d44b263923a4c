"""The MindSpeed-RL pin check and `asp doctor` (which must run on this CPU machine and say what is missing)."""
import json
import subprocess

import pytest

from mindspeed_asp.cli import main
from mindspeed_asp.integrations.mindspeed_rl import doctor_checks as dc
from mindspeed_asp.integrations.mindspeed_rl.pins import (
    MINDSPEED_RL_COMMIT, STACK, PinMismatchError, check_mindspeed_rl_commit, installed_mindspeed_rl_commit)


def _git_checkout(path):
    (path / "mindspeed_rl").mkdir(parents=True)
    (path / "mindspeed_rl" / "__init__.py").write_text("")
    run = lambda *a: subprocess.run(["git", "-C", str(path), *a], check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    run("add", ".")
    run("-c", "user.email=a@b", "-c", "user.name=t", "commit", "-qm", "x")
    return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def test_pin_refuses_other_commits_unless_overridden(tmp_path, monkeypatch):
    monkeypatch.delenv("ASP_MINDSPEED_RL_COMMIT", raising=False)
    monkeypatch.delenv("ASP_ALLOW_UNPINNED_MINDSPEED_RL", raising=False)
    head = _git_checkout(tmp_path / "msrl")
    assert installed_mindspeed_rl_commit(str(tmp_path / "msrl")) == head
    with pytest.raises(PinMismatchError, match=head):
        check_mindspeed_rl_commit(str(tmp_path / "msrl"))
    assert check_mindspeed_rl_commit(str(tmp_path / "msrl"), allow_other=True) == head
    monkeypatch.setenv("ASP_ALLOW_UNPINNED_MINDSPEED_RL", "1")
    assert check_mindspeed_rl_commit(str(tmp_path / "msrl")) == head
    monkeypatch.delenv("ASP_ALLOW_UNPINNED_MINDSPEED_RL")
    monkeypatch.setenv("ASP_MINDSPEED_RL_COMMIT", MINDSPEED_RL_COMMIT[:7])  # copies without .git
    assert check_mindspeed_rl_commit(str(tmp_path / "msrl")) == MINDSPEED_RL_COMMIT[:7]


def _msrl_copy(path, commit=None):
    (path / "mindspeed_rl").mkdir(parents=True)
    (path / "mindspeed_rl" / "__init__.py").write_text("")
    if commit is not None:
        (path / "COMMIT").write_text(commit + "\n")
    return path


def test_commit_file_inside_another_repository_wins_over_the_parents_head(tmp_path, monkeypatch):
    """A MindSpeed-RL copy without .git (vendored, release tarball) inside someone's checkout: git would walk
    up and report the enclosing repository's HEAD; the pin check must read the copy's COMMIT file."""
    monkeypatch.delenv("ASP_MINDSPEED_RL_COMMIT", raising=False)
    monkeypatch.delenv("ASP_ALLOW_UNPINNED_MINDSPEED_RL", raising=False)
    parent_head = _git_checkout(tmp_path / "outer")
    msrl = _msrl_copy(tmp_path / "outer" / "vendor" / "MindSpeed-RL", MINDSPEED_RL_COMMIT)
    assert installed_mindspeed_rl_commit(str(msrl)) == MINDSPEED_RL_COMMIT != parent_head
    assert check_mindspeed_rl_commit(str(msrl)) == MINDSPEED_RL_COMMIT


def test_copy_without_commit_inside_another_repository_is_unknown(tmp_path, monkeypatch):
    monkeypatch.delenv("ASP_MINDSPEED_RL_COMMIT", raising=False)
    monkeypatch.delenv("ASP_ALLOW_UNPINNED_MINDSPEED_RL", raising=False)
    parent_head = _git_checkout(tmp_path / "outer")
    msrl = _msrl_copy(tmp_path / "outer" / "MindSpeed-RL")
    assert installed_mindspeed_rl_commit(str(msrl)) is None
    with pytest.raises(PinMismatchError, match="no .git or COMMIT file") as exc:
        check_mindspeed_rl_commit(str(msrl))
    assert parent_head not in str(exc.value)
    (msrl / "COMMIT").write_text("not a sha\n")
    assert installed_mindspeed_rl_commit(str(msrl)) is None


def test_own_git_directory_wins_over_a_stale_commit_file(tmp_path, monkeypatch):
    monkeypatch.delenv("ASP_MINDSPEED_RL_COMMIT", raising=False)
    msrl = tmp_path / "msrl"
    (msrl).mkdir()
    (msrl / "COMMIT").write_text(MINDSPEED_RL_COMMIT + "\n")
    head = _git_checkout(msrl)
    assert installed_mindspeed_rl_commit(str(msrl)) == head


def test_stack_matches_the_install_guide():
    assert MINDSPEED_RL_COMMIT.startswith("05a90d7")
    assert STACK["vllm"].version == "0.11.0" and STACK["vllm_ascend"].commit == "1b16c01"
    assert STACK["torch_npu"].version == "2.7.1" and STACK["cann"].version == "8.5.0"


def test_doctor_cpu_target_runs_and_agrees_with_its_checks(capsys):
    checks = dc.run_checks("cpu")
    rc = main(["doctor", "--target", "cpu", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["target"] == "cpu" and rc == (0 if report["ready"] else 1)
    assert report["ready"] == dc.ready(checks)
    names = {c["name"] for c in report["checks"]}
    assert {"torch", "vllm", "ray", "torch_npu", "CANN", "vllm-ascend", "MindSpeed-RL", "HCCL env"} <= names


def test_doctor_npu_target_is_not_ready_here_and_says_how_to_fix(capsys, monkeypatch):
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    rc = main(["doctor", "--target", "npu"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "NOT READY" in out
    assert "[FAIL] torch_npu" in out and "fix:" in out and "CANN 8.5.0" in out


def test_cann_version_from_toolkit_file(tmp_path, monkeypatch):
    (tmp_path / "version.cfg").write_text("toolkit_version=8.5.0.alpha001\n")
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(tmp_path))
    c = dc.check_cann("npu")
    assert c.status == dc.OK and c.found.startswith("8.5.0")
    (tmp_path / "version.cfg").write_text("toolkit_version=8.2.RC1\n")
    assert dc.check_cann("npu").status == dc.WARN


def test_hccl_env_flags_nz_layout(monkeypatch):
    for k in ("HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_IF_BASE_PORT") + dc.SOCKET_IFNAMES:
        monkeypatch.setenv(k, "1")
    monkeypatch.setenv("VLLM_ASCEND_ENABLE_NZ", "1")
    c = dc.check_hccl_env("npu")
    assert c.status == dc.WARN and "VLLM_ASCEND_ENABLE_NZ" in c.found
    monkeypatch.setenv("VLLM_ASCEND_ENABLE_NZ", "0")
    assert dc.check_hccl_env("npu").status == dc.OK


def test_hccl_env_flags_missing_socket_interfaces(monkeypatch):
    for k in ("HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_IF_BASE_PORT"):
        monkeypatch.setenv(k, "1")
    for k in dc.SOCKET_IFNAMES:
        monkeypatch.delenv(k, raising=False)
    c = dc.check_hccl_env("npu")
    assert c.status == dc.WARN and "HCCL_SOCKET_IFNAME" in c.found and "ASP_SOCKET_IFNAME" in c.fix


def test_ray_check_only_looks_at_the_cluster_ray_address_names(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    c = dc.check_ray_resources("npu")
    assert c.status == dc.SKIP and "RAY_ADDRESS" in c.found


def test_doctor_checks_a_config(capsys, tmp_path):
    from pathlib import Path
    cfg = Path(__file__).resolve().parents[3] / "configs" / "qwen25_32b_A3_asp.yaml"
    c = dc.check_config(str(cfg), "npu")
    assert c.status == dc.OK and "16 train NPUs + 16 rollout NPUs = 32" in c.found
    bad = tmp_path / "bad.yaml"
    bad.write_text(cfg.read_text().replace("minibatch_groups: 64", "minibatch_groups: 3"))
    rc = main(["doctor", "--target", "cpu", "--config", str(bad)])
    out = capsys.readouterr().out
    assert rc == 1 and "asp.minibatch_groups" in out
