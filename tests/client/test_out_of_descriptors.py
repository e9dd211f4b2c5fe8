"""A process out of file descriptors is told so, not sent to restart a daemon that is fine."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import os, resource, sys
    from shardcache import DaemonClient, OutOfFileDescriptors
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    client = DaemonClient(sys.argv[1], required=True)
    held = []
    try:
        while True:
            held.append(open(os.devnull))
    except OSError:
        pass
    try:
        client.stats()
    except OutOfFileDescriptors as exc:
        print("OUT", exc)
    except Exception as exc:
        print("OTHER", type(exc).__name__, exc)
    """
)


def test_running_out_of_descriptors_names_the_leak_not_the_daemon(daemon_factory, tmp_path: Path) -> None:
    daemon = daemon_factory(allow=[str(tmp_path)])
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(daemon.socket)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("OUT"), done.stdout + done.stderr
    assert "run out of file descriptors (limit 64)" in done.stdout
    assert "no shardcached daemon answers" not in done.stdout
    assert Path(daemon.socket).exists()
