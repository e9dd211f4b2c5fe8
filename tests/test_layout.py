"""The test tree's layout: every folder is a package, and helpers are imported by module name.

Test modules import shared helpers as `tests.support.…` (or `tests.<folder>.…` for one folder's own), so a
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
    assert offenders == [], f"import helpers from tests.support instead of conftest: {offenders}"
