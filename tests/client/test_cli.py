"""The `shardcache` command against the real daemon, run as a subprocess like a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ShardSet
from shardcache.daemon_client import DaemonClient


def shardcache(*args: str, socket: str | None = None) -> subprocess.CompletedProcess[str]:
    prefix = ["--socket", socket] if socket else []
    return subprocess.run(
        [sys.executable, "-m", "shardcache.cli", *prefix, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def daemon(daemon_factory, local_shards: ShardSet):
    return daemon_factory(allow=[str(local_shards.local_dir)])


def test_stats_prints_a_human_table(daemon) -> None:
    result = shardcache("stats", socket=daemon.socket)
    assert result.returncode == 0, result.stderr
    assert "hit ratio" in result.stdout
    assert "capacity" in result.stdout


def test_stats_json_holds_every_counter(daemon) -> None:
    result = shardcache("stats", "--json", socket=daemon.socket)
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert {"hits", "misses", "hit_ratio", "bytes_fetched", "capacity", "used"} <= stats.keys()


def test_warm_fetches_every_url_given(daemon, local_shards: ShardSet) -> None:
    result = shardcache("warm", *local_shards.local_paths[:3], socket=daemon.socket)
    assert result.returncode == 0, result.stderr
    assert "warmed 3 shards" in result.stderr
    with DaemonClient(daemon.socket, required=True) as client:
        stats = client.stats()
    assert (stats.resident_shards, stats.misses) == (3, 3)


def test_warm_reads_a_manifest(daemon, local_shards: ShardSet, tmp_path: Path) -> None:
    manifest = tmp_path / "shards.jsonl"
    rows = [{"url": p, "size": Path(p).stat().st_size} for p in local_shards.local_paths]
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = shardcache("warm", "--manifest", str(manifest), socket=daemon.socket)
    assert result.returncode == 0, result.stderr
    with DaemonClient(daemon.socket, required=True) as client:
        assert client.stats().resident_shards == len(rows)


def test_warm_without_urls_is_a_usage_error(daemon) -> None:
    result = shardcache("warm", socket=daemon.socket)
    assert result.returncode == 2
    assert "--manifest" in result.stderr


def test_ls_lists_resident_shards(daemon, local_shards: ShardSet) -> None:
    shardcache("warm", local_shards.local_paths[0], socket=daemon.socket)
    result = shardcache("ls", socket=daemon.socket)
    assert result.returncode == 0, result.stderr
    assert Path(local_shards.local_paths[0]).name in result.stdout
    assert "1 shards" in result.stdout


def test_ls_on_an_empty_cache_says_so(daemon) -> None:
    result = shardcache("ls", socket=daemon.socket)
    assert result.returncode == 0, result.stderr
    assert "no resident shards" in result.stdout


def test_evict_removes_the_shard(daemon, local_shards: ShardSet) -> None:
    url = local_shards.local_paths[0]
    shardcache("warm", url, socket=daemon.socket)
    result = shardcache("evict", url, socket=daemon.socket)
    assert result.returncode == 0, result.stderr
    with DaemonClient(daemon.socket, required=True) as client:
        assert client.stats().resident_shards == 0


def test_warm_outside_the_allow_list_fails_naming_the_url(daemon, tmp_path: Path) -> None:
    outside = tmp_path / "outside.tar"
    outside.write_bytes(b"x")
    result = shardcache("warm", "-q", str(outside), socket=daemon.socket)
    assert result.returncode == 1
    assert str(outside) in result.stderr
    assert "Traceback" not in result.stderr


def test_no_daemon_exits_1_with_a_one_line_message(short_tmp: Path) -> None:
    socket = str(short_tmp / "nobody.sock")
    result = shardcache("stats", socket=socket)
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert socket in result.stderr


def test_manifest_writes_one_line_per_shard(local_shards: ShardSet, tmp_path: Path) -> None:
    output = tmp_path / "out" / "manifest.jsonl"
    result = shardcache("manifest", f"{local_shards.local_dir}/*.tar", "-o", str(output))
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(Path(row["url"]).name for row in rows) == sorted(local_shards.names)
