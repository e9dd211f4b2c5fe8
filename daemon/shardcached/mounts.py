"""The start-up guard `--require-mount PATH`: the cache must be on the filesystem mounted at PATH.

When a node's cache disk is not mounted, the cache directory is an ordinary directory of the root
filesystem: the cache then fills the root disk up to its capacity, and the kubelet starts evicting pods.
systemd's `RequiresMountsFor=` cannot tell (it only orders the unit after a mount unit that exists), and a
Kubernetes hostPath volume is always a mount point inside the container, whether or not the host mounted
the disk under it. So the guard reads the mount table and refuses to start unless

1. PATH is a mount point (listed in `/proc/self/mountinfo`);
2. a whole filesystem is mounted there: the mount's root within its filesystem is `/`. A directory of
   another filesystem bound there has that directory as its root. This is what tells a hostPath of the
   host's disk mount point (root `/`) from the same hostPath while the disk is missing (root
   `/mnt/nvme`, a directory of the host's root filesystem), and what tells a systemd unit's own bind
   mount of its `ReadWritePaths=` from the disk's mount;
3. the cache directory (or, before it exists, its nearest existing parent) is on that filesystem: the same
   `st_dev` as PATH.

`/proc/self/mountinfo` is parsed here (its format is fixed by the kernel, proc(5)): `os.path.ismount`
passes any bind mount, and psutil's partition list, which the daemon does not depend on, drops the root
field that check 2 needs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


class MountRequired(RuntimeError):
    """The cache directory is not on the filesystem `--require-mount` names; the daemon does not start."""


@dataclass(frozen=True)
class Mount:
    """One line of `/proc/self/mountinfo`."""

    root: str  # the directory of the mounted filesystem that appears at `mount_point`
    mount_point: str
    fs_type: str
    source: str


def _unescape(field: str) -> str:
    # The kernel writes space, tab, newline and backslash in paths as octal escapes (\040 and so on).
    return _OCTAL_ESCAPE.sub(lambda match: chr(int(match[1], 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a mountinfo text, in its order (a later mount on the same point hides the earlier)."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        separator = fields.index("-")  # optional fields end at "-"; fs type and source follow it
        mounts.append(
            Mount(
                root=_unescape(fields[3]),
                mount_point=_unescape(fields[4]),
                fs_type=fields[separator + 1],
                source=_unescape(fields[separator + 2]),
            )
        )
    return mounts


def mount_at(path: Path, mountinfo: Path = MOUNTINFO) -> Mount | None:
    """The mount visible at `path` (resolved), or None when `path` is not a mount point."""
    target = os.path.realpath(path)
    found = [mount for mount in parse_mountinfo(mountinfo.read_text()) if mount.mount_point == target]
    return found[-1] if found else None


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_required_mount(cache_dir: Path, mount_point: Path, mountinfo: Path = MOUNTINFO) -> Mount:
    """The mount at `mount_point` when `cache_dir` is on the filesystem mounted there.

    Raises:
        MountRequired: `mount_point` is missing or not a mount point, a directory of another filesystem is
            bound there instead of a filesystem, or `cache_dir` is on another filesystem. The message names
            both paths and what to do.
    """
    fix = (
        f"mount the cache disk at {mount_point} (on the host, for a container's hostPath), or set "
        f"--require-mount (SHARDCACHE_REQUIRE_MOUNT, require_mount) to the mount point of the disk that "
        f"holds {cache_dir}"
    )
    if not mount_point.is_dir():
        raise MountRequired(
            f"--require-mount {mount_point} is not a directory, so the cache directory {cache_dir} is not on "
            f"the disk meant for it; {fix}"
        )
    mount = mount_at(mount_point, mountinfo)
    if mount is None:
        raise MountRequired(
            f"nothing is mounted at {mount_point} (--require-mount): the cache directory {cache_dir} would "
            f"fill the filesystem under it; {fix}"
        )
    if mount.root != "/":
        raise MountRequired(
            f"{mount_point} (--require-mount) is not a filesystem mounted there but the directory "
            f"{mount.root} of {mount.source} ({mount.fs_type}) bound there: the disk meant for the cache "
            f"directory {cache_dir} is not mounted; {fix}"
        )
    existing = _nearest_existing(cache_dir)
    if os.stat(existing).st_dev != os.stat(mount_point).st_dev:
        raise MountRequired(
            f"the cache directory {cache_dir} is not on the filesystem mounted at {mount_point} "
            f"({mount.source}, {mount.fs_type}; --require-mount): give a --cache-dir on that disk, or {fix}"
        )
    return mount
