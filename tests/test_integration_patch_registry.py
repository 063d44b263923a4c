"""The patch registry follows MindSpeed's rules: replace vs stacked wrappers, rebinding of imported copies,
removal, dummies for new methods. Targets are real modules written to a temp dir and imported."""
import importlib
import sys
import textwrap

import pytest

from mindspeed_asp.integrations.mindspeed_rl.patch_registry import PatchRegistry, get_patch_manager, resolve_target


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


def test_patch_manager_falls_back_without_mindspeed():
    mgr = get_patch_manager()
    try:
        import mindspeed.patch_utils  # noqa: F401
        pytest.skip("MindSpeed installed: its manager is used")
    except ImportError:
        assert isinstance(mgr, PatchRegistry)
