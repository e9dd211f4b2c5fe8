"""Pages show runnable examples as they are: every `<!-- include: PATH -->` block equals its file
(`scripts/include_examples.py`), and docs/frameworks.md shows every framework example tests/frameworks/
runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Protocol, cast

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "include_examples.py"


class Includer(Protocol):
    """The parts of the script the tests use (it is loaded from its file, not imported)."""

    def pages(self, root: Path = ...) -> list[Path]: ...

    def included(self, page: str) -> list[str]: ...

    def main(self, argv: list[str] | None = None, root: Path = ...) -> int: ...


def includer() -> Includer:
    spec = importlib.util.spec_from_file_location("include_examples", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return cast(Includer, module)


def test_every_included_block_equals_its_file() -> None:
    assert includer().main(["--check"]) == 0, "run: python scripts/include_examples.py"


def test_docs_frameworks_shows_every_framework_example() -> None:
    shown = set(includer().included((ROOT / "docs" / "frameworks.md").read_text()))
    examples = {str(path.relative_to(ROOT)) for path in (ROOT / "examples" / "frameworks").glob("*.py")}
    assert examples and examples <= shown, f"not shown in docs/frameworks.md: {sorted(examples - shown)}"


def test_every_included_file_exists() -> None:
    module = includer()
    for page in module.pages():
        for path in module.included(page.read_text()):
            assert (ROOT / path).is_file(), f"{page.relative_to(ROOT)} includes {path}, which does not exist"


def test_check_mode_reports_a_block_that_differs_from_its_file(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "example.py").write_text("print('now')\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text("<!-- include: example.py -->\n```python\nprint('before')\n```\n<!-- /include -->\n")
    (tmp_path / "README.md").write_text("no blocks\n")
    module = includer()
    assert module.main(["--check"], root=tmp_path) == 1
    assert module.main([], root=tmp_path) == 0
    assert module.main(["--check"], root=tmp_path) == 0
    assert "print('now')" in page.read_text()
