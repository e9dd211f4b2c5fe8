"""docs/benchmarks.md cannot drift: its summary is generated from the headline table each section and page
holds (`scripts/gen_bench_summary.py`), and every figure the README and the other pages quote in bold is
one of those pages' figures."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Protocol, cast

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SCRIPT = ROOT / "scripts" / "gen_bench_summary.py"
# A quoted figure: a bold span that starts with a number (a range, a ratio, a duration, a size).
FIGURE = re.compile(
    r"^[~≈+]?\d[\d.,]*(?:\s?[–-]\s?\d[\d.,]*)?\s?(?:×|x\b|%|ms\b|s\b|µs\b|ns\b|MB\b|GB\b|MiB\b|GiB\b|B\b)?"
)
# Pages whose bold figures are not benchmark results, with why.
NOT_MEASUREMENTS = {
    # The peer test suite's pass count: a test result, with the command that produced it on that page.
    "mvp-dataset.md",
}


class Summary(Protocol):
    """The parts of the generator script the tests use (it is loaded from its file, not imported)."""

    def headlines(self, docs: Path = ...) -> list[object]: ...

    def headlines_of(self, text: str, page: str) -> list[object]: ...

    def main(self, argv: list[str] | None = None, docs: Path = ...) -> int: ...


def generator() -> Summary:
    spec = importlib.util.spec_from_file_location("gen_bench_summary", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return cast(Summary, module)


def benchmark_text() -> str:
    return "\n".join(
        page.read_text() for page in [DOCS / "benchmarks.md", *(DOCS / "benchmarks").glob("*.md")]
    )


def test_the_benchmarks_summary_is_the_headlines_of_its_sections() -> None:
    assert generator().main(["--check"]) == 0, "run: python scripts/gen_bench_summary.py"


def test_every_benchmark_page_states_its_headline_figures() -> None:
    module = generator()
    for page in sorted((DOCS / "benchmarks").glob("*.md")):
        assert module.headlines_of(page.read_text(), page.name), (
            f"docs/benchmarks/{page.name} has no headline"
        )


def test_every_figure_the_readme_and_the_pages_quote_is_a_benchmarks() -> None:
    measured = benchmark_text()
    pages = [
        ROOT / "README.md",
        *(p for p in DOCS.glob("*.md") if p.name not in {"benchmarks.md", *NOT_MEASUREMENTS}),
    ]
    unknown = []
    for page in pages:
        for bold in re.findall(r"\*\*([^*]+)\*\*", page.read_text()):
            figure = FIGURE.match(bold.strip())
            if figure and figure.group(0).strip() and figure.group(0).strip() not in measured:
                unknown.append(f"{page.relative_to(ROOT)}: {bold!r}")
    assert not unknown, f"figures no benchmark page holds (measure them, or leave them out): {unknown}"


def test_check_mode_reports_a_summary_that_differs_from_its_headlines(tmp_path: Path) -> None:
    (tmp_path / "benchmarks").mkdir()
    headline = (
        "<!-- headline -->\n| what | target | baseline | measured | command |\n|---|---|---|---|---|\n"
        "| a thing | ≤ 1× | none | **0.5×** | `bench` |\n<!-- /headline -->\n"
    )
    (tmp_path / "benchmarks.md").write_text(
        f"# Benchmarks\n\n<!-- summary -->\nstale\n<!-- /summary -->\n\n## A section\n\n{headline}"
    )
    module = generator()
    assert module.main(["--check"], docs=tmp_path) == 1
    assert module.main([], docs=tmp_path) == 0
    assert module.main(["--check"], docs=tmp_path) == 0
    assert (
        "| a thing | ≤ 1× | none | **0.5×** | `bench` | [A section](#a-section) |"
        in (tmp_path / "benchmarks.md").read_text()
    )
