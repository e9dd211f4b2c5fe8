"""Whether the node daemon answers a `DaemonClient`, and waiting out its restarts.

A daemon that answers 503 shutting_down, or whose socket goes away after it answered, is being restarted
(systemd, a DaemonSet rolling update): a request is sent again once its socket answers a health probe, for
up to `restart_wait_s`. Past that, or when no daemon answered at all, a `required` client raises
`DaemonUnavailable` and an `auto` one reads shards directly, warns once, and tries the daemon again every
`reprobe_interval` (searching the sockets again, in case it started at another one).

`DaemonAvailability` is the part of `DaemonClient` that keeps this state; the client inherits it and sends
each request that may meet a restart through `_through_restarts`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from shardcache.daemon_access.control import ControlClient
from shardcache.daemon_access.discovery import Discovery, rediscover
from shardcache.daemon_access.session import Session, session_for
from shardcache.daemon_access.transport import Transport
from shardcache.errors import START_DAEMON, ConfigError, DaemonError, DaemonRequestError, DaemonUnavailable
from shardcache_protocol import API_PREFIX

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_V1 = API_PREFIX
DEFAULT_RESTART_WAIT_S = 30.0
RESTART_WAIT_ENV = "SHARDCACHE_RESTART_WAIT_S"
# While waiting for a restarting daemon, the socket is probed this often at first, backing off to the max.
_PROBE_FIRST_S, _PROBE_MAX_S = 0.05, 0.5


def _required_advice(first: str) -> str:
    """`first` (a sentence: start the daemon, or join its group), then the alternatives to `required`."""
    return (
        f'{first[:-1]}; or pass daemon="auto" to read shards directly while no daemon answers, or '
        "daemon=None to read them directly always."
    )


class DaemonAvailability:
    """The daemon's availability as one client sees it: up, down since when, and waiting for a restart.

    The attributes below are set by `DaemonClient.__init__` and `_setup`; `_down_at` is the monotonic time
    of the last failed attempt to reach the daemon (None while it answers) and `_seen_up` whether a daemon
    answered this client in this process (a failure after that is a restart).
    """

    socket: str
    system_socket: str
    discovery: Discovery
    required: bool
    timeout: float
    reprobe_interval: float
    restart_wait_s: float
    _transport: Transport
    _control: ControlClient
    _session: Session
    _state_lock: threading.Lock
    _down_at: float | None
    _seen_up: bool

    def _through_restarts(self, attempt: Callable[[], _T]) -> _T | None:
        """What `attempt()` (one request) returns, waiting out a daemon restart; None: go on without it.

        `attempt` raises `DaemonUnavailable` when the socket fails and the typed `DaemonRequestError` for
        an error answer. A daemon that answers 503 shutting_down, or whose socket goes away after it
        answered, is being restarted (systemd, a DaemonSet rolling update): the request is sent again once
        its socket answers, for up to `restart_wait_s`. Past that a `required` client raises
        `DaemonUnavailable`; an `auto` client returns None (read directly) and re-probes every
        `reprobe_interval`.
        """
        if self._skip_daemon():
            return None
        if self._down_at is not None:
            self._rediscover()
        deadline: float | None = None
        delay = _PROBE_FIRST_S
        while True:
            try:
                result = attempt()
            except DaemonUnavailable as exc:
                failure: DaemonError = exc
            except DaemonRequestError as exc:
                self._came_up()
                if cannot_cache(exc):  # it answers but has no cache to serve from: go on without it
                    self._went_down(exc)
                    return None
                if not shutting_down(exc):
                    raise
                failure = exc
            else:
                self._came_up()
                return result
            if deadline is None:
                if not self._waits_for_restart(failure):
                    self._went_down(failure)
                    return None
                logger.info(
                    "%s; waiting up to %gs for shardcached to come back", failure, self.restart_wait_s
                )
                deadline = time.monotonic() + self.restart_wait_s
            if not self._wait_for_daemon(deadline, delay):
                self._gave_up(failure)
                return None
            delay = min(delay * 2, _PROBE_MAX_S)

    def _waits_for_restart(self, failure: DaemonError) -> bool:
        """Whether a failed request is worth waiting on (see `restart_wait_s`)."""
        if self.restart_wait_s <= 0:
            return False
        if isinstance(failure, DaemonRequestError):  # 503 shutting_down: it says it is restarting
            return True
        return self.required or (self._seen_up and self._down_at is None)

    def _wait_for_daemon(self, deadline: float, delay: float) -> bool:
        """Probe the socket until the daemon answers its health check (True) or the deadline passes."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(delay, remaining))  # pacing the probes of a restarting daemon
            try:
                probe_s = min(2.0, max(remaining, 0.1))
                if self._control.request("GET", f"{_V1}/health", timeout=probe_s).status == 200:
                    return True
            except DaemonUnavailable:
                pass
            delay = min(delay * 2, _PROBE_MAX_S)

    def _gave_up(self, failure: DaemonError) -> None:
        """The daemon did not come back within `restart_wait_s`: raise (required) or read directly."""
        cause = failure.reason if isinstance(failure, DaemonUnavailable) else str(failure)
        reason = f"it did not come back within {self.restart_wait_s:g}s (restart_wait_s) after: {cause}"
        self._went_down(DaemonUnavailable(self.socket, reason))

    def _skip_daemon(self) -> bool:
        down_at = self._down_at
        if down_at is None or self.required:
            return False
        return time.monotonic() - down_at < self.reprobe_interval

    def _rediscover(self) -> None:
        """Search the sockets again (the daemon may have started at another of them; see discovery)."""
        found = rediscover(self.discovery, self.system_socket)
        if found.socket != self.socket:
            logger.info("shardcached socket found at %s (was %s)", found.socket, self.socket)
            self.discovery, self.socket = found, found.socket
            self._transport.socket_path = self._control.socket_path = found.socket
            self._session = session_for(found.socket)

    def _went_down(self, exc: DaemonError) -> None:
        """No daemon to go on with: raise (`required`), or read directly and warn once (`auto`)."""
        if self.required:
            if isinstance(exc, DaemonUnavailable):
                # The advice for the caller that chose `required`, with the sockets searched.
                tried = self.discovery.describe()
                reason = exc.reason if tried == exc.socket else f"{exc.reason}; sockets tried: {tried}"
                advice = _required_advice(self.discovery.join_advice() or START_DAEMON)
                raise DaemonUnavailable(exc.socket, reason, advice) from exc.__cause__
            raise exc
        with self._state_lock:
            first = self._down_at is None
            self._down_at = time.monotonic()
        if first:
            what, advice = str(exc), ""
            if isinstance(exc, DaemonUnavailable):  # its own advice follows the sockets tried
                what = f"no shardcached daemon answers on {exc.socket}: {exc.reason}"
                advice = f"{self.discovery.join_advice() or START_DAEMON} "
            logger.warning(
                "%s (sockets tried: %s); reading shards directly (no node cache) until it answers again. "
                '%sPass daemon="required" to make this an error.',
                what,
                self.discovery.describe(),
                advice,
            )

    def _came_up(self) -> None:
        self._seen_up = True
        if self._down_at is not None:
            with self._state_lock:
                was_down, self._down_at = self._down_at is not None, None
            if was_down:
                logger.info("shardcached answers again on %s; reading shards through it", self.socket)

    def available(self) -> bool:
        """Whether a daemon answers on the socket right now (a health check with a short timeout)."""
        try:
            ok = self._control.request("GET", f"{_V1}/health", timeout=min(self.timeout, 2.0)).status == 200
        except DaemonUnavailable:
            return False
        if ok:
            self._came_up()
        return ok


def restart_wait(given: float | None) -> float:
    """`restart_wait_s` as given, else from `SHARDCACHE_RESTART_WAIT_S`, else the default; checked."""
    name, value = "restart_wait_s", given
    if given is None:
        raw = os.environ.get(RESTART_WAIT_ENV)
        if not raw:
            return DEFAULT_RESTART_WAIT_S
        name = RESTART_WAIT_ENV
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
    if value is None or not value >= 0:
        shown = os.environ.get(RESTART_WAIT_ENV) if given is None else repr(given)
        raise ConfigError(f"{name}={shown}: expected a number of seconds >= 0 (0 never waits)")
    return float(value)


def cannot_cache(exc: DaemonRequestError) -> bool:
    """A 503 the daemon sends while its cache directory is gone and cannot be recreated (its health says
    which path): no restart to wait for; read directly (`auto`) until it answers again."""
    return exc.status == 503 and exc.code == "cache_dir_missing"


def shutting_down(exc: DaemonRequestError) -> bool:
    """A 503 the daemon sends while it stops (SIGTERM): a restart, not a refusal."""
    return exc.status == 503 and exc.code == "shutting_down"
