"""The import layering of docs/design.md#layering, checked by reading every import of every file.

Function-level imports count: a lazy import inside a function is still a dependency, and hiding a cycle
behind one is what these rules forbid. Imports under `if TYPE_CHECKING:` are annotations only and skipped.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, Set, Tuple

import pytest

PKG = Path(__file__).resolve().parents[1] / "mindspeed_asp"
ERRORS = "errors"
BASE = "base"
#: what every layer above the base may use: the error types, the pure core, the helpers and the base modules
#: (config, cost_model)
FOUNDATION = {ERRORS, "core", "utils", BASE}
#: layer -> the layers it may import (besides itself)
ALLOWED: Dict[str, Set[str]] = {
    ERRORS: set(),
    "core": {ERRORS},
    "utils": {ERRORS, "core"},
    BASE: {ERRORS, "core", "utils"},
    "sim": FOUNDATION,
    "scheduler": FOUNDATION | {"sim"},
    "workloads": FOUNDATION | {"scheduler"},
    "experiments": FOUNDATION | {"sim", "scheduler", "workloads"},
    "runtime": FOUNDATION | {"sim", "scheduler", "workloads"},
    "integrations": FOUNDATION | {"sim", "scheduler", "workloads", "runtime"},
    "commands": FOUNDATION | {"sim", "scheduler", "workloads", "experiments", "runtime", "integrations"},
    "cli": {ERRORS, "utils", "commands"},
}
#: layers that must load without the runtime's heavy libraries (a core-only install plans and simulates)
CORE_LAYERS = (ERRORS, "core", "utils", BASE, "sim", "scheduler", "workloads", "experiments")
HEAVY = ("torch", "ray", "vllm", "transformers")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or module == "mindspeed_asp.errors":
        return ERRORS
    if len(parts) == 2 and (PKG / f"{parts[1]}.py").exists():
        if module in ("mindspeed_asp.cli", "mindspeed_asp.__main__"):
            return "cli"
        return BASE
    return parts[1]


def _type_checking_nodes(tree: ast.AST) -> Set[int]:
    skip: Set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def imports(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, imported module) of every mindspeed_asp import in the file, at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skip = _type_checking_nodes(tree)
    here = module_name(path).split(".")
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("mindspeed_asp"):
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here if is_pkg else here[:-1]
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("mindspeed_asp"):
                continue
            for alias in node.names:  # `from mindspeed_asp.core import metrics` imports the module metrics
                sub = f"{mod}.{alias.name}"
                yield node.lineno, sub if _is_module(sub) else mod


def _is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:]) if "." in name else Path()
    return (PKG / rel).with_suffix(".py").exists() or (PKG / rel / "__init__.py").exists()


def all_files():
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def test_layers_are_known():
    unknown = {layer(module_name(p)) for p in all_files()} - set(ALLOWED)
    assert not unknown, f"packages without a layering rule (add them to docs/design.md#layering): {unknown}"


def test_imports_run_one_way():
    bad = []
    for path in all_files():
        src = module_name(path)
        own = layer(src)
        for line, dst in imports(path):
            if dst == "mindspeed_asp":
                continue
            target = layer(dst)
            if target == own or target in ALLOWED[own]:
                continue
            bad.append(f"{path.relative_to(PKG.parent)}:{line}: {own} imports {dst} ({target})")
    assert not bad, "imports against docs/design.md#layering:\n" + "\n".join(bad)


def test_rules_catch_a_lazy_import(tmp_path, monkeypatch):
    """The checker sees an import inside a function (where a cycle would otherwise hide)."""
    f = tmp_path / "mindspeed_asp" / "sim" / "x.py"
    f.parent.mkdir(parents=True)
    f.write_text("def f():\n    from mindspeed_asp.scheduler.planners import PLANNERS\n    return PLANNERS\n")
    monkeypatch.setattr(sys.modules[__name__], "PKG", tmp_path / "mindspeed_asp")
    found = list(imports(f))
    assert found == [(2, "mindspeed_asp.scheduler.planners")]
    assert layer("mindspeed_asp.scheduler.planners") not in ALLOWED[layer("mindspeed_asp.sim.x")]


def test_core_layers_load_without_heavy_libraries():
    mods = [module_name(p) for p in all_files() if layer(module_name(p)) in CORE_LAYERS
            and module_name(p) not in ("mindspeed_asp.cli", "mindspeed_asp.__main__")]
    code = ("import importlib, sys\n"
            f"for m in {mods!r}:\n    importlib.import_module(m)\n"
            f"print(sorted(h for h in {HEAVY!r} if h in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]", f"a core module loads {out.stdout.strip()}"


WEIGHT_SYNC = PKG / "runtime" / "weight_sync"
#: the weight-sync modules, lowest first: each may import only the ones before it
WEIGHT_SYNC_ORDER = ("checksums", "buckets", "group_store", "communicators", "sender", "receiver", "instance_sync")
#: pure: the checksum and the bucket plan need torch and the errors only (workers import them alone)
WEIGHT_SYNC_PURE = ("checksums", "buckets")
WEIGHT_SYNC_PURE_BANS = {"ray", "vllm", "vllm_ascend", "transformers"}


def external_imports(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, top-level package) of every import of the file that is not mindspeed_asp, at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skip = _type_checking_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        for name in names:
            if not name.startswith("mindspeed_asp"):
                yield node.lineno, name.split(".")[0]


def test_weight_sync_modules_run_one_way_and_checksums_and_buckets_are_pure():
    """Within runtime/weight_sync/ imports point down WEIGHT_SYNC_ORDER; only instance_sync talks to Ray;
    checksums and buckets import neither Ray, vLLM nor the communicators, and the package re-exports nothing
    (so importing the checksum loads nothing else)."""
    mods = sorted(p.stem for p in WEIGHT_SYNC.glob("*.py") if p.stem != "__init__")
    assert mods == sorted(WEIGHT_SYNC_ORDER), "a new weight-sync module needs its place in WEIGHT_SYNC_ORDER"
    bad = [f"{path.relative_to(PKG.parent)}: imports {dst}" for path in (PKG / "runtime" / "__init__.py",
                                                                        WEIGHT_SYNC / "__init__.py")
           for _, dst in imports(path)]
    prefix = "mindspeed_asp.runtime.weight_sync."
    for i, name in enumerate(WEIGHT_SYNC_ORDER):
        path = WEIGHT_SYNC / f"{name}.py"
        where = path.relative_to(PKG.parent)
        pure = name in WEIGHT_SYNC_PURE
        below = {prefix + m for m in WEIGHT_SYNC_ORDER[:i]}
        for line, dst in imports(path):
            if (dst.startswith(prefix) and dst not in below) or (pure and dst != "mindspeed_asp.errors"):
                bad.append(f"{where}:{line}: {name} imports {dst}")
        banned = WEIGHT_SYNC_PURE_BANS if pure else set() if name == "instance_sync" else {"ray"}
        bad += [f"{where}:{line}: {name} imports {lib}" for line, lib in external_imports(path) if lib in banned]
    assert not bad, "weight-sync layering:\n" + "\n".join(bad)


@pytest.mark.parametrize("name", ["mindspeed_asp.scheduler.types", "mindspeed_asp.sim.cost_fit",
                                  "mindspeed_asp.sim.sweep", "mindspeed_asp.scheduler.fluid",
                                  *(f"mindspeed_asp.{m}" for m in (
                                      "policy", "types", "metrics", "fluid", "learning", "memory_budget", "limits",
                                      "planner_names", "atomic", "textfile", "jsonl", "argtypes", "run_dir",
                                      "extras", "plotting", "run_report", "runtime.types", "runtime.metrics_log",
                                      "scheduler.plan", "sim.metrics", "integrations.mindspeed_rl.rollout_driver"))])
def test_moved_modules_are_gone(name):
    """No shim is left behind where a module moved down (or up) a layer."""
    assert not _is_module(name)


#: the rollout decisions' parts, wired once: only the rollout control builds them (the simulator has its own
#: trainer model and builds its own LagPolicy)
ROLLOUT_PARTS = ("LagPolicy", "Dispatcher", "SampleQueue")


def test_only_the_rollout_control_builds_the_policy_dispatcher_and_queue():
    """Both drivers (runtime/driver.py and integrations/mindspeed_rl/lockstep_rollout.py) take their decisions
    from one `RolloutControl`; a second place building a LagPolicy, Dispatcher or SampleQueue in the runtime or
    an integration is a second orchestration that can drift from the first."""
    owner = PKG / "runtime" / "rollout_control.py"
    bad = []
    for path in sorted((PKG / "runtime").rglob("*.py")) + sorted((PKG / "integrations").rglob("*.py")):
        if path == owner:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                if name in ROLLOUT_PARTS:
                    bad.append(f"{path.relative_to(PKG.parent)}:{node.lineno}: builds a {name}")
    assert not bad, "only runtime/rollout_control.py builds the rollout parts:\n" + "\n".join(bad)


#: what the pure core may import from outside the package: the standard library, numpy and scipy
CORE_THIRD_PARTY = {"numpy", "scipy"}


def test_the_core_imports_only_the_standard_library_numpy_and_scipy():
    bad = [f"{path.relative_to(PKG.parent)}:{line}: imports {lib}"
           for path in sorted((PKG / "core").glob("*.py")) for line, lib in external_imports(path)
           if lib not in sys.stdlib_module_names and lib not in CORE_THIRD_PARTY]
    assert not bad, "mindspeed_asp/core/ is pure:\n" + "\n".join(bad)


#: module names used twice on purpose: a `commands/` module is named after its `asp` subcommand, and the
#: simulator's dispatcher and instance model the runtime's of the same name
SHARED_NAMES = {
    "demo": {"commands", "runtime/tasks"},
    "whatif": {"commands", "experiments"},
    "dispatcher": {"runtime", "sim"},
    "instance": {"runtime", "sim"},
}


def test_no_two_modules_share_a_name_unless_listed():
    """A reader who meets `metrics` or `types` should not have to ask which one: a name used twice is listed
    above with its reason."""
    homes: Dict[str, Set[str]] = {}
    for path in all_files():
        if path.name != "__init__.py":
            homes.setdefault(path.stem, set()).add(path.parent.relative_to(PKG).as_posix())
    repeated = {name: dirs for name, dirs in homes.items() if len(dirs) > 1}
    assert repeated == SHARED_NAMES
