"""The test tree's layout: every folder is a package, and helpers are imported by module name.

Test modules import shared helpers as `harness.…` (or `tests.<folder>.…` for one folder's own), so a
folder without `__init__.py` or a `from conftest import …` would bring back imports that depend on which
folders pytest puts on `sys.path`.
"""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
BARE_IMPORT = re.compile(r"^\s*(?:from\s+conftest\s+import|import\s+conftest\b)", re.MULTILINE)


def test_every_test_folder_is_a_package() -> None:
    folders = {path.parent for path in TESTS.rglob("*.py") if "__pycache__" not in path.parts}
    missing = sorted(str(f.relative_to(TESTS.parent)) for f in folders if not (f / "__init__.py").exists())
    assert missing == [], f"add an empty __init__.py to: {missing}"


def test_no_module_imports_a_conftest() -> None:
    offenders = [
        str(path.relative_to(TESTS.parent))
        for path in sorted(TESTS.rglob("*.py"))
        if BARE_IMPORT.search(path.read_text())
    ]
    assert offenders == [], f"import helpers from harness instead of conftest: {offenders}"


CLIENT_PACKAGE = TESTS.parent / "client" / "shardcache"
# Folders of tests/client/ that are not a package of the client: the scripts its tests launch as processes.
CLIENT_TEST_SUPPORT = {"workers"}


def test_client_test_folders_mirror_the_client_packages() -> None:
    test_folders = {
        str(path.relative_to(TESTS / "client"))
        for path in (TESTS / "client").rglob("*")
        if path.is_dir() and path.name != "__pycache__"
    }
    strays = sorted(
        folder
        for folder in test_folders - CLIENT_TEST_SUPPORT
        if not (CLIENT_PACKAGE / folder / "__init__.py").exists()
    )
    assert strays == [], f"tests/client/<folder> must name a package of client/shardcache: {strays}"


def _imports_of(folder: Path, package: str) -> list[str]:
    pattern = re.compile(rf"^\s*(?:from|import)\s+{package}\b", re.MULTILINE)
    return [
        str(path.relative_to(TESTS.parent))
        for path in sorted(folder.rglob("*.py"))
        if pattern.search(path.read_text())
    ]


def test_benchmarks_do_not_import_tests() -> None:
    assert _imports_of(TESTS.parent / "bench", "tests") == [], (
        "move what bench needs from tests/ into harness/"
    )


def test_tests_import_bench_only_to_test_it() -> None:
    # tests/bench/ tests the benchmarks' own simulators; elsewhere a shared helper belongs in harness/.
    offenders = [path for path in _imports_of(TESTS, "bench") if not path.startswith("tests/bench/")]
    assert offenders == [], "move what tests need from bench/ into harness/"


def test_harness_imports_neither_tests_nor_bench() -> None:
    harness = TESTS.parent / "harness"
    assert _imports_of(harness, "tests") + _imports_of(harness, "bench") == []
