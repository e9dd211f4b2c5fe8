"""The `shardcache` command against the real daemon, run as a subprocess like a user would."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.devservers import Daemon, start_daemon
from harness.shards import ShardSet, make_tar_shard
from shardcache.daemon_access.daemon_client import DaemonClient


def shardcache(*args: str, socket: str | None = None) -> subprocess.CompletedProcess[str]:
    prefix = ["--socket", socket] if socket else []
    return subprocess.run(
        [sys.executable, "-m", "shardcache.cli", *prefix, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@dataclass
class Served:
    daemon: Daemon
    shards: list[str]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One daemon for the whole module (each test uses its own shards), so the CLI tests stay fast."""
    root = tmp_path_factory.mktemp("cli")
    source = root / "shards"
    source.mkdir()
    shards = []
    for i in range(12):
        make_tar_shard(source / f"cli_{i:02d}.tar", i, samples=4)
        shards.append(str(source / f"cli_{i:02d}.tar"))
    socket_dir = Path(tempfile.mkdtemp(prefix="sccli-", dir="/tmp"))
    daemon = start_daemon(socket_dir / "d.sock", root / "cache", [str(source)], log=root / "daemon.log")
    try:
        yield Served(daemon, shards)
    finally:
        daemon.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)


@pytest.fixture
def daemon(served: Served) -> Daemon:
    return served.daemon


def resident_names(daemon: Daemon) -> set[str]:
    with DaemonClient(daemon.socket, required=True) as client:
        return {Path(shard.url).name for shard in client.shards()}


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


def test_warm_fetches_every_url_given(served: Served) -> None:
    urls = served.shards[0:3]
    result = shardcache("warm", *urls, socket=served.daemon.socket)
    assert result.returncode == 0, result.stderr
    assert "warmed 3 shards" in result.stderr
    assert {Path(url).name for url in urls} <= resident_names(served.daemon)


def test_warm_expands_brace_ranges_and_globs_like_from_source(served: Served) -> None:
    folder = Path(served.shards[0]).parent
    result = shardcache(
        "warm", "-q", f"{folder}/cli_{{08..09}}.tar", f"{folder}/cli_1[01].tar", socket=served.daemon.socket
    )
    assert result.returncode == 0, result.stderr
    assert "warmed 4 shards" in result.stderr
    assert {f"cli_{i:02d}.tar" for i in range(8, 12)} <= resident_names(served.daemon)


def test_socket_is_accepted_after_the_command(daemon) -> None:
    result = shardcache("stats", "--socket", daemon.socket)
    assert result.returncode == 0, result.stderr
    assert "hit ratio" in result.stdout


def test_warm_reads_a_manifest(served: Served, tmp_path: Path) -> None:
    manifest = tmp_path / "shards.jsonl"
    urls = served.shards[3:5]
    rows = [{"url": p, "size": Path(p).stat().st_size} for p in urls]
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = shardcache("warm", "--manifest", str(manifest), socket=served.daemon.socket)
    assert result.returncode == 0, result.stderr
    assert {Path(url).name for url in urls} <= resident_names(served.daemon)


def test_warm_without_urls_is_a_usage_error(daemon) -> None:
    result = shardcache("warm", socket=daemon.socket)
    assert result.returncode == 2
    assert "--manifest" in result.stderr


def test_ls_lists_resident_shards(served: Served) -> None:
    shardcache("warm", served.shards[5], socket=served.daemon.socket)
    result = shardcache("ls", socket=served.daemon.socket)
    assert result.returncode == 0, result.stderr
    assert Path(served.shards[5]).name in result.stdout
    assert re.search(r"^\d+ shards, ", result.stdout, re.MULTILINE)


def test_ls_on_an_empty_cache_says_so(daemon_factory, local_shards: ShardSet) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    result = shardcache("ls", socket=daemon.socket)
    assert result.returncode == 0, result.stderr
    assert "no resident shards" in result.stdout


def test_evict_removes_the_shard(served: Served) -> None:
    url = served.shards[6]
    shardcache("warm", url, socket=served.daemon.socket)
    assert Path(url).name in resident_names(served.daemon)
    result = shardcache("evict", url, socket=served.daemon.socket)
    assert result.returncode == 0, result.stderr
    assert Path(url).name not in resident_names(served.daemon)


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
    assert "SHARDCACHE_SOCKET" in result.stderr and "daemon=None" not in result.stderr


def test_manifest_writes_one_line_per_shard(local_shards: ShardSet, tmp_path: Path) -> None:
    output = tmp_path / "out" / "manifest.jsonl"
    result = shardcache("manifest", f"{local_shards.local_dir}/*.tar", "-o", str(output))
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(Path(row["url"]).name for row in rows) == sorted(local_shards.names)


def test_cache_ls_runs_without_a_daemon(tmp_path: Path, short_tmp: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardcache.cli",
            "--socket",
            str(short_tmp / "none.sock"),
            "cache",
            "ls",
            "--json",
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_manifest_file_follows_the_umask(local_shards: ShardSet, tmp_path: Path) -> None:
    output = tmp_path / "manifest.jsonl"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardcache.cli",
            "manifest",
            f"{local_shards.local_dir}/*.tar",
            "-o",
            str(output),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=lambda: os.umask(0o022),  # the child's umask only
    )
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(output.stat().st_mode) == 0o644


def test_cache_ls_without_cache_dir_says_where_it_looked(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SHARDCACHE_CACHE_DIR"}
    result = subprocess.run(
        [sys.executable, "-m", "shardcache.cli", "cache", "ls"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"no cache entries in {tmp_path / '.cache'}" in result.stdout
    assert "--cache-dir" in result.stdout
