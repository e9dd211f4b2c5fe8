"""One daemon per cache directory: a second daemon on the same --cache-dir exits, naming the holder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.daemon_api import api


def second_daemon(cache_dir: Path, socket: Path, allow: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "shardcached", "--cache-dir", str(cache_dir), "--socket", str(socket)]
    command += ["--capacity", "64MiB", "--metrics-addr", "127.0.0.1:0", "--allow", allow]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_a_second_daemon_on_the_same_cache_dir_exits_naming_the_directory_and_the_holders_pid(
    daemon_factory, local_shards, short_tmp: Path, tmp_path: Path
):
    cache = tmp_path / "cache"
    first = daemon_factory(allow=[str(local_shards.local_dir)], cache_dir=cache)
    with api(first) as http:
        grant = http.post("/v1/shards/open", json={"url": local_shards.local_paths[0]}).json()
    run = second_daemon(cache, short_tmp / "second.sock", str(local_shards.local_dir))
    assert run.returncode == 1
    # One error line and no traceback (the start-up's settings line comes before it, at INFO).
    errors = [line for line in run.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "Traceback" not in run.stderr, run.stderr
    assert str(cache) in errors[0] and f"pid {first.process.pid}" in errors[0]
    assert not (short_tmp / "second.sock").exists()
    assert first.healthy() and Path(grant["path"]).exists()  # the second one touched nothing


def test_the_lock_of_a_killed_daemon_does_not_block_its_restart(daemon_factory, local_shards, tmp_path: Path):
    cache = tmp_path / "cache"
    first = daemon_factory(allow=[str(local_shards.local_dir)], cache_dir=cache)
    first.kill()
    restarted = daemon_factory(allow=[str(local_shards.local_dir)], cache_dir=cache)
    assert restarted.healthy()
