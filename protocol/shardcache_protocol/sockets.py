"""Where the daemon listens: the socket path rule both sides apply when none is configured."""

from __future__ import annotations

import os
from pathlib import Path

SOCKET_ENV = "SHARDCACHE_SOCKET"
SOCKET_NAME = "shardcache.sock"
ROOT_SOCKET_PATH = "/run/shardcache/shardcache.sock"
DEFAULT_METRICS_ADDR = "127.0.0.1:9464"


def default_socket_path() -> str:
    """The socket path both sides agree on when none is configured.

    `SHARDCACHE_SOCKET` wins; otherwise `/run/shardcache/shardcache.sock` as root and
    `$XDG_RUNTIME_DIR/shardcache.sock` for other users (falling back to /tmp/shardcache-<uid>/).
    """
    from_env = os.environ.get(SOCKET_ENV)
    if from_env:
        return from_env
    if os.geteuid() == 0:
        return ROOT_SOCKET_PATH
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if runtime_dir:
        return str(Path(runtime_dir) / SOCKET_NAME)
    return f"/tmp/shardcache-{os.geteuid()}/{SOCKET_NAME}"
