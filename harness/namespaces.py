"""Processes in namespaces of their own, as a DaemonSet pod and trainer pods run on one node.

`in_namespaces(...)` is a command prefix (a `wrapper` for `start_daemon`, or the head of a trainer's
command) that runs the command in new PID and mount namespaces (with its own /proc, so it sees only its
own processes), optionally a new UTS namespace with its own host name (a pod's name), after bind-mounting
host directories at the paths the pod sees them (hostPath volumes) and hiding others behind an empty
tmpfs (a directory the pod does not mount). Needs root, or user namespaces; `require_namespaces` skips
(fails under CI) where they cannot be made.

`unshare --fork` waits for its child and does not pass SIGTERM on: `stop_namespaced` stops the command
itself (the child of `unshare`), as a pod's runtime signals the container's process.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from harness.devservers import Daemon
from harness.tools import require_tool, unavailable


def require_namespaces() -> str:
    """`unshare`'s path, once it is known to make PID and mount namespaces here."""
    unshare = require_tool("unshare")
    probe = subprocess.run(
        [unshare, "--pid", "--fork", "--mount-proc", "--mount", "--uts", "true"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        unavailable(
            f"cannot create PID and mount namespaces (root or user namespaces needed): {probe.stderr}"
        )
    return unshare


def in_namespaces(
    unshare: str,
    *,
    binds: Sequence[tuple[Path, Path]] = (),
    hidden: Sequence[Path] = (),
    hostname: str | None = None,
) -> list[str]:
    """A command prefix: new PID, mount (and with `hostname`, UTS) namespaces; each (host, seen) of `binds`
    bind-mounted at `seen`, each of `hidden` covered by an empty tmpfs; then the command is exec-ed."""
    steps = [f'mount --bind "{host}" "{seen}"' for host, seen in binds]
    steps += [f'mount -t tmpfs -o size=1m,mode=0755 none "{path}"' for path in hidden]
    if hostname is not None:
        steps.append(f'hostname "{hostname}"')
    namespaces = ["--pid", "--fork", "--mount-proc", "--mount", *(["--uts"] if hostname else [])]
    script = " && ".join([*steps, 'exec "$@"'])
    return [unshare, *namespaces, "--kill-child=SIGKILL", "sh", "-c", script, "sh"]


def namespaced_child(wrapper_pid: int) -> int:
    """The pid (in this namespace) of the command `unshare --fork` (pid `wrapper_pid`) runs."""
    (child,) = Path(f"/proc/{wrapper_pid}/task/{wrapper_pid}/children").read_text().split()
    return int(child)


def stop_namespaced(daemon: Daemon, timeout: float = 15.0) -> int:
    """SIGTERM to the daemon inside its namespaces; its exit status."""
    if daemon.process.poll() is None:
        os.kill(namespaced_child(daemon.process.pid), signal.SIGTERM)
    return daemon.process.wait(timeout)
