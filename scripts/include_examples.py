"""Copy runnable examples into the docs that show them, so a page never shows code that does not run.

    python scripts/include_examples.py            # rewrite every block in README.md and docs/*.md
    python scripts/include_examples.py --check    # exit 1 if a block differs from its file

A page shows a file between two markers; everything between them is replaced by the file, fenced:

    <!-- include: examples/frameworks/lightning_fit.py -->
    ...
    <!-- /include -->

The tests (`tests/docs/test_included_examples.py`) run the examples and check that every block equals its
file, so what a page shows is what the tests ran.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- include: (?P<path>[^ ]+) -->\n)(?P<body>.*?)(<!-- /include -->)", re.S)
FENCES = {".py": "python", ".sh": "bash", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml"}


def pages(root: Path = ROOT) -> list[Path]:
    """The pages that may include examples: the README and every page under docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def fenced(path: Path, root: Path = ROOT) -> str:
    """The file at `path` (relative to `root`) as a fenced code block."""
    text = (root / path).read_text()
    return f"```{FENCES.get(path.suffix, '')}\n{text}{'' if text.endswith(chr(10)) else chr(10)}```\n"


def included(page: str) -> list[str]:
    """The files a page's blocks include, in order."""
    return [match["path"] for match in BLOCK.finditer(page)]


def render(page: str, root: Path = ROOT) -> str:
    """`page` with every block holding its file as it is now."""
    return BLOCK.sub(lambda m: f"{m.group(1)}{fenced(Path(m['path']), root)}{m.group(4)}", page)


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a block differs from its file")
    args = parser.parse_args(argv)
    stale = []
    for page in pages(root):
        text = page.read_text()
        fresh = render(text, root)
        if fresh == text:
            continue
        stale.append(page)
        if not args.check:
            page.write_text(fresh)
    for page in stale:
        verb = "differs from its examples" if args.check else "rewritten"
        print(f"{page.relative_to(root)}: {verb}", file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
