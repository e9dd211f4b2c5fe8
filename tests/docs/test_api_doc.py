"""docs/api.md is generated from the daemon's OpenAPI schema and must match it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Protocol, cast

from shardcache_protocol import ERROR_CODES

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen_api_docs.py"


class Generator(Protocol):
    """The parts of the generator script the tests use (it is loaded from its file, not imported)."""

    DOC: Path

    def render(self) -> str: ...

    def _schema(self) -> dict[str, Any]: ...

    def main(self, argv: list[str] | None = None) -> int: ...


def generator() -> Generator:
    spec = importlib.util.spec_from_file_location("gen_api_docs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return cast(Generator, module)


def test_committed_api_reference_equals_the_generated_one() -> None:
    committed = (ROOT / "docs" / "api.md").read_text()
    assert committed == generator().render(), "run: python scripts/gen_api_docs.py"


def test_every_route_and_error_code_is_in_the_reference() -> None:
    text = generator().render()
    schema = generator()._schema()
    for path, methods in schema["paths"].items():
        for method in methods:
            assert f"### `{method.upper()} {path}`" in text
    for code in ERROR_CODES:
        assert f"| `{code}` |" in text


def test_check_mode_reports_an_out_of_date_reference(tmp_path: Path) -> None:
    module = generator()
    module.DOC = tmp_path / "api.md"
    module.DOC.write_text("stale\n")
    assert module.main(["--check"]) == 1
    assert module.main([]) == 0
    assert module.main(["--check"]) == 0
