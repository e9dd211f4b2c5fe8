"""Generate the summary table of docs/benchmarks.md from the headline rows of its sections and pages.

    python scripts/gen_bench_summary.py            # rewrite the table in docs/benchmarks.md
    python scripts/gen_bench_summary.py --check    # exit 1 if the committed table differs

Each benchmark states its headline figures once, in the section (or page under docs/benchmarks/) that holds
its output and analysis, between `<!-- headline -->` and `<!-- /headline -->`: a table of what, target,
baseline, measured and command. The summary at the top of docs/benchmarks.md (between `<!-- summary -->`
and `<!-- /summary -->`) is those rows, each with a link to where it came from: a figure changed in its
section changes in the summary, so the two cannot disagree (tests/docs/test_benchmark_docs.py).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
# The pages under docs/benchmarks/ in the summary's order (the main page's sections follow, in its order);
# a page not listed comes after them, by name.
PAGES = ("planner.md", "hit_path.md", "pipeline.md", "daemon_rss.md", "cache.md")
HEADLINE = re.compile(r"<!-- headline -->\n(?P<table>.*?)<!-- /headline -->", re.S)
SUMMARY = re.compile(r"(<!-- summary -->\n).*?(<!-- /summary -->)", re.S)
COLUMNS = "| what | target | baseline | measured | command |"
HEADER = "| what | target | baseline | measured | command | details |\n|---|---|---|---|---|---|\n"


@dataclass(frozen=True)
class Headline:
    """One headline row, the page it is on (relative to docs/) and the heading it sits under."""

    row: str
    page: str
    heading: str | None  # None: directly under the page's title

    def link(self) -> str:
        """Where the row comes from, as the summary's details cell."""
        if self.page == "benchmarks.md":
            assert self.heading is not None, "a headline of docs/benchmarks.md sits under a section"
            return f"[{self.heading}](#{anchor(self.heading)})"
        target = self.page if self.heading is None else f"{self.page}#{anchor(self.heading)}"
        return f"[{Path(self.page).name}]({target})"


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")


def headings(text: str) -> list[str]:
    """The Markdown heading lines of `text`, outside fenced code (where `#` starts a shell comment)."""
    found, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif line.startswith("#") and not fenced:
            found.append(line)
    return found


def headlines_of(text: str, page: str) -> list[Headline]:
    """The headline rows of one page, in order, each with the nearest section heading above it."""
    found = []
    for match in HEADLINE.finditer(text):
        table = match["table"].strip().splitlines()
        if table[:2] != [COLUMNS, "|---|---|---|---|---|"]:
            raise ValueError(f"{page}: a headline block must start with {COLUMNS!r} and its rule line")
        sections = [line for line in headings(text[: match.start()]) if not line.startswith("# ")]
        heading = sections[-1].lstrip("#").strip() if sections else None  # the title is the page itself
        found += [Headline(row, page, heading) for row in table[2:]]
    return found


def headlines(docs: Path = DOCS) -> list[Headline]:
    """Every headline row: the listed pages', the others', then the main page's."""
    folder = docs / "benchmarks"
    names = [*PAGES, *sorted(p.name for p in folder.glob("*.md") if p.name not in PAGES)]
    found = []
    for name in names:
        page = folder / name
        if page.exists():
            found += headlines_of(page.read_text(), f"benchmarks/{name}")
    return found + headlines_of((docs / "benchmarks.md").read_text(), "benchmarks.md")


def summary(docs: Path = DOCS) -> str:
    """The summary table."""
    rows = "".join(f"{h.row[:-1].rstrip()} | {h.link()} |\n" for h in headlines(docs))
    return HEADER + rows


def render(docs: Path = DOCS) -> str:
    """docs/benchmarks.md with its summary as the headlines are now."""
    text = (docs / "benchmarks.md").read_text()
    if SUMMARY.search(text) is None:
        raise ValueError("docs/benchmarks.md has no <!-- summary --> ... <!-- /summary --> block")
    return SUMMARY.sub(lambda m: f"{m.group(1)}{summary(docs)}{m.group(2)}", text)


def main(argv: list[str] | None = None, docs: Path = DOCS) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed table differs")
    args = parser.parse_args(argv)
    page = docs / "benchmarks.md"
    fresh = render(docs)
    if page.read_text() == fresh:
        return 0
    if args.check:
        print("docs/benchmarks.md: the summary differs from the headlines; run scripts/gen_bench_summary.py")
        return 1
    page.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
