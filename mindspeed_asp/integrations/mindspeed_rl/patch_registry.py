"""A patch registry with MindSpeed's semantics, so ASP's patches compose with MindSpeed's own.

`register_patch('pkg.mod.Class.method', fn)` records a patch; nothing changes until `apply_patches()`.
A function whose name ends in `wrapper` or `decorator` is stacked around the original (several allowed, in
registration order); any other function replaces it (a second replacement raises unless `force_patch`).
Applying also rebinds every `from x import f` copy already imported (any module attribute that *is* the
original object), and `remove_patches()` undoes all of it.

When `mindspeed` is importable (it is copied into MindSpeed-RL's root on Ascend nodes), `get_patch_manager()`
returns `mindspeed.patch_utils.MindSpeedPatchesManager` itself, so ASP's patches live in the same table as
MindSpeed's features; otherwise the `PatchRegistry` below, which follows the same rules.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

_WRAPPER_SUFFIXES = ("wrapper", "decorator")


def _is_wrapper(fn: Any) -> bool:
    return getattr(fn, "__name__", "").endswith(_WRAPPER_SUFFIXES)


def _missing(name: str) -> Callable[..., Any]:
    def dummy_function(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"function {name} does not exist (installed by register_patch with new_func=None)")
    return dummy_function


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
            if exc.name is not None and not name.startswith(exc.name) and exc.name != name:
                raise  # the module exists but one of its own imports is missing: say so, do not hide it
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
                except Exception:  # lazy modules may raise on getattr
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

    def is_applied(self, orig_func_name: str) -> bool:
        p = self.patches_info.get(orig_func_name)
        return p is not None and p.applied is not None


_FALLBACK = PatchRegistry()


def get_patch_manager(prefer_mindspeed: bool = True) -> Any:
    """MindSpeed's `MindSpeedPatchesManager` when importable (cheap: stdlib imports only), else ours."""
    if prefer_mindspeed:
        try:
            from mindspeed.patch_utils import MindSpeedPatchesManager  # type: ignore
            return MindSpeedPatchesManager
        except ImportError:
            pass
    return _FALLBACK
