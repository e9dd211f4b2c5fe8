"""A shard the cache cannot hold (507) is read directly in `auto` mode, and explained in `required` mode."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from harness.shards import make_tar_shard
from shardcache import Dataset, RuntimeContext
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.errors import InsufficientCapacity

# Shards of about 0.7 MiB (two samples of 350 KiB) and 1.4 MiB under a 1 MiB cache.
SMALL, LARGE = 350 * 1024, 700 * 1024


@pytest.fixture
def shards(tmp_path: Path) -> list[str]:
    """Four shards; the second and the fourth are larger than the whole cache."""
    folder = tmp_path / "tars"
    folder.mkdir()
    paths = []
    for i in range(4):
        path = folder / f"shard_{i:06d}.tar"
        make_tar_shard(path, i, samples=2, payload_bytes=LARGE if i % 2 else SMALL)
        paths.append(str(path))
    return paths


def tiny_daemon(daemon_factory, shards: list[str], *extra: str):  # type: ignore[no-untyped-def]
    return daemon_factory(allow=[str(Path(shards[0]).parent)], capacity="1MiB", extra_args=list(extra))


def test_an_auto_dataset_reads_shards_larger_than_the_cache_directly(  # type: ignore[no-untyped-def]
    daemon_factory, shards: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    daemon = tiny_daemon(daemon_factory, shards)
    caplog.set_level(logging.WARNING, logger="shardcache")
    ctx = RuntimeContext(seed=1)
    through = Dataset.from_source("tars", shards, daemon=DaemonClient(daemon.socket), context=ctx)
    direct = Dataset.from_source("tars", shards, daemon=None, context=ctx)

    got = [s["__key__"] for s in through.iter_context()]

    assert got == [s["__key__"] for s in direct.iter_context()]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1  # two shards do not fit: one warning
    assert "507" in warnings[0] and "reading it" in warnings[0] and "docs/deploy.md" in warnings[0]


def test_a_required_client_explains_how_to_size_the_cache(daemon_factory, shards: list[str]) -> None:  # type: ignore[no-untyped-def]
    daemon = tiny_daemon(daemon_factory, shards)
    client = DaemonClient(daemon.socket, required=True)
    with pytest.raises(InsufficientCapacity) as caught:
        with client.open(shards[1]):
            pass
    message = str(caught.value)
    assert shards[1] in message
    assert "concurrent readers x largest shard x (prefetch depth + 1)" in message
    assert "docs/deploy.md" in message and 'daemon="auto"' in message


def test_an_auto_client_reads_directly_when_leases_hold_the_space_past_evict_wait(  # type: ignore[no-untyped-def]
    daemon_factory, shards: list[str]
) -> None:
    daemon = tiny_daemon(daemon_factory, shards, "--evict-wait-s", "0")
    client = DaemonClient(daemon.socket)
    with client.open(shards[0]) as held:  # 0.7 MiB of the 1 MiB leased until the block ends
        with client.open(shards[2]) as other:  # another 0.7 MiB cannot fit while the first is leased
            assert other.read() == Path(shards[2]).read_bytes()
        assert held.read() == Path(shards[0]).read_bytes()
    assert client.stats().misses == 1  # only the first went through the cache
