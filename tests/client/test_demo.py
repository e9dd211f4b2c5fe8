"""The demo end to end, small: S3 endpoint, daemon, every shard read twice, everything stopped after."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from shardcache.devservers import free_tcp_port


def run_demo(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardcache.demo", "--shards", "3", "--shard-mb", "0.5", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, "SHARDCACHE_SOCKET": str(cwd / "unused.sock")},
    )


def test_demo_reads_every_shard_twice_missing_once_and_hitting_once(tmp_path: Path) -> None:
    # The preferred metrics port is taken, as a second demo or a running daemon would do: the demo moves on.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = run_demo(tmp_path, "--metrics-port", str(taken.getsockname()[1]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "hits: 3, misses: 3" in result.stdout
    fetched = re.search(r"bytes fetched from S3: .* \((\d+\.\d+)x\)", result.stdout)
    assert fetched is not None and fetched.group(1) == "1.00"
    assert (tmp_path / ".shardcache").is_dir()


def test_demo_starts_from_misses_again_over_a_kept_cache(tmp_path: Path) -> None:
    port = str(free_tcp_port())
    assert run_demo(tmp_path, "--metrics-port", port, "--shards", "1").returncode == 0
    result = run_demo(tmp_path, "--metrics-port", port, "--shards", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "hits: 1, misses: 1" in result.stdout


def test_demo_via_the_cli_rejects_bad_sizes(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "shardcache.cli", "demo", "--shards", "0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--shards" in result.stderr
