"""The trainer's last telemetry report reaches the daemon even when the script exits right after its loop.

The reporting thread is a daemon thread, killed at interpreter exit; the last report (handed to it when the
iteration ends) must be sent before that, within a bounded time, and an absent daemon must not hold the
exit up.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from harness.daemon_api import client_samples
from shardcache.daemon_access.telemetry import EXIT_FLUSH_S

SCRIPT = textwrap.dedent(
    """
    import sys
    from shardcache import Dataset

    socket, urls = sys.argv[1], sys.argv[2:]
    ds = Dataset.from_source("tars", urls, daemon=socket, job=f"exit-{socket[-8:]}")
    for epoch in range(2):
        ds.set_epoch(epoch)
        for sample in ds:
            pass
    # no close, no sleep: the interpreter exits here
    """
)


def _run(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_the_last_report_is_delivered_when_the_script_exits_right_after_its_loop(
    local_shards, daemon_factory, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    job = f"exit-{daemon.socket[-8:]}"
    for run in range(3):  # each run adds two epochs of 4 shards x 8 samples
        done = _run(script, daemon.socket, *local_shards.local_paths)
        assert done.returncode == 0, done.stderr
        samples = client_samples(daemon).get(("shardcache_client_samples_total", job, "0"))
        assert samples == (run + 1) * 2 * 32, f"run {run}: the daemon counted {samples} samples"


HUNG = textwrap.dedent(
    """
    import sys
    from shardcache import Telemetry

    telemetry = Telemetry(job="hung", socket=sys.argv[1], interval_s=0.05)
    for item in telemetry.watch(range(100)):
        pass
    """
)


def test_a_daemon_that_never_answers_does_not_hold_up_the_exit(short_tmp, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A socket that takes connections into its backlog and never answers: every report waits its timeout.
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hung.bind(str(short_tmp / "hung.sock"))
    hung.listen(64)
    script = tmp_path / "hung.py"
    script.write_text(HUNG)
    try:
        started = time.monotonic()
        done = _run(script, str(short_tmp / "hung.sock"))
        elapsed = time.monotonic() - started
    finally:
        hung.close()
    assert done.returncode == 0, done.stderr
    # The interpreter's start-up and imports take about a second here; the exit flush at most EXIT_FLUSH_S.
    assert elapsed < 1.0 + EXIT_FLUSH_S + 5.0, f"the exit took {elapsed:.1f}s"
