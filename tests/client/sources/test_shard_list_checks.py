"""A Dataset over many local paths checks a sample of them at build, not every path (issue 25): a wrong
folder or brace range still fails before anything is planned; a single missing shard among thousands fails
when it is read."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardcache import ConfigError
from shardcache.shards import expand_shards


def touch(folder: Path, count: int) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{i:05d}.tar" for i in range(count)]
    for path in paths:
        path.touch()
    return [str(p) for p in paths]


def test_a_missing_path_among_a_few_is_refused(tmp_path: Path) -> None:
    paths = touch(tmp_path, 10)
    paths[5] = str(tmp_path / "gone.tar")
    with pytest.raises(ConfigError, match=r"gone\.tar does not exist"):
        expand_shards(paths)


def test_a_long_list_in_a_wrong_folder_is_refused(tmp_path: Path) -> None:
    paths = [str(tmp_path / "nowhere" / f"{i:05d}.tar") for i in range(5000)]
    with pytest.raises(ConfigError, match=r"nowhere/00000\.tar does not exist"):
        expand_shards(paths)


def test_the_last_path_of_a_long_list_is_checked(tmp_path: Path) -> None:
    paths = touch(tmp_path, 3000)
    paths.append(str(tmp_path / "typo.tar"))
    with pytest.raises(ConfigError, match=r"typo\.tar does not exist"):
        expand_shards(paths)


def test_a_long_list_with_one_missing_path_between_the_checked_ones_builds(tmp_path: Path) -> None:
    paths = touch(tmp_path, 3000)
    paths[1001] = str(tmp_path / "gone.tar")  # 3000 paths: every third one is checked (0, 3, ...)
    assert [ref.url for ref in expand_shards(paths)] == paths
