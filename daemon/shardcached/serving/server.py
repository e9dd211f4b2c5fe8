"""Run the daemon: the API on a Unix socket and the metrics listener on TCP, two uvicorn servers, one loop.

The Unix socket is created here, not by uvicorn (which leaves new sockets 0o666): it is bound under a
umask that grants nothing to other users and chmod-ed 0o660, so only the daemon's user and group can
connect. SIGTERM/SIGINT stop both listeners, tell downloads to stop (they remove their temp files), wait
for them, remove the socket and return 0. With `--require-mount`, the cache directory must first be on that
filesystem (mounts.py). The cache directory is locked next (dirlock.py): a second daemon on the same
directory exits with status 1, naming the directory and the holder's pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry

from shardcached.coalesce import CoalescingHttpToolsProtocol
from shardcached.config import Settings, parse_host_port
from shardcached.mounts import check_required_mount
from shardcached.planning import Planner
from shardcached.serving.app import create_app, create_metrics_app, serving_app
from shardcached.storage import CacheDirLock, Store

logger = logging.getLogger(__name__)

SOCKET_MODE = 0o660
SOCKET_DIR_MODE = 0o750


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to `serve` (two servers share one loop)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind_unix_socket(path: str) -> socket.socket:
    """A listening-ready AF_UNIX socket at `path` that other users cannot connect to.

    Raises:
        RuntimeError: another process already listens on `path`, or `path` is not a socket.
    """
    target = Path(path)
    if len(os.fsencode(path)) > 100:
        raise RuntimeError(f"socket path {path} is longer than 100 bytes; choose a shorter --socket")
    if not target.parent.exists():
        target.parent.mkdir(parents=True, mode=SOCKET_DIR_MODE)
    if target.exists() or target.is_symlink():
        if not stat.S_ISSOCK(target.lstat().st_mode):
            raise RuntimeError(f"{path} exists and is not a socket; remove it or choose another --socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError as exc:
            if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                raise
            target.unlink(missing_ok=True)  # left by a daemon that died
        else:
            raise RuntimeError(f"another shardcached already listens on {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o117)  # the socket is never, even briefly, open to other users
    try:
        sock.bind(path)
    finally:
        os.umask(old_umask)
    os.chmod(path, SOCKET_MODE)
    return sock


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def bind_tcp(address: str) -> socket.socket:
    host, port = parse_host_port(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def _uvicorn_config(app: object, graceful_s: float, http: Any = "httptools") -> uvicorn.Config:
    return uvicorn.Config(
        app,  # type: ignore[arg-type]
        http=http,
        lifespan="on",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=int(graceful_s),
        timeout_keep_alive=60,
    )


async def serve(settings: Settings) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit status.

    Raises:
        RuntimeError: the cache directory is not on the `--require-mount` filesystem, is locked by another
            daemon, or the socket is taken.
    """
    if settings.require_mount is not None:
        # Before the lock, which creates the cache directory: on a missing disk not even that is written.
        mount = check_required_mount(settings.cache_dir, settings.require_mount)
        logger.info(
            "cache directory %s is on %s (%s) mounted at %s",
            settings.cache_dir,
            mount.source,
            mount.fs_type,
            mount.mount_point,
        )
    lock = CacheDirLock(settings.cache_dir)
    lock.acquire()
    try:
        return await _serve_locked(settings, lock)
    finally:
        lock.close()


def _describe_space(settings: Settings, capacity: int) -> str:
    """One line on the cache's size and its filesystem's free space, for the start-up log."""
    fs = os.statvfs(settings.cache_dir)
    size, free = fs.f_blocks * fs.f_frsize, fs.f_bavail * fs.f_frsize
    return (
        f"capacity {capacity} bytes ({_gib(capacity)}, --capacity {settings.capacity}); cache filesystem "
        f"{_gib(free)} free of {_gib(size)}, eviction keeps {_gib(settings.min_free_bytes())} free "
        f"(--min-free {settings.min_free})"
    )


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


async def _serve_locked(settings: Settings, lock: CacheDirLock) -> int:
    store = Store(settings.cache_dir, settings.capacity_bytes(), settings.lease_ttl_s)
    store.recover()
    planner = Planner(
        policy=settings.policy, prefetch_depth=settings.prefetch_depth, stale_after_s=settings.plan_stale_s
    )
    registry = CollectorRegistry()
    app = create_app(settings, store, planner, registry, lock)
    api_socket = bind_unix_socket(settings.socket)
    try:
        metrics_socket = bind_tcp(settings.metrics_addr)
    except BaseException:
        api_socket.close()
        _remove(settings.socket)
        raise
    api = _Server(_uvicorn_config(serving_app(app), 10, CoalescingHttpToolsProtocol))
    service = app.state.service
    metrics = _Server(_uvicorn_config(create_metrics_app(registry, lambda: service.cache_dir.problem), 2))
    metrics.config.lifespan = "off"

    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        logger.info("received %s: shutting down", signal.Signals(signum).name)
        app.state.service.begin_shutdown()
        api.should_exit = metrics.should_exit = True

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    if not settings.allow:
        logger.warning("no --allow prefix is configured: every open will be refused with 403")
    logger.info(
        "shardcached %s: socket %s, metrics http://%s/metrics, cache %s, allow %s",
        app.version,
        settings.socket,
        settings.metrics_addr,
        settings.cache_dir,
        settings.allow,
    )
    logger.info("%s", _describe_space(settings, store.capacity))
    try:
        await asyncio.gather(api.serve(sockets=[api_socket]), metrics.serve(sockets=[metrics_socket]))
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        _remove(settings.socket)
    return 0 if api.started else 1
