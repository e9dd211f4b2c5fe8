"""docs/configuration.md is generated from the daemon's settings model and must match it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Protocol, cast

from shardcached.config import Settings

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen_config_docs.py"


class Generator(Protocol):
    """The parts of the generator script the tests use (it is loaded from its file, not imported)."""

    DOC: Path

    def render(self) -> str: ...

    def main(self, argv: list[str] | None = None) -> int: ...


def generator() -> Generator:
    spec = importlib.util.spec_from_file_location("gen_config_docs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return cast(Generator, module)


def test_committed_configuration_doc_equals_the_generated_one() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == generator().render(), "run: python scripts/gen_config_docs.py"


def test_every_setting_has_a_row_with_its_environment_variable() -> None:
    text = generator().render()
    for name in Settings.model_fields:
        assert f"| `{name}` |" in text
        assert f"`SHARDCACHE_{name.upper()}`" in text


def test_every_shardcached_flag_is_documented() -> None:
    help_text = subprocess.run(
        [sys.executable, "-m", "shardcached", "--help"], capture_output=True, text=True, check=True
    ).stdout
    flags = {word.rstrip(",") for word in help_text.split() if word.startswith("--") and word != "--help"}
    text = generator().render()
    for flag in flags - {"--version"}:
        assert f"`{flag}" in text, flag


def test_check_mode_reports_an_out_of_date_doc(tmp_path: Path) -> None:
    module = generator()
    module.DOC = tmp_path / "configuration.md"
    module.DOC.write_text("stale\n")
    assert module.main(["--check"]) == 1
    assert module.main([]) == 0
    assert module.main(["--check"]) == 0
