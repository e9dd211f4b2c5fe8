"""`--require-mount PATH`: the daemon starts only with its cache on the filesystem mounted at PATH.

Real mounts, made by each test in a mount namespace of its own (`unshare --mount --propagation private`, as
root), in which the real daemon then runs: a tmpfs standing for the cache disk, a directory of the root
filesystem bind-mounted where the disk should be (what a Kubernetes hostPath is while the host has not
mounted the disk), and a plain directory with nothing mounted on it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.devservers import Daemon
from harness.tools import require_tool, unavailable
from shardcached.mounts import check_required_mount, parse_mountinfo

MOUNTINFO_LINES = (
    "36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n"
    "40 25 0:39 / /mnt/with\\040space rw,relatime shared:7 - tmpfs tmpfs rw\n"
    "41 25 259:1 / /mnt/nvme rw - xfs /dev/nvme0n1 rw\n"
    "42 25 8:1 /mnt/nvme /mnt/nvme rw - ext4 /dev/sda1 rw\n"
)


def test_mountinfo_lines_give_root_mount_point_type_and_source() -> None:
    mounts = parse_mountinfo(MOUNTINFO_LINES)
    assert [(m.root, m.mount_point, m.fs_type, m.source) for m in mounts[:2]] == [
        ("/mnt1", "/mnt/parent", "ext3", "/dev/root"),
        ("/", "/mnt/with space", "tmpfs", "tmpfs"),
    ]


def test_the_last_mount_on_a_point_is_the_one_in_effect(tmp_path: Path) -> None:
    # /mnt/nvme: the disk's mount, then a directory of the root disk bound over it (the later one is seen).
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(MOUNTINFO_LINES.replace("/mnt/nvme", str(tmp_path)))
    with pytest.raises(RuntimeError, match=f"not a filesystem mounted there but the directory {tmp_path}"):
        check_required_mount(tmp_path / "cache", tmp_path, mountinfo)


@pytest.fixture
def in_mount_namespace() -> Callable[[str], list[str]]:
    """A wrapper: `script` (sh) runs in a private mount namespace, then execs the wrapped command there."""
    unshare = require_tool("unshare")
    probe = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs none /mnt"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        unavailable(f"cannot mount in a private mount namespace (root needed): {probe.stderr.strip()}")

    def wrapper(script: str) -> list[str]:
        return [unshare, "--mount", "--propagation", "private", "sh", "-ec", f'{script}\nexec "$@"', "sh"]

    return wrapper


def _start(
    daemon_factory: Callable[..., Daemon], wrapper: list[str], cache_dir: Path, require_mount: Path
) -> Daemon:
    return daemon_factory(
        allow=[],
        capacity="64MiB",
        cache_dir=cache_dir,
        extra_args=["--min-free", "0", "--require-mount", str(require_mount)],
        wrapper=wrapper,
    )


def _refused(
    daemon_factory: Callable[..., Daemon], wrapper: list[str], cache_dir: Path, require_mount: Path, log: Path
) -> str:
    """The daemon's log; it must have exited 1 without ever answering."""
    with pytest.raises(RuntimeError, match="exited with status 1"):
        _start(daemon_factory, wrapper, cache_dir, require_mount)
    return log.read_text()


def test_the_daemon_starts_with_its_cache_on_a_filesystem_mounted_at_the_required_path(
    in_mount_namespace: Callable[[str], list[str]], daemon_factory: Callable[..., Daemon], tmp_path: Path
) -> None:
    disk = tmp_path / "nvme"
    disk.mkdir()
    wrapper = in_mount_namespace(f"mount -t tmpfs shardcache-test-disk {disk}")
    daemon = _start(daemon_factory, wrapper, disk / "shardcache", disk)
    assert daemon.healthy()
    # The cache directory went onto the tmpfs, which only the daemon's namespace sees.
    assert not (disk / "shardcache").exists()


def test_the_daemon_starts_on_a_disk_whose_mount_point_is_bound_into_its_namespace(
    in_mount_namespace: Callable[[str], list[str]], daemon_factory: Callable[..., Daemon], tmp_path: Path
) -> None:
    # A DaemonSet pod: the host mounted the disk at host_mnt; the kubelet binds that mount point into the pod.
    host_mnt, pod_mnt = tmp_path / "host-nvme", tmp_path / "pod-nvme"
    host_mnt.mkdir()
    pod_mnt.mkdir()
    wrapper = in_mount_namespace(
        f"mount -t tmpfs shardcache-test-disk {host_mnt}\nmkdir {host_mnt}/shardcache\n"
        f"mount --bind {host_mnt} {pod_mnt}"
    )
    daemon = _start(daemon_factory, wrapper, pod_mnt / "shardcache", pod_mnt)
    assert daemon.healthy()


def test_nothing_mounted_at_the_path_stops_the_daemon_before_it_writes_there(
    in_mount_namespace: Callable[[str], list[str]], daemon_factory: Callable[..., Daemon], tmp_path: Path
) -> None:
    unmounted = tmp_path / "nvme"
    unmounted.mkdir()
    cache_dir = unmounted / "shardcache"
    log = _refused(daemon_factory, in_mount_namespace("true"), cache_dir, unmounted, tmp_path / "daemon0.log")
    assert f"nothing is mounted at {unmounted}" in log and str(cache_dir) in log
    assert "mount the cache disk at" in log
    assert not cache_dir.exists()


def test_a_root_filesystem_directory_bound_where_the_disk_belongs_stops_the_daemon(
    in_mount_namespace: Callable[[str], list[str]], daemon_factory: Callable[..., Daemon], tmp_path: Path
) -> None:
    # A hostPath while the host has not mounted its disk: the kubelet binds the root disk's directory.
    host_dir, pod_mnt = tmp_path / "host-nvme", tmp_path / "pod-nvme"
    (host_dir / "shardcache").mkdir(parents=True)
    pod_mnt.mkdir()
    wrapper = in_mount_namespace(f"mount --bind {host_dir} {pod_mnt}")
    log = _refused(daemon_factory, wrapper, pod_mnt / "shardcache", pod_mnt, tmp_path / "daemon0.log")
    assert f"{pod_mnt} (--require-mount) is not a filesystem mounted there" in log
    assert f"the directory {host_dir}" in log and str(pod_mnt / "shardcache") in log
    assert list((host_dir / "shardcache").iterdir()) == []


def test_a_cache_directory_on_another_filesystem_than_the_mount_stops_the_daemon(
    in_mount_namespace: Callable[[str], list[str]], daemon_factory: Callable[..., Daemon], tmp_path: Path
) -> None:
    disk = tmp_path / "nvme"
    disk.mkdir()
    elsewhere = tmp_path / "root-disk-cache"
    wrapper = in_mount_namespace(f"mount -t tmpfs shardcache-test-disk {disk}")
    log = _refused(daemon_factory, wrapper, elsewhere, disk, tmp_path / "daemon0.log")
    assert f"the cache directory {elsewhere} is not on the filesystem mounted at {disk}" in log
    assert not elsewhere.exists()


def test_a_required_mount_path_that_does_not_exist_stops_the_daemon(
    in_mount_namespace: Callable[[str], list[str]], daemon_factory: Callable[..., Daemon], tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-mount"
    log = _refused(
        daemon_factory, in_mount_namespace("true"), missing / "cache", missing, tmp_path / "daemon0.log"
    )
    assert f"--require-mount {missing} is not a directory" in log
