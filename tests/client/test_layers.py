"""The client's layers, held: imports only go down, and no module imports itself back (docs/architecture.md).

From the top: entry (`shardcache/__init__.py`, `cli`), facades (`Dataset`, `TorchLoader`), pipeline (specs
and their features, iteration, resume states, the `.cache()` snapshots), nodes (sources, stages, the mix
iterators), daemon access, base (errors, context, shard lists, ...; and the wire contract
`shardcache_protocol`, which both programs own). Every module of `client/shardcache` is placed in one.

Imports are read statically with `ast`: at module level, inside functions and under TYPE_CHECKING alike (a
type-only import upward is still a dependency upward, and a type-only circle is still a circle a reader has
to untangle). Then each layer is loaded in a fresh interpreter, with the layers below it and nothing else:
there, importing any `shardcache.<module>` would first run `shardcache/__init__.py`, which imports the whole
client on purpose (its public names, and `shardcache.forksafe`'s rule that workers import nothing lazily),
so the check stands in a bare parent package that only gives the folder.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "client" / "shardcache"

# Top to bottom; a module belongs to the first layer with an entry that is its name or a package above it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("entry", ("shardcache.cli", "shardcache.lightning", "shardcache.transformers")),
    ("facades", ("shardcache.dataset", "shardcache.loader")),
    ("pipeline", ("shardcache.pipeline", "shardcache.resume", "shardcache.snapshots", "shardcache.spec")),
    ("nodes", ("shardcache.sources", "shardcache.stages", "shardcache.mix", "shardcache.images")),
    ("daemon access", ("shardcache.daemon_access",)),
    (
        "base",
        (
            "shardcache.buffer_shuffle",
            "shardcache.context",
            "shardcache.durable",
            "shardcache.envvars",
            "shardcache.epochs",
            "shardcache.errors",
            "shardcache.extras",
            "shardcache.forksafe",
            "shardcache.formatting",
            "shardcache.frameworks",
            "shardcache.jobs",
            "shardcache.log",
            "shardcache.memo",
            "shardcache.mesh",
            "shardcache.node",
            "shardcache.shards",
            "shardcache.topology",
            "shardcache_protocol",
        ),
    ),
]
RANK = {name: rank for rank, (name, _) in enumerate(LAYERS)}
# Third-party packages a user may not have installed (and the demo's modules, present in a clone only):
# the only imports that may sit inside a function, besides client modules that need one of them.
OPTIONAL = {
    "torch",
    "lance",
    "pyarrow",
    "s3fs",
    "zstandard",
    "trainer_demo",
    "PIL",
    "simplejpeg",
    "torchvision",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def client_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def layer_of(name: str) -> str | None:
    if name == "shardcache":
        return "entry"  # the package's __init__: the public names
    for layer, prefixes in LAYERS:
        if any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes):
            return layer
    return None


def is_submodule(name: str) -> bool:
    """Whether `name` is a module or package on disk (`from shardcache import forksafe` imports one)."""
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


@cache
def imports_of(module: str, *, executed: bool = False) -> tuple[tuple[str, bool], ...]:
    """Every module `module` imports, resolved to an absolute name, with whether it sits inside a function
    (`executed`: leave out the imports under TYPE_CHECKING, which never run).

    `from package import name` is an import of the submodule when `name` is one, else of the package.
    """
    path = client_modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if executed and is_type_checking(child):
                continue
            inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                found.extend((alias.name, inside) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    origin = ".".join([*base, *([child.module] if child.module else [])])
                else:
                    origin = child.module or ""
                for alias in child.names:
                    candidate = f"{origin}.{alias.name}"
                    submodule = origin.startswith("shardcache") and is_submodule(candidate)
                    found.append((candidate if submodule else origin, inside))
            visit(child, inside)

    visit(ast.parse(path.read_text(), filename=str(path)), False)
    return tuple(found)


def of_the_client(name: str) -> bool:
    return name == "shardcache" or name.startswith(("shardcache.", "shardcache_protocol"))


@cache
def needs_an_optional_package(module: str) -> bool:
    """Whether importing `module` imports an optional package (at its module level, or through such a
    client module): importing it inside a function is then how a feature stays optional."""
    return any(
        name.split(".")[0] in OPTIONAL or (name in client_modules() and needs_an_optional_package(name))
        for name, inside in imports_of(module, executed=True)
        if not inside
    )


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(name for name in client_modules() if layer_of(name) is None)
    assert unplaced == [], f"add these modules to a layer in LAYERS (and docs/architecture.md): {unplaced}"


def test_every_layer_has_modules() -> None:
    placed = {layer_of(name) for name in client_modules()}
    assert set(RANK) <= placed | {"base"}, sorted(set(RANK) - placed)


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = [
        f"{module} ({layer_of(module)}) imports {name} ({layer_of(name)})"
        for module in client_modules()
        for name, _ in imports_of(module)
        if of_the_client(name) and RANK[layer_of(name) or "base"] < RANK[layer_of(module) or "base"]
    ]
    assert upward == [], upward


def test_no_circle_of_imports_in_the_client() -> None:
    modules = client_modules()
    edges = {m: sorted({n for n, _ in imports_of(m) if n in modules and n != m}) for m in modules}
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(module: str) -> None:
        state[module] = 1
        path.append(module)
        for name in edges[module]:
            if state.get(name) == 1:
                circles.append([*path[path.index(name) :], name])
            elif name not in state:
                walk(name)
        path.pop()
        state[module] = 2

    for module in sorted(modules):
        if module not in state:
            walk(module)
    assert circles == [], [" -> ".join(circle) for circle in circles]


def test_no_import_inside_a_function_but_of_optional_packages() -> None:
    """An import inside a function hides a dependency (or a circle), and runs lazily in forked DataLoader
    workers, where a lazy import can deadlock (`shardcache.forksafe`)."""
    lazy = [
        f"{module} imports {name} inside a function"
        for module in client_modules()
        for name, inside in imports_of(module)
        if inside
        and name.split(".")[0] not in OPTIONAL
        and not (name in client_modules() and needs_an_optional_package(name))
    ]
    assert lazy == [], lazy


def test_the_optional_client_modules_are_the_lance_writers() -> None:
    """Client modules that import an optional package at import time: each is imported lazily by its
    users. A new one here means `import shardcache` may have started to need an extra."""
    optional = sorted(name for name in client_modules() if needs_an_optional_package(name))
    assert optional == [
        "shardcache.snapshots.build",
        "shardcache.snapshots.writer",
        "shardcache.sources.lance.codec",
    ]


LOAD = """
import importlib, json, sys, types
parent = types.ModuleType("shardcache")
parent.__path__ = [{package!r}]
sys.modules["shardcache"] = parent
for name in {modules!r}:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


@pytest.mark.parametrize("layer", ["base", "daemon access", "nodes", "pipeline"])
def test_loading_a_layer_loads_nothing_above_it_and_no_torch(layer: str) -> None:
    at_or_below = [
        name
        for name in client_modules()
        if name != "shardcache"
        and RANK[layer_of(name) or "base"] >= RANK[layer]
        and not needs_an_optional_package(name)
    ]
    code = LOAD.format(package=str(PACKAGE), modules=sorted(at_or_below))
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    loaded = set(json.loads(out))
    assert set(at_or_below) <= loaded
    above = sorted(
        name
        for name in loaded
        if name != "shardcache" and of_the_client(name) and RANK[layer_of(name) or "base"] < RANK[layer]
    )
    assert above == [], f"the {layer} layer loads modules above it: {above}"
    assert sorted(name for name in loaded if name.split(".")[0] in {"torch", "lance"}) == []


def folder_of(module: str) -> str:
    """The folder a module is in (its first package under shardcache), or the module itself at the top."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def test_folders_import_each_other_in_one_direction_only() -> None:
    """Within the client each folder is a unit a reader takes in at once: folders form a DAG too (the
    vocabulary every folder uses, `node` and `spec`, sits below them)."""
    modules = client_modules()
    edges: dict[str, set[str]] = {}
    for module in modules:
        for name, _ in imports_of(module):
            if name in modules and folder_of(name) != folder_of(module):
                edges.setdefault(folder_of(module), set()).add(folder_of(name))

    def reaches(start: str, goal: str) -> bool:
        seen, todo = {start}, [start]
        while todo:
            for folder in edges.get(todo.pop(), ()):
                if folder == goal:
                    return True
                if folder not in seen:
                    seen.add(folder)
                    todo.append(folder)
        return False

    # Two folders are knotted when each reaches the other (directly or through others).
    knots = sorted(sorted({a, b}) for a in edges for b in edges[a] if reaches(b, a))
    assert knots == [], f"folders importing each other (move the shared part below both): {knots}"
