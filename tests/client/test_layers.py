"""The client's layers, held: imports only go down (docs/architecture.md).

Three parts are held so far, the lowest two layers and the mix package of the nodes layer:

- base: the modules in `BASE`, which import nothing of the client beyond base (and the wire contract,
  `shardcache_protocol`, which both programs own);
- daemon access, `shardcache.daemon_access`: base, itself and the wire contract; never a source, a stage, a
  `Dataset`, the loader or torch;
- `shardcache.mix` (nodes): the mix iterators and arithmetic import base and themselves only.

Both are read statically with `ast` (imports at module level, inside functions and under TYPE_CHECKING
alike: a type-only import upward is still a dependency upward), and then loaded in a fresh interpreter.
There, importing any `shardcache.<module>` would first run `shardcache/__init__.py`, which imports the whole
client on purpose (its public names, and `shardcache.forksafe`'s rule that workers import nothing lazily),
so the check stands in a bare parent package that only gives the folder: what loads is what the two layers
themselves pull in.

`shardcache.shards` is not base yet: it imports `shardcache.sources.compression` and
`shardcache.sources.tarfmt` (inside functions) to count samples.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "client" / "shardcache"

# The base layer: what every other layer may import. A module that imports upward is not base.
BASE = {
    "shardcache.context",
    "shardcache.envvars",
    "shardcache.errors",
    "shardcache.extras",
    "shardcache.forksafe",
    "shardcache.formatting",
    "shardcache.jobs",
    "shardcache.log",
    "shardcache.mesh",
}
DAEMON_ACCESS = "shardcache.daemon_access"
PROTOCOL = "shardcache_protocol"
# Packages a user may not have installed: the only imports that may sit inside a function.
OPTIONAL = {"torch", "lance", "pyarrow", "s3fs", "zstandard"}
# What must never load with the lower layers (and a sample of the pipeline's modules, named for the message).
NEVER = {"torch", "lance", "pyarrow", "shardcache.dataset", "shardcache.sources", "shardcache.stages"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def files_of(names: set[str]) -> dict[str, Path]:
    found = {module_name(p): p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    missing = sorted(names - set(found))
    assert missing == [], f"BASE names modules that do not exist: {missing}"
    return {name: found[name] for name in names}


def daemon_access_files() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((PACKAGE / "daemon_access").glob("*.py"))}


def mix_files() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((PACKAGE / "mix").glob("*.py"))}


def is_submodule(name: str) -> bool:
    """Whether `name` is a module or package on disk (`from shardcache import forksafe` imports one)."""
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imports_of(module: str, path: Path) -> list[tuple[str, bool]]:
    """Every module `path` imports, resolved to an absolute name, with whether it sits inside a function."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
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
                    # `from shardcache import forksafe` imports the module shardcache.forksafe.
                    submodule = origin.startswith("shardcache") and is_submodule(candidate)
                    found.append((candidate if submodule else origin, inside))
            visit(child, inside)

    visit(ast.parse(path.read_text(), filename=str(path)), False)
    return found


def of_the_client(name: str) -> bool:
    return name == "shardcache" or name.startswith("shardcache.")


def in_base(name: str) -> bool:
    return name in BASE or name == PROTOCOL or name.startswith(PROTOCOL + ".")


def in_daemon_access(name: str) -> bool:
    return name == DAEMON_ACCESS or name.startswith(DAEMON_ACCESS + ".")


def test_base_modules_import_nothing_of_the_client_beyond_base() -> None:
    upward = [
        f"{module} imports {name}"
        for module, path in sorted(files_of(BASE).items())
        for name, _ in imports_of(module, path)
        if of_the_client(name) and not in_base(name)
    ]
    assert upward == [], upward


def test_daemon_access_imports_only_base_and_itself() -> None:
    modules = daemon_access_files()
    assert len(modules) > 1, modules
    upward = [
        f"{module} imports {name}"
        for module, path in modules.items()
        for name, _ in imports_of(module, path)
        if of_the_client(name) and not (in_base(name) or in_daemon_access(name))
    ]
    assert upward == [], upward


def test_the_mix_package_imports_only_base_and_itself() -> None:
    modules = mix_files()
    assert len(modules) > 1, modules
    upward = [
        f"{module} imports {name}"
        for module, path in modules.items()
        for name, _ in imports_of(module, path)
        if of_the_client(name)
        and not (in_base(name) or name == "shardcache.mix" or name.startswith("shardcache.mix."))
    ]
    assert upward == [], upward


def test_no_import_inside_a_function_but_optional_packages() -> None:
    """An import inside a function hides a dependency (or a cycle) and runs lazily in forked workers."""
    modules = {**files_of(BASE), **daemon_access_files(), **mix_files()}
    lazy = [
        f"{module} imports {name} inside a function"
        for module, path in sorted(modules.items())
        for name, inside in imports_of(module, path)
        if inside and name.split(".")[0] not in OPTIONAL
    ]
    assert lazy == [], lazy


LOAD = """
import importlib, json, sys, types
parent = types.ModuleType("shardcache")
parent.__path__ = [{package!r}]
sys.modules["shardcache"] = parent
for name in {modules!r}:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


def test_loading_daemon_access_and_base_loads_no_pipeline_module_and_no_torch() -> None:
    modules = sorted([*BASE, *daemon_access_files()])
    code = LOAD.format(package=str(PACKAGE), modules=modules)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    loaded = set(json.loads(out))
    assert DAEMON_ACCESS + ".daemon_client" in loaded
    above = sorted(
        name
        for name in loaded
        if name != "shardcache" and of_the_client(name) and not (in_base(name) or in_daemon_access(name))
    )
    assert above == [], f"the lower layers load modules above them: {above}"
    assert sorted(loaded & NEVER) == []
