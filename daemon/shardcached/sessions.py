"""Sessions: what a client process holds ends when the kernel closes its connection, in any PID namespace.

A client process starts a session with `POST /v1/sessions` and keeps that request's connection open for
its whole life: the answer's first line is the session's id (`SessionGrant`) and its body never ends.
Opens and plan registrations that name the session, on any other connection, are filed under it
(owners.py). When the connection closes (the process exited, however it died, or hung up on purpose),
uvicorn reports the disconnect and the session ends: its leases at once, its plans after a grace period.
`SO_PEERCRED`'s pid (peers.py) cannot follow a trainer in another PID namespace (a trainer pod beside a
DaemonSet pod sees pid 0); a connection's end needs no pid: the kernel closes it when the last process
holding it is gone.

Why a connection of its own rather than the connections that carry the opens: a client's keep-alive
connections come and go while its process lives (the daemon closes idle ones after 60 s, a thread's
connection goes with the thread, a broken one is replaced, every streamed read has its own), so none of
them marks the process's life; and a lease is often released by another thread than the one that took it.
The session connection carries nothing after its answer's first line, so it is never idle-closed (its
request is still being answered) and never broken by a request.

The session's answer ends when the daemon begins to shut down (`close_all`), so uvicorn's graceful
shutdown does not wait for it; the client then finds its session unknown to the next daemon (404
`unknown_session`) and starts another.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from shardcache_protocol import SessionGrant
from shardcached.errors import NotFound

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Session:
    """One client process's session: its id, and the job its opens without a plan pin for."""

    id: str
    job: str

    @property
    def holder(self) -> str:
        """The key its leases and plans are filed under (pins.py, owners.py)."""
        return f"session {self.id}"


class Sessions:
    """The live sessions; `on_end(session)` runs on the loop when one ends."""

    def __init__(self, on_end: Callable[[Session], None]) -> None:
        self._live: dict[str, Session] = {}
        self._on_end = on_end
        self._closing = asyncio.Event()

    def __len__(self) -> int:
        return len(self._live)

    def start(self, job: str | None) -> Session:
        """A new session; `job`: its opens' job without a plan (None: named after the session)."""
        session_id = secrets.token_hex(16)
        session = Session(session_id, job or f"session {session_id[:8]}")
        self._live[session_id] = session
        return session

    def named(self, session_id: str | None) -> Session | None:
        """The live session a request names; None when it names none.

        Raises:
            NotFound: 404 `unknown_session`: it ended (its connection closed, or the daemon restarted since
                it began); the client starts another and sends the request again.
        """
        if session_id is None:
            return None
        session = self._live.get(session_id)
        if session is None:
            raise _unknown(session_id)
        return session

    def check_live(self, session: Session) -> None:
        """Raise 404 `unknown_session` when `session` ended (say, while an open naming it waited)."""
        if self._live.get(session.id) is not session:
            raise _unknown(session.id)

    async def wait_for_end(self, receive: Receive) -> bool:
        """Wait until the session's connection closes (True) or the daemon shuts down (False)."""
        disconnected = asyncio.ensure_future(_disconnect(receive))
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait((disconnected, closing), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (disconnected, closing):
                waiter.cancel()
        return disconnected.done() and not disconnected.cancelled()

    def end(self, session: Session) -> None:
        """End `session` (idempotent): `on_end` ends what it holds, unless the daemon is shutting down."""
        if self._live.pop(session.id, None) is session and not self._closing.is_set():
            self._on_end(session)

    def close_all(self) -> None:
        """The daemon is shutting down: end every session's answer (the next daemon knows none of them)."""
        self._closing.set()


def _unknown(session_id: str) -> NotFound:
    return NotFound(
        f"session {session_id} is not open on this daemon (its connection closed, or the daemon restarted); "
        "start a new one with POST /v1/sessions and send the request again",
        code="unknown_session",
    )


async def _disconnect(receive: Receive) -> None:
    """Return once the peer hung up (the session's request body was read before)."""
    while (await receive())["type"] != "http.disconnect":
        pass  # a client sends nothing after its session request; whatever comes is not a hang-up


class SessionResponse(Response):
    """`POST /v1/sessions`'s answer: the grant as its first line, then open until either side ends it.

    The session starts when the answer is sent and ends in any case when it stops (the client hung up, the
    daemon shuts down, or uvicorn cancelled it). No Content-Length: uvicorn sends the body chunked, so the
    grant reaches the client at once. `Connection: close`: the connection goes when the answer ends.
    """

    media_type = "application/x-ndjson"

    def __init__(
        self, sessions: Sessions, job: Callable[[Scope], str | None], status_code: int = 200
    ) -> None:
        super().__init__(status_code=status_code, headers={"connection": "close"})
        del self.headers["content-length"]
        self._sessions = sessions
        self._job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        session = self._sessions.start(self._job(scope))
        try:
            grant = SessionGrant(session=session.id, job=session.job).model_dump_json().encode()
            start = {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            await send(start)
            await send({"type": "http.response.body", "body": grant + b"\n", "more_body": True})
            if not await self._sessions.wait_for_end(receive):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self._sessions.end(session)
