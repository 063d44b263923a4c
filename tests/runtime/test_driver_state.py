"""Every attribute of the runtime's Driver is declared in `__init__`, so a reader finds the whole state in one
place and no method depends on another having run first (no `getattr(self, name, default)` fallbacks)."""
from __future__ import annotations

import ast
from pathlib import Path

import mindspeed_asp.runtime.driver as driver_module


def _driver_class() -> ast.ClassDef:
    tree = ast.parse(Path(driver_module.__file__).read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Driver")


def _assigned(fn: ast.FunctionDef) -> set:
    names = set()
    for node in ast.walk(fn):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if isinstance(el, ast.Attribute) and isinstance(el.value, ast.Name) and el.value.id == "self":
                    names.add(el.attr)
    return names


def test_every_driver_attribute_is_declared_in_init():
    cls = _driver_class()
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef)]
    declared = _assigned(next(m for m in methods if m.name == "__init__"))
    for m in methods:
        late = _assigned(m) - declared
        assert not late, f"Driver.{m.name} creates {sorted(late)}: declare them in __init__"


def test_driver_has_no_lazy_attribute_fallbacks():
    source = Path(driver_module.__file__).read_text()
    assert "getattr(self" not in source and "hasattr(self" not in source
