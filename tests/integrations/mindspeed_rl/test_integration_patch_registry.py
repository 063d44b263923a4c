"""The patch registry follows MindSpeed's rules: replace vs stacked wrappers, rebinding of imported copies,
removal, dummies for new methods. Targets are real modules written to a temp dir and imported."""
import functools
import importlib
import sys
import textwrap
import types

import pytest

from mindspeed_asp.errors import RunError
from mindspeed_asp.integrations.mindspeed_rl.patch_registry import (
    PatchRegistry, check_patches_live, current_value, get_patch_manager, resolve_target, reverted_targets)


@pytest.fixture()
def pkg(tmp_path, monkeypatch):
    root = tmp_path / "asp_patch_target"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "core.py").write_text(textwrap.dedent("""
        def double(x):
            return 2 * x

        class Worker:
            def rows(self, k):
                return list(range(k))

            @staticmethod
            def rank():
                return 7

        class Sub(Worker):
            pass
    """))
    (root / "user.py").write_text("from asp_patch_target.core import double\n\ndef use(x):\n    return double(x)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for m in [k for k in sys.modules if k.startswith("asp_patch_target")]:
        del sys.modules[m]
    core = importlib.import_module("asp_patch_target.core")
    user = importlib.import_module("asp_patch_target.user")
    yield core, user
    for m in [k for k in sys.modules if k.startswith("asp_patch_target")]:
        del sys.modules[m]


def test_replacement_rebinds_from_import_copies_and_is_removed(pkg):
    core, user = pkg
    reg = PatchRegistry()
    reg.register_patch("asp_patch_target.core.double", lambda x: 3 * x)
    assert core.double(2) == 4  # nothing happens before apply
    reg.apply_patches()
    assert core.double(2) == 6
    assert user.double(2) == 6 and user.use(2) == 6  # the `from core import double` copy was rebound
    reg.remove_patches()
    assert core.double(2) == 4 and user.use(2) == 4


def test_wrappers_stack_in_registration_order_on_top_of_a_replacement(pkg):
    core, _ = pkg

    def plus_one_wrapper(fn):
        return lambda x: fn(x) + 1

    def times_ten_decorator(fn):
        return lambda x: fn(x) * 10

    reg = PatchRegistry()
    reg.register_patch("asp_patch_target.core.double", plus_one_wrapper)
    reg.register_patch("asp_patch_target.core.double", times_ten_decorator)
    reg.apply_patches()
    assert core.double(1) == (2 * 1 + 1) * 10
    reg.remove_wrappers("asp_patch_target.core.double", "times_ten_decorator")
    reg.apply_patches()
    assert core.double(1) == 3
    reg.register_patch("asp_patch_target.core.double", lambda x: 5 * x)  # replacement under the wrapper
    reg.apply_patches()
    assert core.double(1) == 6


def test_second_replacement_needs_force(pkg):
    reg = PatchRegistry()
    reg.register_patch("asp_patch_target.core.double", lambda x: x)
    with pytest.raises(RuntimeError, match="exists already"):
        reg.register_patch("asp_patch_target.core.double", lambda x: -x)
    reg.register_patch("asp_patch_target.core.double", lambda x: -x, force_patch=True)
    reg.apply_patches()
    core, _ = pkg
    assert core.double(3) == -3
    reg.remove_patches()


def test_class_methods_staticmethods_and_inherited_restore(pkg):
    core, _ = pkg
    reg = PatchRegistry()

    def rows_wrapper(fn):
        def rows(self, k):
            return fn(self, k)[::-1]
        return rows

    reg.register_patch("asp_patch_target.core.Sub.rows", rows_wrapper)
    reg.register_patch("asp_patch_target.core.Worker.rank", staticmethod(lambda: 1))
    reg.apply_patches()
    assert core.Sub().rows(3) == [2, 1, 0]
    assert core.Worker().rows(3) == [0, 1, 2]  # only the subclass was patched
    assert core.Worker.rank() == 1
    reg.remove_patches()
    assert "rows" not in core.Sub.__dict__  # inherited method: the subclass gets no copy on removal
    assert core.Sub().rows(3) == [0, 1, 2] and core.Worker.rank() == 7


def test_create_dummy_adds_a_method_and_none_installs_a_raising_function(pkg):
    core, _ = pkg
    reg = PatchRegistry()
    reg.register_patch("asp_patch_target.core.Worker.asp_extra", lambda self: "new", create_dummy=True)
    reg.register_patch("asp_patch_target.core.triple", None, create_dummy=True)
    reg.apply_patches()
    assert core.Sub().asp_extra() == "new"
    with pytest.raises(RuntimeError, match="does not exist"):
        core.triple(1)
    reg.remove_patches()
    assert not hasattr(core.Worker, "asp_extra")


def test_missing_target_is_an_error_naming_it(pkg):
    reg = PatchRegistry()
    reg.register_patch("asp_patch_target.core.nope", lambda: 0)
    with pytest.raises(AttributeError, match="asp_patch_target.core.nope"):
        reg.apply_patches()
    with pytest.raises(ModuleNotFoundError):
        resolve_target("no_such_pkg_xyz.mod.f")


def test_patch_manager_is_asps_own_registry_even_where_mindspeed_imports(monkeypatch):
    """MindSpeed's class-global table would let its repatch flow revert ASP's patches: never use it."""
    ms = types.ModuleType("mindspeed")
    pu = types.ModuleType("mindspeed.patch_utils")

    class MindSpeedPatchesManager:  # what `from mindspeed.patch_utils import MindSpeedPatchesManager` finds
        patches_info: dict = {}

    pu.MindSpeedPatchesManager = MindSpeedPatchesManager
    ms.patch_utils = pu
    monkeypatch.setitem(sys.modules, "mindspeed", ms)
    monkeypatch.setitem(sys.modules, "mindspeed.patch_utils", pu)
    mgr = get_patch_manager()
    assert isinstance(mgr, PatchRegistry) and mgr is get_patch_manager()  # one registry per process


@pytest.fixture()
def prefix_pkgs(tmp_path, monkeypatch):
    """`asp_pfx_rl.core` imports `asp_pfx`, which does not exist: a string prefix of the package's name."""
    root = tmp_path / "asp_pfx_rl"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "core.py").write_text("import asp_pfx\n\ndef f():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for m in [k for k in sys.modules if k.startswith("asp_pfx")]:
        del sys.modules[m]


def test_a_missing_import_named_like_a_prefix_is_reported_as_missing(prefix_pkgs):
    with pytest.raises(ModuleNotFoundError, match="asp_pfx'") as info:
        resolve_target("asp_pfx_rl.core.f")
    assert info.value.name == "asp_pfx" and "asp_pfx_rl.core.f" in str(info.value)
    with pytest.raises(ModuleNotFoundError, match="asp_pfx"):  # applying says so too (not AttributeError)
        _apply_one("asp_pfx_rl.core.f")
    with pytest.raises(ModuleNotFoundError, match="no module for patch target"):  # a missing top-level package
        resolve_target("asp_pfx_missing.mod.f")


def _apply_one(target):
    reg = PatchRegistry()
    reg.register_patch(target, lambda: 2)
    reg.apply_patches()


def test_liveness_names_every_reverted_target_and_accepts_stacked_wrappers(pkg):
    core, _ = pkg
    reg = PatchRegistry()

    def rows_wrapper(fn):
        def rows(self, k):
            return fn(self, k)[::-1]
        return rows

    reg.register_patch("asp_patch_target.core.double", lambda x: 3 * x)
    reg.register_patch("asp_patch_target.core.Worker.rows", rows_wrapper)
    stock_rows = core.Worker.rows
    reg.apply_patches()
    installed = {t: current_value(t) for t in reg.patches_info}
    try:
        assert check_patches_live(installed, "test") == 2
        # Another manager stacks its own wrappers on top (a closure; functools.wraps): still live.
        mine = core.double

        def feature(*a):
            return mine(*a)
        core.double = feature
        rows = installed["asp_patch_target.core.Worker.rows"]
        core.Worker.rows = functools.wraps(core.Worker.rows)(lambda self, k: rows(self, k))
        assert reverted_targets(installed) == {}
        # A repatch puts the stock method back, and a module attribute is replaced by something else.
        core.Worker.rows = stock_rows
        core.double = lambda x: 2 * x
        with pytest.raises(RunError) as info:
            check_patches_live(installed, "initialize_megatron")
        msg = str(info.value)
        assert "2 of 2 patches were reverted after initialize_megatron" in msg
        assert "asp_patch_target.core.Worker.rows now holds asp_patch_target.core.Worker.rows" in msg
        assert "asp_patch_target.core.double now holds" in msg
        del core.Worker.rows  # the class lost the method: reported, not skipped
        assert "asp_patch_target.core.Worker.rows" in reverted_targets(installed)
    finally:
        core.Worker.rows = stock_rows
        reg.remove_patches()
