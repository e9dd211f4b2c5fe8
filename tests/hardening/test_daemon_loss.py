"""kill -9 of the daemon mid-epoch while two ranks with DataLoader workers read through it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.daemon_api import api
from harness.devservers import stop_process
from harness.polling import wait_for
from tests.hardening.cache_checks import assert_cache_intact, published_shards

READER = Path(__file__).with_name("rank_reader.py")


def start_rank(
    rank: int, urls_file: Path, out: Path, socket: str | None, pauses: list[int]
) -> subprocess.Popen[bytes]:
    args = [sys.executable, str(READER), "--urls", str(urls_file), "--rank", str(rank), "--out", str(out)]
    if socket:
        args += ["--socket", socket]
    for pause in pauses:
        args += ["--pause-at", str(pause)]
    return subprocess.Popen(args, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen[bytes], timeout: float = 120) -> str:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_process(proc)
        raise
    assert proc.returncode == 0, err.decode()[-3000:]
    return err.decode()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ranks_finish_the_epoch_with_the_same_samples_across_a_kill_and_restart(
    make_bucket, daemon_factory, tmp_path, short_tmp
):
    shards = make_bucket(count=32, samples=8, payload_bytes=8 * 1024)
    urls_file = tmp_path / "urls.json"
    urls_file.write_text(json.dumps(shards.s3_urls))
    expected = [start_rank(r, urls_file, tmp_path / f"direct{r}.txt", None, []) for r in range(2)]

    socket = str(short_tmp / "loss.sock")
    cache = tmp_path / "cache"
    allow = [f"s3://{shards.bucket}"]
    daemon = daemon_factory(allow=allow, socket_path=Path(socket), cache_dir=cache)
    outs = [tmp_path / f"rank{r}.txt" for r in range(2)]
    ranks = [start_rank(r, urls_file, outs[r], socket, [30, 70]) for r in range(2)]

    wait_for(lambda: all(Path(f"{o}.paused0").exists() for o in outs), "both ranks to reach sample 30", 120)
    daemon.kill()  # SIGKILL, mid-epoch, with shards leased and plans registered
    # Complete = meta and data both on disk: `finalize` writes the meta, then renames the data in, so a kill
    # between the two leaves a meta alone, which the restart rightly drops (it was never published).
    completed = {url: path for url, path in published_shards(cache).items() if path.exists()}
    assert completed, "nothing was cached before the kill"
    for out in outs:
        Path(f"{out}.go0").touch()  # the ranks go on without a daemon: direct reads

    wait_for(lambda: all(Path(f"{o}.paused1").exists() for o in outs), "both ranks to reach sample 70", 120)
    again = daemon_factory(
        allow=allow, socket_path=Path(socket), cache_dir=cache
    )  # the supervisor restarts it
    with api(again) as http:
        resident = {s["url"] for s in http.get("/v1/shards").json()["shards"]}
    assert set(completed) <= resident, "the restart lost shards that were complete before the kill"
    for out in outs:
        Path(f"{out}.go1").touch()

    logs = [finish(proc) for proc in ranks]
    for proc in expected:
        finish(proc)
    for r in range(2):
        got = outs[r].read_text().splitlines()
        assert got == (tmp_path / f"direct{r}.txt").read_text().splitlines()
        assert len(got) == 128
    assert any("reading shards directly" in log for log in logs), "no rank fell back to direct reads"
    with api(again) as http:
        stats = http.get("/v1/stats").json()
    assert stats["hits"] + stats["misses"] > 0, "no rank came back to the restarted daemon"
    originals = dict(zip(shards.s3_urls, map(Path, shards.local_paths), strict=True))
    assert_cache_intact(cache, originals)
