"""A process out of file descriptors is told so, not sent to restart a daemon that is fine, and the
telemetry adds no error of its own to the process's."""

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


ABANDONING = textwrap.dedent(
    """
    import os, sys, warnings
    from shardcache import Dataset
    warnings.simplefilter("ignore")  # "iter() called while a previous iterator is still active"
    ds = Dataset.from_source("tars", sys.argv[2:], daemon=sys.argv[1])
    before = peak = len(os.listdir("/proc/self/fd"))
    for _ in range(600):
        it = iter(ds)
        next(it)  # a shard opened through the daemon, then the iterator is dropped mid-shard
        peak = max(peak, len(os.listdir("/proc/self/fd")))
    print(before, peak)
    """
)


def test_iterators_abandoned_mid_shard_close_their_files(daemon_factory, local_shards) -> None:  # type: ignore[no-untyped-def]
    # A notebook or an eval loop that breaks out of `for sample in ds` leaves the iterator to the garbage
    # collector: its open shard (and lease) must go with it, or ~250 of them exhaust 1,024 descriptors
    # (about 4 each). A source sits in a reference cycle (node -> generator -> frame -> node): the shard and
    # the daemon connection are closed by the iterator's finalizer, not left to the cyclic collector (with
    # the connection left to it, 600 abandoned iterators held ~90 descriptors at once).
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    done = subprocess.run(
        [sys.executable, "-c", ABANDONING, daemon.socket, *local_shards.local_paths],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    before, peak = map(int, done.stdout.split())
    assert peak - before <= 8, f"{peak - before} descriptors held at once by 600 abandoned iterators"


LEAKING_TO_THE_END = textwrap.dedent(
    """
    import os, resource, sys
    from shardcache import Dataset
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    ds = Dataset.from_source("tars", sys.argv[2:], daemon=sys.argv[1], job="out-of-descriptors")
    it = iter(ds)
    next(it)  # read through the daemon: the telemetry has figures left to report at exit
    held = []
    while True:
        held.append(open(os.devnull))  # the script's own leak ends it
    """
)


def test_a_script_dying_of_a_descriptor_leak_ends_with_its_own_error_alone(  # type: ignore[no-untyped-def]
    daemon_factory, local_shards
) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    done = subprocess.run(
        [sys.executable, "-c", LEAKING_TO_THE_END, daemon.socket, *local_shards.local_paths],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr  # an uncaught exception's status
    assert done.stderr.count("Traceback") == 1, done.stderr  # none from the telemetry's flush at exit
    assert done.stderr.rstrip().endswith("OSError: [Errno 24] Too many open files: '/dev/null'"), done.stderr


FLUSHING_WITHOUT_DESCRIPTORS = textwrap.dedent(
    """
    import os, resource, sys
    from shardcache import Telemetry
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    telemetry = Telemetry(job="no-descriptors", socket=sys.argv[1], interval_s=0)
    list(telemetry.watch(range(3)))
    held = []
    try:
        while True:
            held.append(open(os.devnull))
    except OSError:
        pass
    print("sent" if telemetry.flush() else "dropped")
    """
)


def test_a_report_with_no_descriptor_left_to_send_it_is_dropped_not_raised(  # type: ignore[no-untyped-def]
    daemon_factory, tmp_path: Path
) -> None:
    daemon = daemon_factory(allow=[str(tmp_path)])
    done = subprocess.run(
        [sys.executable, "-c", FLUSHING_WITHOUT_DESCRIPTORS, daemon.socket],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "dropped\n", done.stdout + done.stderr
    assert done.stderr == ""
