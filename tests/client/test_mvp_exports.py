"""mvp-dataset 0.2.3's exports that shardcache adds, and its environment variables honoured as aliases.

`Consumer`, `FingerprintProvider`, `CacheConfig`, `CacheEntryInfo`, `clear_cache`, `list_cache_entries`,
`reset_logger`, `reset_log_level`; `MVP_DATASET_CACHE_DIR`, `MVP_DATASET_CACHE_WAIT_TIMEOUT_SECONDS`,
`MVP_DATASET_TAR_KEY_DOT_LEVEL`, `MVP_DATASET_TAR_MAX_OPEN_FILES`.
"""

from __future__ import annotations

import io
import logging
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shardcache
from harness.shards import make_tar_shard
from shardcache import (
    CacheConfig,
    CacheEntryInfo,
    Consumer,
    Dataset,
    FingerprintProvider,
    RuntimeContext,
    clear_cache,
    list_cache_entries,
    reset_log_level,
    reset_logger,
)
from shardcache.errors import CacheError, ConfigError
from shardcache.sources.jsonl import TarRefResolver
from tests.client.snapshots import cache_helpers

MVP_NAMES = (
    "Consumer",
    "FingerprintProvider",
    "CacheConfig",
    "CacheEntryInfo",
    "clear_cache",
    "list_cache_entries",
    "reset_logger",
    "reset_log_level",
)

ALL_ENV = (
    "SHARDCACHE_CACHE_DIR",
    "MVP_DATASET_CACHE_DIR",
    "SHARDCACHE_CACHE_TIMEOUT",
    "MVP_DATASET_CACHE_WAIT_TIMEOUT_SECONDS",
    "MVP_DATASET_CACHE_FINGERPRINT_MODE",
    "LOADER_TAR_KEY_DOT_LEVEL",
    "MVP_DATASET_TAR_KEY_DOT_LEVEL",
    "LOADER_JSONL_TAR_CACHE_SIZE",
    "MVP_DATASET_TAR_MAX_OPEN_FILES",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ALL_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def shard(tmp_path: Path) -> str:
    make_tar_shard(tmp_path / "a.tar", 0, samples=5)
    return str(tmp_path / "a.tar")


def build_cache(shard: str, fn: Any, cache_dir: str | None = None) -> None:
    """Iterate `tars -> map(fn) -> .cache()` once, which materialises the entry."""
    dataset = Dataset.from_source("tars", shard, daemon=None).map(fn)
    cached = dataset.cache() if cache_dir is None else dataset.cache(cache_dir=cache_dir)
    list(cached.iter_context(RuntimeContext()))


def test_every_mvp_name_is_exported() -> None:
    for name in MVP_NAMES:
        assert name in shardcache.__all__, name
        assert getattr(shardcache, name) is not None


# Consumer, FingerprintProvider


class FirstKeys:
    """A Consumer: keeps the first `limit` keys, then stops the run."""

    def __init__(self, context: RuntimeContext, limit: int = 3) -> None:
        self.keys: list[str] = []
        self.limit = limit

    def push(self, item: Any) -> bool | None:
        self.keys.append(item["__key__"])
        return len(self.keys) < self.limit

    def finish(self) -> list[str]:
        return self.keys


def test_consumer_protocol_drives_consume(shard: str) -> None:
    def factory(context: RuntimeContext) -> Consumer:
        return FirstKeys(context)

    result = Dataset.from_source("tars", shard, daemon=None).consume(factory)
    assert result == ["s0000_00000", "s0000_00001", "s0000_00002"]


def test_fingerprint_provider_names_the_snapshot(shard: str, tmp_path: Path) -> None:
    pytest.importorskip("lance")
    provider: FingerprintProvider = lambda: "lengths-v1"  # noqa: E731
    root = str(tmp_path / "cache")
    source = Dataset.from_source("tars", shard, daemon=None)
    for fn in (cache_helpers.add_length, cache_helpers.add_digest):
        snap = source.map(fn).snapshot(fingerprint_provider=provider, cache_dir=root)
        list(snap.iter_context(RuntimeContext()))
    # The same provided string names one entry: the second pipeline reused the first one's.
    assert len(list_cache_entries(root)) == 1


# CacheEntryInfo, list_cache_entries, clear_cache


@pytest.fixture
def two_entries(shard: str, tmp_path: Path) -> Path:
    pytest.importorskip("lance")
    root = tmp_path / "cache"
    for fn in (cache_helpers.add_length, cache_helpers.add_digest):
        build_cache(shard, fn, str(root))
    return root


def test_list_cache_entries_reports_complete_builds(two_entries: Path) -> None:
    entries = list_cache_entries(two_entries)
    assert isinstance(entries, tuple) and len(entries) == 2
    for info in entries:
        assert isinstance(info, CacheEntryInfo)
        assert info.kind == "dataset-snapshot" and info.format_version >= 1
        assert info.source_fingerprint == info.artifact_fingerprint
        assert info.path == two_entries / info.artifact_fingerprint and info.path.is_dir()
        assert info.size_bytes > 0
    assert [e.artifact_fingerprint for e in entries] == sorted(e.artifact_fingerprint for e in entries)


def test_entries_in_progress_are_neither_listed_nor_cleared(two_entries: Path) -> None:
    building = two_entries / ("f" * 64)
    (building / "tmp").mkdir(parents=True)
    assert len(list_cache_entries(two_entries)) == 2
    assert clear_cache(two_entries) == 2
    assert list_cache_entries(two_entries) == () and building.is_dir()


def test_clear_cache_filters_by_fingerprint_and_kind(two_entries: Path) -> None:
    first, second = list_cache_entries(two_entries)
    assert clear_cache(two_entries, source_fingerprint=first.source_fingerprint) == 1
    assert list_cache_entries(two_entries) == (second,)
    assert not first.path.exists()
    assert clear_cache(two_entries, kind="jsonl-split") == 0
    assert clear_cache(two_entries, kind="dataset-snapshot") == 1
    assert list_cache_entries(two_entries) == ()
    assert clear_cache(two_entries) == 0


def test_listing_a_missing_root_is_empty(tmp_path: Path) -> None:
    assert list_cache_entries(tmp_path / "nowhere") == ()
    assert clear_cache(tmp_path / "nowhere") == 0


def test_clear_cache_refuses_an_entry_being_rebuilt(two_entries: Path) -> None:
    from shardcache.snapshots.store import EntryPaths

    info = list_cache_entries(two_entries)[0]
    with EntryPaths(info.path).lock("merge") as lock:
        assert lock.try_acquire()
        with pytest.raises(CacheError, match="being built"):
            clear_cache(two_entries, source_fingerprint=info.source_fingerprint)


# CacheConfig


def test_cache_config_resolves_what_cache_uses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    default = CacheConfig.resolve()
    assert default.root == tmp_path / ".cache"
    assert default.fingerprint_mode == "metadata" and default.wait_timeout_seconds == 6 * 3600
    assert CacheConfig.resolve("~/c").root == Path.home() / "c"
    assert CacheConfig(root=Path("rel")).root == tmp_path / "rel"


def test_cache_config_rejects_what_shardcache_cannot_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="size and modification time"):
        CacheConfig(root=tmp_path, fingerprint_mode="content")
    monkeypatch.setenv("MVP_DATASET_CACHE_FINGERPRINT_MODE", "content")
    with pytest.raises(ConfigError, match="fingerprint_mode='content'"):
        CacheConfig.resolve(tmp_path)
    with pytest.raises(ConfigError, match="wait_timeout_seconds"):
        CacheConfig(root=tmp_path, wait_timeout_seconds=0)


# The environment aliases


def test_mvp_cache_dir_is_the_default_root(
    shard: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("lance")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MVP_DATASET_CACHE_DIR", str(tmp_path / "mvp"))
    build_cache(shard, cache_helpers.add_length)
    assert CacheConfig.resolve().root == tmp_path / "mvp"
    (info,) = list_cache_entries()
    assert info.path.parent == tmp_path / "mvp"
    assert not (tmp_path / ".cache").exists()
    assert clear_cache() == 1


def test_ours_win_over_mvp_aliases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MVP_DATASET_CACHE_DIR", str(tmp_path / "mvp"))
    monkeypatch.setenv("SHARDCACHE_CACHE_DIR", str(tmp_path / "ours"))
    monkeypatch.setenv("MVP_DATASET_CACHE_WAIT_TIMEOUT_SECONDS", "60")
    monkeypatch.setenv("SHARDCACHE_CACHE_TIMEOUT", "120")
    config = CacheConfig.resolve()
    assert config.root == tmp_path / "ours" and config.wait_timeout_seconds == 120
    # An empty variable counts as unset.
    monkeypatch.setenv("SHARDCACHE_CACHE_DIR", "")
    assert CacheConfig.resolve().root == tmp_path / "mvp"


def test_mvp_wait_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardcache.snapshots.build import CacheOptions

    monkeypatch.setenv("MVP_DATASET_CACHE_WAIT_TIMEOUT_SECONDS", "10800")
    assert CacheConfig.resolve().wait_timeout_seconds == 10800
    assert CacheOptions().timeout_s() == 10800
    monkeypatch.setenv("MVP_DATASET_CACHE_WAIT_TIMEOUT_SECONDS", "soon")
    with pytest.raises(ConfigError, match="MVP_DATASET_CACHE_WAIT_TIMEOUT_SECONDS='soon'"):
        CacheConfig.resolve()


def write_dotted_tar(path: Path) -> None:
    """Two samples whose member names carry two dots before the field: `img.0001.seg.png`, ..."""
    with tarfile.open(path, "w") as tar:
        for stem in ("img.0001", "img.0002"):
            for field in ("seg.png", "txt"):
                data = f"{stem}/{field}".encode()
                info = tarfile.TarInfo(f"{stem}.{field}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def keys_and_fields(path: Path) -> list[tuple[str, list[str]]]:
    samples = Dataset.from_source("tars", str(path), daemon=None).iter_context(RuntimeContext())
    return [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in samples]


def test_mvp_tar_key_dot_level(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "dotted.tar"
    write_dotted_tar(path)
    assert keys_and_fields(path)[0][0] == "img"
    monkeypatch.setenv("MVP_DATASET_TAR_KEY_DOT_LEVEL", "2")
    assert keys_and_fields(path) == [("img.0001", ["seg.png", "txt"]), ("img.0002", ["seg.png", "txt"])]
    monkeypatch.setenv("LOADER_TAR_KEY_DOT_LEVEL", "1")
    assert keys_and_fields(path)[0][0] == "img"
    monkeypatch.delenv("LOADER_TAR_KEY_DOT_LEVEL")
    monkeypatch.setenv("MVP_DATASET_TAR_KEY_DOT_LEVEL", "0")
    with pytest.raises(ConfigError, match="MVP_DATASET_TAR_KEY_DOT_LEVEL='0'"):
        keys_and_fields(path)


def test_mvp_tar_max_open_files(monkeypatch: pytest.MonkeyPatch) -> None:
    assert TarRefResolver(None).capacity == 16  # type: ignore[arg-type]
    monkeypatch.setenv("MVP_DATASET_TAR_MAX_OPEN_FILES", "8")
    assert TarRefResolver(None).capacity == 8  # type: ignore[arg-type]
    monkeypatch.setenv("LOADER_JSONL_TAR_CACHE_SIZE", "4")
    assert TarRefResolver(None).capacity == 4  # type: ignore[arg-type]
    monkeypatch.delenv("LOADER_JSONL_TAR_CACHE_SIZE")
    monkeypatch.setenv("MVP_DATASET_TAR_MAX_OPEN_FILES", "many")
    with pytest.raises(ConfigError, match="MVP_DATASET_TAR_MAX_OPEN_FILES='many'"):
        TarRefResolver(None)  # type: ignore[arg-type]


# reset_logger, reset_log_level


class Recorder:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def debug(self, msg: str) -> None:
        self.lines.append(msg)

    info = warning = error = debug


@pytest.fixture
def package_logger() -> Iterator[logging.Logger]:
    package = logging.getLogger("shardcache")
    level = package.level
    yield package
    reset_logger()
    package.setLevel(level)


def test_reset_logger_restores_propagation(package_logger: logging.Logger) -> None:
    recorder = Recorder()
    shardcache.set_logger(recorder)
    assert shardcache.get_logger() is recorder and not package_logger.propagate
    reset_logger()
    assert shardcache.get_logger() is package_logger and package_logger.propagate
    logging.getLogger("shardcache.test").warning("after reset")
    assert recorder.lines == []


def test_reset_log_level_inherits_again(package_logger: logging.Logger) -> None:
    root_level = logging.getLogger().getEffectiveLevel()
    shardcache.set_log_level("10")
    assert shardcache.get_log_level() == logging.DEBUG
    reset_log_level()
    assert package_logger.level == logging.NOTSET
    assert shardcache.get_log_level() == root_level
