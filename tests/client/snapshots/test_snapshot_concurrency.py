"""Concurrent first use of a cache by real processes, a builder killed with SIGKILL, and lock timeouts."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

lance = pytest.importorskip("lance")

from harness.shards import make_tar_shard  # noqa: E402
from shardcache import Dataset, RuntimeContext  # noqa: E402
from shardcache.errors import CacheError  # noqa: E402
from shardcache.pipeline.build import build  # noqa: E402
from shardcache.snapshots import cache_ls, materialise, read_rows  # noqa: E402
from shardcache.snapshots.identity import plan_fingerprint  # noqa: E402
from shardcache.snapshots.store import EntryPaths  # noqa: E402
from tests.client.snapshots import cache_helpers  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def tars(tmp_path: Path) -> tuple[str, list[str]]:
    directory = tmp_path / "tars"
    directory.mkdir()
    keys = []
    for i in range(4):
        keys += make_tar_shard(directory / f"shard_{i:06d}.tar", i, samples=9)
    return str(directory / "shard_{000000..000003}.tar"), keys


def start_rank(
    tars: str,
    cache_dir: Path,
    dp: tuple[int, int],
    tp: tuple[int, int],
    out: Path,
    maps: str,
    env: dict[str, str],
) -> subprocess.Popen[bytes]:
    args = [str(a) for a in (tars, cache_dir, dp[0], dp[1], tp[0], tp[1], out, maps)]
    command = [sys.executable, "-m", "tests.client.workers.cache_worker", *args]
    return subprocess.Popen(command, cwd=REPO, env={**os.environ, **env})


def test_two_dp_ranks_with_tp_two_compute_and_write_each_row_once(
    tmp_path: Path, tars: tuple[str, list[str]]
) -> None:
    pattern, keys = tars
    log = tmp_path / "calls.log"
    procs = {
        (dp, tp): start_rank(
            pattern,
            tmp_path / "cache",
            (dp, 2),
            (tp, 2),
            tmp_path / f"out-{dp}-{tp}.json",
            "log_call",
            {"CACHE_TEST_LOG": str(log)},
        )
        for dp in range(2)
        for tp in range(2)
    }
    assert all(proc.wait(timeout=120) == 0 for proc in procs.values())
    computed = collections.Counter(log.read_text().split())
    assert sorted(computed) == sorted(keys) and set(computed.values()) == {1}
    [entry] = cache_ls(tmp_path / "cache")
    written = [row["__key__"] for row in read_rows(entry.path + "/dataset/data.lance")]
    assert sorted(written) == sorted(keys)
    got = {rank: json.loads((tmp_path / f"out-{rank[0]}-{rank[1]}.json").read_text()) for rank in procs}
    assert got[0, 0] == got[0, 1] and got[1, 0] == got[1, 1]  # TP co-members read identical data
    assert not set(got[0, 0]) & set(got[1, 0]) and sorted(got[0, 0] + got[1, 0]) == sorted(keys)


def test_a_builder_killed_half_way_leaves_nothing_complete_and_a_retry_completes(
    tmp_path: Path, tars: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    pattern, keys = tars
    ready = tmp_path / "ready"
    env = {"CACHE_TEST_BLOCK_KEY": keys[30], "CACHE_TEST_READY": str(ready)}
    proc = start_rank(pattern, tmp_path / "cache", (0, 1), (0, 1), tmp_path / "out.json", "block_at_key", env)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None, "the builder exited before reaching the blocking sample"
        assert time.monotonic() < deadline, "the builder never reached the blocking sample"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)

    [entry] = cache_ls(tmp_path / "cache")
    assert not entry.complete and entry.rows is None
    assert list((Path(entry.path) / "tmp").iterdir())  # the half-written build is there, unpublished
    assert not (Path(entry.path) / "dataset").exists()

    monkeypatch.delenv("CACHE_TEST_BLOCK_KEY", raising=False)
    retried = Dataset.from_source("tars", pattern, daemon=None).map(cache_helpers.block_at_key)
    retried = retried.cache(
        cache_dir=str(tmp_path / "cache"), cache_write_batch_size=2, max_rows_per_fragment=3
    )
    assert sorted(s["__key__"] for s in retried.iter_context(RuntimeContext())) == sorted(keys)
    [entry] = cache_ls(tmp_path / "cache")
    assert entry.complete and entry.rows == len(keys)
    assert not list((Path(entry.path) / "tmp").iterdir())


def test_a_process_waiting_for_a_busy_part_times_out_with_a_clear_error(
    tmp_path: Path, tars: tuple[str, list[str]]
) -> None:
    source = Dataset.from_source("tars", tars[0], daemon=None).map(cache_helpers.add_length)
    fingerprint, _ = plan_fingerprint(source.source, source.stages)
    with EntryPaths(tmp_path / "cache" / fingerprint).lock("part-1-0") as held:
        assert held.try_acquire()
        options = {"cache_dir": str(tmp_path / "cache"), "cache_timeout": 0.3}
        with pytest.raises(CacheError, match=r"timed out .* other processes are building.*cache_timeout"):
            materialise(source.spec, RuntimeContext(), options, build)
    assert len(list(read_rows(materialise(source.spec, RuntimeContext(), options, build)))) == len(tars[1])
