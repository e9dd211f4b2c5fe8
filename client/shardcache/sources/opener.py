"""How a source reaches its shards: through the node daemon, or directly when `daemon=None`."""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Callable, Iterator
from typing import IO, BinaryIO, Literal, TypeAlias

from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.daemon_access.direct import open_direct
from shardcache.errors import ConfigError
from shardcache.shards import ShardRef

# "auto": the node daemon, direct reads when none answers; "required": the daemon or an error; None: direct
# reads; any other string: the daemon's socket path; or a DaemonClient.
DaemonSetting: TypeAlias = Literal["auto", "required"] | str | DaemonClient | None
_NAMED = ("auto", "required")


def check_daemon_setting(daemon: DaemonSetting) -> None:
    """Refuse a `daemon=` argument that is none of the accepted forms."""
    if daemon is None or isinstance(daemon, DaemonClient) or isinstance(daemon, str):
        return
    raise ConfigError(
        f"daemon={daemon!r}: expected 'auto', 'required', None, a socket path or a DaemonClient"
    )


def make_client(daemon: DaemonSetting) -> DaemonClient | None:
    """The DaemonClient a setting names (None: read shards directly)."""
    if daemon is None:
        return None
    if isinstance(daemon, DaemonClient):
        return daemon
    if daemon == "auto":
        return DaemonClient()
    if daemon == "required":
        return DaemonClient(required=True)
    return DaemonClient(socket=str(daemon))


class ShardOpener:
    """Opens shards in one reader process; created lazily so each DataLoader worker has its own connection."""

    def __init__(self, daemon: DaemonSetting) -> None:
        self.client = make_client(daemon)
        self._owns_client = self.client is not None and self.client is not daemon
        # Called once a shard is open through the daemon (the source re-announces its plans from there
        # when the daemon restarted; see `SourceNode.gen`).
        self.after_open: Callable[[], None] | None = None

    @contextlib.contextmanager
    def open(self, ref: ShardRef, plan: str | None = None) -> Iterator[BinaryIO]:
        """Open one shard (a real file with fileno() on the daemon's path handoff or a local read)."""
        if self.client is None:
            with open_direct(ref.url) as f:
                yield f
            return
        with self.client.open(ref.url, plan=plan, size=ref.size, checksum=ref.checksum) as f:
            if self.after_open is not None:
                self.after_open()
            yield f

    def close(self) -> None:
        """Close the connection this opener made (a DaemonClient passed in stays the caller's to close).

        Called when the source closes: a source sits in a reference cycle (a node holds its generator, whose
        frame holds the node), so without this an abandoned iterator's connection to the daemon would stay
        open until the cyclic garbage collector ran.
        """
        if self._owns_client and self.client is not None:
            self.client.close()

    @contextlib.contextmanager
    def open_buffer(self, ref: ShardRef, plan: str | None = None) -> Iterator[mmap.mmap | IO[bytes]]:
        """Open one shard as an mmap when it is a real file, else as the readable stream it is."""
        with self.open(ref, plan) as f:
            mapped = try_mmap(f)
            if mapped is None:
                yield f
                return
            try:
                yield mapped
            finally:
                # Samples hold bytes copies, never views, so closing the map here is safe.
                mapped.close()


def try_mmap(f: IO[bytes]) -> mmap.mmap | None:
    """An mmap of `f` from its current start, or None when `f` is a stream or empty."""
    try:
        fd = f.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    try:
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # empty file, or a pipe/socket descriptor
        return None
