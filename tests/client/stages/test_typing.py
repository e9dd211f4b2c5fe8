"""Typing for users: `daemon=` is a typed union and `Node` is generic in its item type (checked by mypy)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardcache.node import Node

REPO = Path(__file__).resolve().parents[3]
# The client and the wire contract it imports (its own folder, shared with the daemon).
MYPYPATH = os.pathsep.join(str(REPO / folder) for folder in ("client", "protocol"))

SNIPPET = """
from shardcache import Dataset
from shardcache.node import Node

Dataset.from_source("tars", "x", daemon=3)
Dataset.from_source("tars", "x", daemon="required")
Dataset.from_source("tars", "x", daemon=None)

class Ints(Node[int]):
    pass

items: Node[int] = Ints()
wrong: str = next(items)
"""


@pytest.fixture(scope="module")
def mypy_output(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("typing")
    (root / "snippet.py").write_text(SNIPPET)
    config = root / "mypy.ini"
    config.write_text("[mypy]\nstrict = True\nfollow_imports = silent\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(config),
            "--cache-dir",
            str(root / ".mypy"),
            "snippet.py",
        ],
        cwd=root,
        env={"MYPYPATH": MYPYPATH, "PATH": ""},
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout


def test_a_wrong_daemon_setting_is_a_type_error(mypy_output: str) -> None:
    errors = [line for line in mypy_output.splitlines() if '"daemon"' in line]
    assert len(errors) == 1 and "snippet.py:5:" in errors[0], mypy_output


def test_node_items_carry_their_type(mypy_output: str) -> None:
    assert 'snippet.py:13: error: Incompatible types in assignment (expression has type "int"' in mypy_output


class Count(Node[int]):
    def gen(self) -> Iterator[int]:
        yield from range(3)


def test_a_typed_node_iterates_at_run_time() -> None:
    assert list(Count()) == [0, 1, 2]
