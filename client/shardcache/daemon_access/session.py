"""This process's session with the daemon: a connection whose end tells the daemon the process is gone.

The daemon ends a lease when its holder dies. It cannot always see the holder's pid: a trainer pod beside
the daemon's DaemonSet pod lives in another PID namespace, where `SO_PEERCRED` gives 0. So each process
opens one connection for its life, `POST /v1/sessions`, reads the session id from the first line of the
answer and never reads or writes on it again; its opens and plan registrations name that id. When the
process dies, however (`kill -9`, the OOM killer, its pod deleted), the kernel closes the connection and
the daemon ends the session's leases at once and its plans a few seconds later.

Why a connection of its own: the hot path's keep-alive connections (`transport`) come and go while the
process lives (one per thread, closed by the daemon after 60 s idle, replaced after a break, one per
streamed read), so tying leases to them would end the leases of a live reader.

The rules that keep the session true to its process:

- **One per process (and daemon socket), whatever the clients.** Every `DaemonClient` of the process uses
  it (`session_for`): a source makes a client per pass over the data and closes it at the end of the
  pass, but the plans it registered for the next epoch must outlive that client, as they outlive nothing
  but the process. Closing a client therefore leaves the session; only the process's end ends it. (The
  registry is module state on purpose: it stands for the process itself.)
- **Never shared with a forked child.** A DataLoader worker forked from the trainer inherits a copy of
  the session's socket; if it kept it, the connection would outlive the trainer as long as the worker
  lives. The child closes its copy (`_reset_after_fork`; closing a copy does not end the parent's
  connection) and starts its own session at its first open. A session is started under
  `forksafe.background_work` (taken before the session's own lock, the order every thread keeps), so no
  fork can fall between creating the socket and recording it and leak an unrecorded copy.
- **A session the daemon ended is replaced.** A daemon that restarted does not know the id (404
  `unknown_session`), and one that stopped ended the session's answer or its connection (the socket turned
  readable, `ended`). The caller checks on an error answer only, so a successful open costs nothing: it
  drops the session (`lost`) and sends the request again in a new one. A restarted daemon is always
  noticed this way, since it answers the first request naming the old id with an error.
- **An older daemon has none** (404 or 405 for `POST /v1/sessions`): requests name no session, and the
  daemon follows the process by its pid as before. It is asked again after `NO_SESSIONS_RETRY_S` (a
  restarted daemon may be a newer one). A daemon downgraded under a running process refuses the `session`
  field (422); the session's socket has ended by then, so the request goes again without.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import socket
import threading
import time

from shardcache import forksafe
from shardcache.daemon_access.open_wire import read_answer
from shardcache.daemon_access.transport import Response, check_descriptors, describe, encode_request
from shardcache.errors import DaemonError, DaemonUnavailable
from shardcache_protocol import SESSIONS_PATH, SessionGrant

UNKNOWN_SESSION = "unknown_session"
_NO_SESSIONS = (404, 405)  # an older daemon's answer to `POST /v1/sessions`
_MAX_LINE = 64 * 1024
# A daemon without sessions is asked again after this long (it may have been replaced by a newer one).
NO_SESSIONS_RETRY_S = 30.0
# Readable at all: the daemon ended the answer (shutdown) or the connection (EOF).
_ENDED = select.POLLIN | select.POLLHUP | select.POLLERR


class Session:
    """This process's session with the daemon on `socket_path`; safe across threads and forks.

    Use `session_for(socket_path)`: one per process and socket.
    """

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._answer: http.client.HTTPResponse | None = None
        self._id: str | None = None
        self._none_until = 0.0  # monotonic time until which the daemon is taken to have no sessions
        forksafe.reset_in_child(self)

    def _reset_after_fork(self) -> None:
        # The parent's lock may be held by a thread that does not exist here. The socket is the parent's
        # session: this copy is closed (the parent's stays open), so the parent's death ends it.
        self._lock = threading.Lock()
        self._close()
        self._none_until = 0.0

    def current(self, timeout: float) -> str | None:
        """The session id to name in a request: this process's session, started when there is none (the
        daemon may take `timeout` seconds to grant it); None while the daemon has no sessions.

        Raises:
            DaemonUnavailable: no daemon answers.
            DaemonRequestError: the daemon refused (503 shutting_down while it stops).
        """
        session_id = self._id
        if session_id is not None or time.monotonic() < self._none_until:
            return session_id
        # The fork lock first, then the session's: the order of every thread. A background thread of ours
        # (a plan announced ahead) holds the fork lock for its whole request and may find the session lost
        # (`lost` takes the session's lock); taking the two the other way round here deadlocked a
        # DataLoader worker whose daemon had restarted.
        with forksafe.background_work(), self._lock:
            if self._id is not None or time.monotonic() < self._none_until:
                return self._id  # another thread started it meanwhile
            return self._start(timeout)

    def gone(self, refusal: Response) -> bool:
        """Whether an error answer to a request that named this session means the session is gone: the
        daemon does not know it (404 `unknown_session`: it restarted), or ended it (`ended`)."""
        return _unknown_session(refusal) or self.ended()

    def ended(self) -> bool:
        """Whether the daemon ended this session: anything to read on its connection (the answer's end,
        or the connection's) means it did; so does having none."""
        sock = self._sock
        try:
            poller = select.poll()  # one per call: a poll object refuses concurrent use by two threads
            poller.register(-1 if sock is None else sock.fileno(), _ENDED)
        except ValueError:  # no session, or closed by another thread meanwhile
            return True
        return bool(poller.poll(0))

    def close_if_ended(self) -> None:
        """Close the session's socket if the daemon ended the session (the next use starts another)."""
        with self._lock:
            if self._sock is not None and self.ended():
                self._close()

    def lost(self, session_id: str) -> None:
        """The daemon does not know `session_id` (it restarted): the next `current` starts another."""
        with self._lock:
            if self._id == session_id:
                self._close()

    def _start(self, timeout: float) -> str | None:
        # The caller holds the fork lock (`current`): no fork falls between creating the socket and
        # recording it.
        sock = self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        body = json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode()
        try:
            sock.settimeout(timeout)
            sock.connect(self.socket_path)
            sock.sendall(encode_request("POST", SESSIONS_PATH, body))
            answer = self._answer = http.client.HTTPResponse(sock)
            answer.begin()
            if answer.status != 200:
                refusal = Response(answer.status, answer.read())
                self._close()
                if refusal.status in _NO_SESSIONS:
                    self._none_until = time.monotonic() + NO_SESSIONS_RETRY_S
                    return None
                refusal.raise_for_status()
            line = answer.readline(_MAX_LINE)
        except DaemonError:
            raise
        except (OSError, ValueError, http.client.HTTPException) as exc:
            self._close()
            check_descriptors(exc)
            raise DaemonUnavailable(self.socket_path, describe(exc)) from exc
        try:
            grant = read_answer(SessionGrant, line, f"POST {SESSIONS_PATH}")
        except DaemonError:
            self._close()
            raise
        self._id = grant.session
        return grant.session

    def _close(self) -> None:
        sock, answer = self._sock, self._answer
        self._sock = self._answer = self._id = None
        if sock is not None:
            if answer is not None:
                answer.close()  # its file holds a reference that would keep the socket open
            sock.close()


class _Sessions:
    """The process's sessions by socket path (see the module's docstring: module state on purpose)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_socket: dict[str, Session] = {}
        forksafe.reset_in_child(self)

    def _reset_after_fork(self) -> None:
        self._lock = threading.Lock()  # the sessions reset themselves

    def get(self, socket_path: str) -> Session:
        session = self._by_socket.get(socket_path)
        if session is None:
            with self._lock:
                session = self._by_socket.get(socket_path)
                if session is None:
                    # A process that meets a new socket may have left daemons behind (tests start one
                    # per test): the sessions those ended are closed, so their sockets do not pile up.
                    for other in self._by_socket.values():
                        other.close_if_ended()
                    session = self._by_socket[socket_path] = Session(socket_path)
        return session


_SESSIONS = _Sessions()


def session_for(socket_path: str) -> Session:
    """This process's session with the daemon on `socket_path` (one per process and socket)."""
    return _SESSIONS.get(socket_path)


def _unknown_session(answer: Response) -> bool:
    """Whether `answer` says the session named is not open on the daemon (404 `unknown_session`)."""
    if answer.status != 404:
        return False
    try:
        payload = json.loads(answer.body)
    except ValueError:
        return False
    return isinstance(payload, dict) and payload.get("error") == UNKNOWN_SESSION
