"""`shardcache cache ls | rm`: list entries with fingerprints and sizes, remove one, a prefix, or all."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

lance = pytest.importorskip("lance")

from harness.shards import make_tar_shard  # noqa: E402
from shardcache import Dataset, RuntimeContext  # noqa: E402
from shardcache.errors import CacheError  # noqa: E402
from shardcache.snapshots import cache_ls, cache_rm  # noqa: E402
from shardcache.snapshots.cli import main  # noqa: E402
from shardcache.snapshots.store import EntryPaths  # noqa: E402
from tests.client.snapshots import cache_helpers  # noqa: E402


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    """A cache root with two complete entries."""
    make_tar_shard(tmp_path / "a.tar", 0, samples=5)
    source = Dataset.from_source("tars", str(tmp_path / "a.tar"), daemon=None)
    for fn in (cache_helpers.add_length, cache_helpers.add_digest):
        list(source.map(fn).cache(cache_dir=str(tmp_path / "cache")).iter_context(RuntimeContext()))
    return tmp_path / "cache"


def test_ls_lists_fingerprint_state_rows_size_and_pipeline(
    cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ls", "--cache-dir", str(cache_dir)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["FINGERPRINT", "STATE", "ROWS", "SIZE", "CREATED", "PIPELINE"]
    assert len(out) == 3
    for line, entry in zip(out[1:], cache_ls(cache_dir), strict=True):
        assert line.startswith(entry.fingerprint) and " complete " in line and " 5 " in line
        assert f"tars -> map({cache_helpers.__name__}.add_" in line


def test_ls_json_gives_sizes_in_bytes(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls", "--json", "--cache-dir", str(cache_dir)]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert [e["rows"] for e in entries] == [5, 5]
    assert all(isinstance(e["size_bytes"], int) and e["size_bytes"] > 0 for e in entries)


def test_rm_by_unique_prefix_removes_one_entry(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = (e.fingerprint for e in cache_ls(cache_dir))
    assert main(["rm", first[:8], "--cache-dir", str(cache_dir)]) == 0
    assert capsys.readouterr().out == f"removed {first}\n"
    assert [e.fingerprint for e in cache_ls(cache_dir)] == [second]


def test_rm_all_removes_every_entry(cache_dir: Path) -> None:
    assert len(cache_rm(cache_dir, "all")) == 2
    assert cache_ls(cache_dir) == [] and list(cache_dir.iterdir()) == []


def test_rm_of_an_unknown_fingerprint_fails_with_a_message(
    cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["rm", "zzzz", "--cache-dir", str(cache_dir)]) == 1
    assert "no cache entry 'zzzz'" in capsys.readouterr().err


def test_rm_refuses_an_entry_a_process_is_building(cache_dir: Path) -> None:
    entry = cache_ls(cache_dir)[0]
    with EntryPaths(Path(entry.path)).lock("part-1-0") as lock:
        assert lock.try_acquire()
        with pytest.raises(CacheError, match="being built"):
            cache_rm(cache_dir, entry.fingerprint)


def test_the_module_runs_as_a_command(cache_dir: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "shardcache.snapshots.cli", "ls", "--cache-dir", str(cache_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert len(out.stdout.splitlines()) == 3
