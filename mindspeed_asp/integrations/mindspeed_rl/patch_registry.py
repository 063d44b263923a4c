"""A patch registry with MindSpeed's semantics, so ASP's patches compose with MindSpeed's own.

`register_patch('pkg.mod.Class.method', fn)` records a patch; nothing changes until `apply_patches()`.
A function whose name ends in `wrapper` or `decorator` is stacked around the original (several allowed, in
registration order); any other function replaces it (a second replacement raises unless `force_patch`).
Applying also rebinds every `from x import f` copy already imported (any module attribute that *is* the
original object), and `remove_patches()` undoes all of it.

ASP's patches always live in this registry (`get_patch_manager()`), never in MindSpeed's
`MindSpeedPatchesManager`, even where `mindspeed` is importable. MindSpeed's table is class-global, and its
`remove_patches()` followed by `apply_patches()` (its repatch flow) puts back every patched attribute's
original: ASP's patches would silently revert to stock `compute_loss` and dispatch. Kept apart, they still
compose with MindSpeed's own: a MindSpeed patch registered later on the same target takes the attribute's
current value (ASP's wrapper) as its original, so it stacks on top, and MindSpeed's repatch restores ASP's
wrapper, not stock. `check_patches_live` verifies, in a running process, that every target still holds (or
still calls through) the object ASP installed.
"""
from __future__ import annotations

import importlib
import os
import sys
import types
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from mindspeed_asp.errors import RunError

_WRAPPER_SUFFIXES = ("wrapper", "decorator")


def _is_wrapper(fn: Any) -> bool:
    return getattr(fn, "__name__", "").endswith(_WRAPPER_SUFFIXES)


def _missing(name: str) -> Callable[..., Any]:
    def dummy_function(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"function {name} does not exist (installed by register_patch with new_func=None)")
    return dummy_function


def _is_module_prefix(missing: str, name: str) -> bool:
    """True when module `missing` is `name` itself or one of its parent packages (dotted boundaries)."""
    return name == missing or name.startswith(missing + ".")


def resolve_target(path: str, create_dummy: bool = False) -> Tuple[Any, str, Any]:
    """(owner, attribute, current value) of a dotted path such as 'pkg.mod.Class.method'.

    The longest importable module prefix is imported; the rest is walked with getattr, so classes (and
    nested classes) work. With `create_dummy`, missing modules are created empty and a missing attribute
    resolves to None, which lets a patch add a new function or method.
    """
    parts = path.split(".")
    if len(parts) < 2:
        raise ValueError(f"patch target {path!r} must be 'module.attr' or 'module.Class.attr'")
    module = None
    i = len(parts) - 1
    while i >= 1:
        name = ".".join(parts[:i])
        try:
            module = importlib.import_module(name)
            break
        except ModuleNotFoundError as exc:
            if exc.name is not None and not _is_module_prefix(exc.name, name):
                # `name` exists but one of its own imports is missing: say so, do not hide it behind a later
                # "has no attribute" (a string prefix such as `mindspeed` of `mindspeed_rl` is no parent)
                raise ModuleNotFoundError(f"patch target {path!r}: importing {name} failed: no module named "
                                          f"{exc.name!r}", name=exc.name) from exc
            i -= 1
    if module is None:
        if not create_dummy:
            raise ModuleNotFoundError(f"no module for patch target {path!r}")
        i = len(parts) - 1
    owner: Any = module
    for k in range(i, len(parts) - 1):
        attr = parts[k]
        if hasattr(owner, attr):
            owner = getattr(owner, attr)
            continue
        if not create_dummy:
            raise AttributeError(f"patch target {path!r}: {'.'.join(parts[:k])} has no attribute {attr!r}")
        dummy = types.ModuleType(".".join(parts[:k + 1]))
        sys.modules[dummy.__name__] = dummy
        if owner is not None:
            setattr(owner, attr, dummy)
        owner = dummy
    leaf = parts[-1]
    if not hasattr(owner, leaf) and not create_dummy:
        raise AttributeError(f"patch target {path!r} does not exist")
    return owner, leaf, getattr(owner, leaf, None)


class Patch:
    """One target: its optional replacement and its stacked wrappers."""

    def __init__(self, target: str, create_dummy: bool = False) -> None:
        self.target = target
        self.create_dummy = create_dummy
        self.replacement: Optional[Callable[..., Any]] = None
        self.wrappers: List[Callable[..., Any]] = []
        self.owner: Any = None
        self.attr = target.rsplit(".", 1)[-1]
        self.original: Any = None
        self.raw_original: Any = None  # what owner.__dict__ held (staticmethod objects stay intact)
        self.had_original = False
        self.applied: Any = None  # the object installed by apply(); None when not applied
        self.rebound: List[Tuple[Any, str]] = []

    def add(self, fn: Optional[Callable[..., Any]], force_patch: bool = False) -> None:
        if fn is None:
            fn = _missing(self.target)
        if _is_wrapper(fn):
            if fn not in self.wrappers:
                self.wrappers.append(fn)
        else:
            if self.replacement is not None and not force_patch:
                raise RuntimeError(f"the patch of {self.target} exists already (use force_patch=True)")
            self.replacement = fn
        if self.applied is not None:  # re-apply with the new stack
            self.remove()

    def apply(self) -> None:
        if self.applied is not None:
            return
        owner, attr, current = resolve_target(self.target, self.create_dummy)
        if self.owner is None:
            self.owner, self.original = owner, current
            own = getattr(owner, "__dict__", {})
            self.had_original = attr in own if isinstance(owner, type) else current is not None
            self.raw_original = own.get(attr, current) if isinstance(owner, type) else current
        final = self.replacement if self.replacement is not None else self.original
        if final is None:
            raise RuntimeError(f"patch target {self.target} does not exist and no replacement was given")
        for w in self.wrappers:
            final = w(final)
        setattr(self.owner, attr, final)
        self.rebound = []
        if self.original is not None and not isinstance(self.owner, type):
            for name, mod in list(sys.modules.items()):
                if mod is None or mod is self.owner:
                    continue
                try:
                    if getattr(mod, attr, None) is self.original:
                        setattr(mod, attr, final)
                        self.rebound.append((mod, attr))
                except Exception:  # noqa: BLE001 - lazy modules may raise on getattr
                    continue
        self.applied = final

    def remove(self) -> None:
        if self.applied is None:
            return
        if self.had_original:
            setattr(self.owner, self.attr, self.raw_original)
        else:
            try:
                delattr(self.owner, self.attr)
            except AttributeError:
                pass
        for mod, attr in self.rebound:
            if getattr(mod, attr, None) is self.applied:
                setattr(mod, attr, self.original)
        self.rebound = []
        self.applied = None


class PatchRegistry:
    """MindSpeedPatchesManager's interface and rules, for nodes without MindSpeed."""

    def __init__(self) -> None:
        self.patches_info: Dict[str, Patch] = {}

    def register_patch(self, orig_func_name: str, new_func: Optional[Callable[..., Any]] = None,
                       force_patch: bool = False, create_dummy: bool = False) -> None:
        patch = self.patches_info.get(orig_func_name)
        if patch is None:
            patch = self.patches_info[orig_func_name] = Patch(orig_func_name, create_dummy)
        patch.add(new_func, force_patch)

    def apply_patches(self) -> None:
        for patch in self.patches_info.values():
            patch.apply()

    def remove_wrappers(self, orig_func_name: str, wrappers_name: Union[str, List[str], None] = None,
                        remove_check: bool = True) -> None:
        if orig_func_name not in self.patches_info:
            raise ValueError(f"no patch registered for {orig_func_name}")
        patch = self.patches_info[orig_func_name]
        names = [wrappers_name] if isinstance(wrappers_name, str) else wrappers_name
        before = len(patch.wrappers)
        patch.wrappers = [] if names is None else [w for w in patch.wrappers if w.__name__ not in names]
        if remove_check and len(patch.wrappers) == before:
            raise RuntimeError(f"remove_wrappers({orig_func_name!r}, {wrappers_name!r}) removed nothing")
        if patch.applied is not None:
            patch.remove()

    def remove_patches(self) -> None:
        for patch in self.patches_info.values():
            patch.remove()
        self.patches_info.clear()

_REGISTRY = PatchRegistry()


def get_patch_manager() -> PatchRegistry:
    """This process's ASP registry (one per process; never MindSpeed's class-global table, see the module doc)."""
    return _REGISTRY


# ---------------------------------------------------------------------------- liveness
_MISSING = object()


def current_value(target: str) -> Any:
    """What `target` holds now, re-resolved from `sys.modules` (a class's own `__dict__` entry, so a method
    deleted from the class, or a class redefined by a reload, does not read as the patched one)."""
    owner, attr, value = resolve_target(target)
    if isinstance(owner, type):
        return owner.__dict__.get(attr, _MISSING)
    return value


def _inner(obj: Any) -> Iterable[Any]:
    """Objects a callable delegates to: `__func__`, `__wrapped__` and callables in its closure."""
    for name in ("__func__", "__wrapped__"):
        inner = getattr(obj, name, None) if not isinstance(obj, type) else None
        if inner is not None:
            yield inner
    for cell in getattr(obj, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # empty cell
            continue
        if callable(value):
            yield value


def still_holds(current: Any, installed: Any, depth: int = 8) -> bool:
    """`current` is the object ASP installed, or a wrapper that reaches it (MindSpeed stacked on top)."""
    if current is installed:
        return True
    if depth <= 0 or current is _MISSING:
        return False
    return any(still_holds(nxt, installed, depth - 1) for nxt in _inner(current))


def reverted_targets(installed: Mapping[str, Any]) -> Dict[str, str]:
    """target -> what it holds instead, for every target that no longer holds what ASP installed."""
    out: Dict[str, str] = {}
    for target, obj in installed.items():
        try:
            now = current_value(target)
        except (ImportError, AttributeError) as exc:
            out[target] = f"unresolvable ({exc})"
            continue
        if not still_holds(now, obj):
            out[target] = "nothing" if now is _MISSING else _describe(now)
    return out


def _describe(obj: Any) -> str:
    fn = getattr(obj, "__func__", obj)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def check_patches_live(installed: Mapping[str, Any], after: str) -> int:
    """Refuse to go on when anything reverted ASP's patches; return how many are live.

    Why: a revert is silent (MindSpeed's repatch flow, a reload): the update would run stock code without the
    importance correction and nothing would say so.
    """
    bad = reverted_targets(installed)
    if bad:
        detail = "; ".join(f"{t} now holds {what}" for t, what in sorted(bad.items()))
        raise RunError(f"mindspeed-asp: {len(bad)} of {len(installed)} patches were reverted after {after} "
                       f"(pid {os.getpid()}): {detail}. Something in this process re-patched them (e.g. "
                       "MindSpeed's remove_patches() + apply_patches()); refusing to train with stock code")
    return len(installed)
