"""Stable fingerprints of Python callables and values, for cache invalidation across process restarts.

A function is identified by what decides its output: its bytecode and constants (not its file or line
numbers), defaults, closure values, and the module-level names its code refers to (values, and the code of
user functions and classes, recursively). Library code (the standard library, site-packages) is identified
by module, name and package version instead of being walked. Objects whose state cannot be seen cheaply are
identified by their type only; the docs say so, and `shardcache cache rm` clears such entries by hand.

Lambdas and functions or classes defined inside other functions (`is_local`) are fingerprinted the same way,
captured values included; `.cache()` takes their fingerprint when it is called (see
`shardcache.snapshots.identity.frozen_identities`), since what a closure captures often changes while it runs.
`check_stable_callable` still names them for callers that need an identity independent of captured state.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import struct
import sys
import types

import numpy as np

from shardcache.errors import ConfigError

_MAX_DEPTH = 8
_MAX_ITEMS = 10_000
_MAX_ARRAY_BYTES = 64 << 20
_SKIPPED_CLASS_ATTRS = frozenset({"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__"})


def _target(fn: object) -> object:
    while isinstance(fn, functools.partial):
        fn = fn.func
    target = fn.__func__ if isinstance(fn, types.MethodType) else fn
    return target if isinstance(target, types.FunctionType | type) else type(target)


def is_local(fn: object) -> bool:
    """Whether `fn` (or what a partial or bound method wraps) is a lambda or defined inside a function."""
    target = _target(fn)
    return getattr(target, "__name__", "") == "<lambda>" or "<locals>" in getattr(target, "__qualname__", "")


def check_stable_callable(fn: object, what: str) -> None:
    """Raise ConfigError when `fn` has no identity that survives a process restart.

    Args:
        fn: The stage's callable (a function, a partial, a bound method, a class or a callable object).
        what: How the error names the stage, e.g. "map(fn)".
    """
    target = _target(fn)
    name = getattr(target, "__name__", "")
    qualname = getattr(target, "__qualname__", "")
    if name == "<lambda>":
        raise ConfigError(
            f"{what} before .cache() is a lambda, whose identity is not stable across process restarts; "
            f"define it with `def` at module level"
        )
    if "<locals>" in qualname:
        raise ConfigError(
            f"{what} before .cache() is {qualname}, defined inside a function (a local closure), whose "
            f"identity is not stable across process restarts; define it at module level and pass what it "
            f"captures as arguments (functools.partial) instead"
        )


def _is_library(module_name: str) -> bool:
    top = module_name.split(".", 1)[0]
    if top in sys.stdlib_module_names or top == "builtins":
        return True
    module = sys.modules.get(module_name) or sys.modules.get(top)
    path = getattr(module, "__file__", None) or ""
    return "site-packages" in path or "dist-packages" in path


@functools.cache
def _package_version(top: str) -> str:
    try:
        return importlib.metadata.version(top)
    except importlib.metadata.PackageNotFoundError:
        return sys.version.split()[0] if top in sys.stdlib_module_names else "?"


class Fingerprinter:
    """Feeds a canonical encoding of values into a SHA-256; `hexdigest()` gives the fingerprint."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._walked: set[int] = set()

    def hexdigest(self, length: int = 24) -> str:
        """The fingerprint so far, as `length` hex digits."""
        return self._hash.hexdigest()[:length]

    def _emit(self, tag: str, data: bytes = b"") -> None:
        self._hash.update(tag.encode() + struct.pack("<Q", len(data)) + data)

    def add(self, value: object, depth: int = 0) -> None:
        """Feed one value: scalars and containers by content, callables by code, other objects by type."""
        if depth > _MAX_DEPTH:
            self._emit("deep", type(value).__qualname__.encode())
        elif value is None or isinstance(value, bool | int | float | complex | str | bytes):
            self._emit(type(value).__name__, repr(value).encode())
        elif isinstance(value, tuple | list):
            self._emit(type(value).__name__, str(len(value)).encode())
            for item in value[:_MAX_ITEMS]:
                self.add(item, depth + 1)
        elif isinstance(value, dict):
            self._emit("dict", str(len(value)).encode())
            for key, item in sorted(value.items(), key=lambda kv: repr(kv[0]))[:_MAX_ITEMS]:
                self.add(key, depth + 1)
                self.add(item, depth + 1)
        elif isinstance(value, set | frozenset):
            # Set order depends on PYTHONHASHSEED: sort the members' own fingerprints.
            self._emit("set", b"".join(sorted(_digest(item) for item in value)))
        elif isinstance(value, np.ndarray):
            self._array(value)
        elif isinstance(value, np.generic):
            self._emit("npscalar", value.dtype.str.encode() + value.tobytes())
        elif isinstance(value, functools.partial):
            self._emit("partial")
            self.add(value.func, depth + 1)
            self.add(value.args, depth + 1)
            self.add(value.keywords, depth + 1)
        elif isinstance(value, types.MethodType):
            self._emit("method")
            self.add(value.__func__, depth + 1)
            self.add(value.__self__, depth + 1)
        elif isinstance(value, types.FunctionType):
            self._function(value, depth)
        elif isinstance(value, type):
            self._class(value, depth)
        elif isinstance(value, types.ModuleType):
            self._module(value)
        elif isinstance(value, types.CodeType):
            self._code(value, depth)
        elif isinstance(value, types.BuiltinFunctionType | types.BuiltinMethodType):
            self._emit("builtin", f"{getattr(value, '__module__', '')}.{value.__qualname__}".encode())
        else:
            self._object(value, depth)

    def _array(self, array: np.ndarray) -> None:
        self._emit("ndarray", f"{array.dtype.str}{array.shape}".encode())
        if array.dtype.hasobject:
            self.add(array.tolist(), 1)
        elif array.nbytes <= _MAX_ARRAY_BYTES:
            self._emit("data", np.ascontiguousarray(array).tobytes())
        else:  # a huge constant: its head and tail stand in for it (cheap, and catches most edits)
            flat = array.reshape(-1)
            self._emit("head", flat[:4096].tobytes() + flat[-4096:].tobytes())

    def _once(self, obj: object, label: str) -> bool:
        # Recursive code (a function calling itself, two classes referring to each other) is walked once.
        if id(obj) in self._walked:
            self._emit("ref", label.encode())
            return False
        self._walked.add(id(obj))
        return True

    def _library(self, module_name: str, qualname: str) -> None:
        top = module_name.split(".", 1)[0]
        self._emit("lib", f"{module_name}:{qualname}@{_package_version(top)}".encode())

    def _function(self, fn: types.FunctionType, depth: int) -> None:
        module = fn.__module__ or ""
        label = f"{module}:{fn.__qualname__}"
        if _is_library(module):
            self._library(module, fn.__qualname__)
            return
        if not self._once(fn, label):
            return
        # The module's name is left out: one function is `__main__.f` in a script, `__mp_main__.f` in its
        # spawned workers, and `pkg.mod.f` or `mod.f` depending on sys.path; its code is what matters.
        self._emit("function", fn.__qualname__.encode())
        self._code(fn.__code__, depth)
        self.add(fn.__defaults__, depth + 1)
        self.add(fn.__kwdefaults__, depth + 1)
        cells = fn.__closure__ or ()
        self._emit("closure", str(len(cells)).encode())
        for cell in cells:
            try:
                self.add(cell.cell_contents, depth + 1)
            except ValueError:  # an empty cell: the name was never bound
                self._emit("empty")
        self._globals(fn, depth)

    def _globals(self, fn: types.FunctionType, depth: int) -> None:
        names = sorted(_referenced_names(fn.__code__))
        scope = fn.__globals__
        for name in names:
            if name in scope and not name.startswith("__"):
                self._emit("global", name.encode())
                self.add(scope[name], depth + 1)
        # Attributes read from user modules (`helpers.tokenize`) are part of the code's behaviour too.
        for name in names:
            module = scope.get(name)
            if isinstance(module, types.ModuleType) and not _is_library(module.__name__):
                for attr in names:
                    if attr in vars(module) and not attr.startswith("__"):
                        self._emit("attr", f"{name}.{attr}".encode())
                        self.add(vars(module)[attr], depth + 1)

    def _code(self, code: types.CodeType, depth: int) -> None:
        # Bytecode, names and constants decide behaviour; file names and line numbers do not.
        header = (
            code.co_name,
            code.co_argcount,
            code.co_posonlyargcount,
            code.co_kwonlyargcount,
            code.co_flags,
            code.co_names,
            code.co_varnames,
            code.co_freevars,
            code.co_cellvars,
        )
        self._emit("code", repr(header).encode() + code.co_code)
        for const in code.co_consts:
            self.add(const, depth + 1)

    def _class(self, cls: type, depth: int) -> None:
        label = f"{cls.__module__}:{cls.__qualname__}"
        if _is_library(cls.__module__):
            self._library(cls.__module__, cls.__qualname__)
            return
        if not self._once(cls, label):
            return
        self._emit("class", cls.__qualname__.encode())
        for base in cls.__bases__:
            self.add(base, depth + 1)
        for name in sorted(vars(cls)):
            if name in _SKIPPED_CLASS_ATTRS:
                continue
            attr = vars(cls)[name]
            if isinstance(attr, staticmethod | classmethod):
                attr = attr.__func__
            elif isinstance(attr, property):
                attr = (attr.fget, attr.fset, attr.fdel)
            self._emit("member", name.encode())
            self.add(attr, depth + 1)

    def _module(self, module: types.ModuleType) -> None:
        if _is_library(module.__name__):
            self._library(module.__name__, "")
        else:
            self._emit(
                "module", module.__name__.rsplit(".", 1)[-1].replace("__mp_main__", "__main__").encode()
            )

    def _object(self, value: object, depth: int) -> None:
        cls = type(value)
        self.add(cls, depth + 1)
        state = getattr(value, "__dict__", None)
        if isinstance(state, dict) and not _is_library(cls.__module__):
            self._emit("state")
            self.add(state, depth + 1)


def _referenced_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _referenced_names(const)
    return names


def _digest(value: object) -> bytes:
    fingerprinter = Fingerprinter()
    fingerprinter.add(value)
    return fingerprinter.hexdigest(64).encode()


def fingerprint_of(*values: object) -> str:
    """The fingerprint of `values` taken together (24 hex digits).

    >>> fingerprint_of("select", ("a", "b")) == fingerprint_of("select", ("a", "b"))
    True
    """
    fingerprinter = Fingerprinter()
    for value in values:
        fingerprinter.add(value)
    return fingerprinter.hexdigest()
