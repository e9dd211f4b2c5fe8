"""`DaemonClient`: open shards through the node daemon, or directly when none answers.

The hot path is `open`: one keep-alive round trip (`POST /v1/shards/open`) on the hand-written transport
(`transport`), an `open()` of the local path the daemon hands over, and a lease release whose answer is
read lazily on the next request. Everything else (plans, stats, listings, prefetch, evict, health probes)
is control plane and goes through httpx (`control`).

Around the facade: `availability` (whether the daemon answers; waiting out its restarts), `direct` (reading
shards without it), `open_wire` (the open's grant and the connection count behind `generation`) and
`session` (the connection whose end tells the daemon this process is gone, so its leases end with it).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO, Literal, cast

from shardcache import forksafe
from shardcache.daemon_access.availability import DaemonAvailability, restart_wait
from shardcache.daemon_access.control import ControlClient
from shardcache.daemon_access.direct import (
    DISK_FULL_CODE,
    DISK_FULL_RETRY_S,
    PINNED_ADVICE,
    PINNED_CODE,
    PINNED_RETRY_S,
    DiskFullMemory,
    cannot_fit,
    open_direct,
)
from shardcache.daemon_access.discovery import SYSTEM_SOCKET, Discovery, discover
from shardcache.daemon_access.open_wire import CountingTransport, parse_grant
from shardcache.daemon_access.session import session_for
from shardcache.daemon_access.transport import RELEASE_HEADER, Response
from shardcache.errors import ConfigError, DaemonUnavailable, InsufficientCapacity, RemoteNotFound
from shardcache.node import JSONObject, JSONValue
from shardcache.shards import ListedUrls
from shardcache_protocol import (
    API_PREFIX,
    Health,
    OpenGrant,
    PlanResponse,
    Revalidated,
    ShardInfo,
    ShardList,
    Stats,
    TelemetrySummary,
)

logger = logging.getLogger(__name__)

Handoff = Literal["auto", "path", "stream"]
_HANDOFFS = ("auto", "path", "stream")
_V1 = API_PREFIX
# The daemon no longer holds (or never held) the shard list a plan names: upload it, then register again.
UNKNOWN_SHARDLIST = "unknown_shardlist"
# Leases of shards closed within this many seconds of opening are released with the next request.
PIGGYBACK_WITHIN_S = 0.25


class DaemonClient(DaemonAvailability):
    """A connection to the node's `shardcached`, safe to share across threads and to copy into workers.

    What a process opens through its clients ends with the process: each process holds one session with
    the daemon (`daemon_access.session`), a connection kept open for its life whose end the daemon sees
    in whatever PID namespace the process runs, so a killed trainer's open shards are released at once.

    Args:
        socket: the daemon's Unix socket; default `SHARDCACHE_SOCKET`, else the system daemon's socket
            when it exists, else the per-user one (see `discovery`).
        required: raise `DaemonUnavailable` when no daemon answers (after `restart_wait_s`), instead of
            reading shards directly; and raise `InsufficientCapacity` for a shard the cache cannot hold
            instead of reading it directly.
        disk_full_retry_s: after the daemon answers that its cache filesystem is full (507
            `cache_disk_full`), an `auto` client reads every shard directly for this many seconds without
            asking the daemon, then asks again (default `DISK_FULL_RETRY_S`, 30). 0 asks for every shard.
        timeout: seconds one request may take; an open that misses waits for the whole download.
        handoff: how a shard's bytes reach the reader: "auto" opens the local path the daemon hands over and
            streams `GET /v1/shards/data` when that path is not visible (another mount namespace); "path"
            only opens the path; "stream" always streams.
        reprobe_interval: while no daemon answers, seconds between attempts to reach it again, so a
            restarted daemon is picked up without a failed connect on every open.
        restart_wait_s: how long an open waits for a daemon that is restarting (it answered 503
            shutting_down, or its socket went away after it answered) before giving up: then a `required`
            client raises `DaemonUnavailable` and an `auto` one reads directly. A `required` client also
            waits this long for a daemon it has not reached yet. 0 never waits. Default:
            `SHARDCACHE_RESTART_WAIT_S`, else 30.
        system_socket: the system daemon's socket searched when `socket` and `SHARDCACHE_SOCKET` are
            unset (for tests; default `/run/shardcache/shardcache.sock`).

    Example:
        >>> with DaemonClient() as client, client.open("s3://bucket/shard_000000.tar") as f:  # doctest: +SKIP
        ...     header = f.read(512)
    """

    _transport: CountingTransport

    def __init__(
        self,
        socket: str | None = None,
        *,
        required: bool = False,
        timeout: float = 600.0,
        handoff: Handoff = "auto",
        reprobe_interval: float = 5.0,
        restart_wait_s: float | None = None,
        system_socket: str = SYSTEM_SOCKET,
        disk_full_retry_s: float = DISK_FULL_RETRY_S,
    ) -> None:
        if handoff not in _HANDOFFS:
            raise ConfigError(f"handoff={handoff!r} is not one of {', '.join(map(repr, _HANDOFFS))}")
        if not 0 <= disk_full_retry_s <= 3600:
            raise ConfigError(f"disk_full_retry_s={disk_full_retry_s!r} must lie between 0 and 3600 seconds")
        if timeout <= 0:
            raise ConfigError(f"timeout={timeout!r} must be a positive number of seconds")
        restart_wait_s = restart_wait(restart_wait_s)
        self.discovery: Discovery = discover(socket, system_socket)
        self.socket = self.discovery.socket
        self.system_socket = system_socket
        self.required = required
        self.timeout = timeout
        self.handoff: Handoff = handoff
        self.reprobe_interval = reprobe_interval
        self.restart_wait_s = restart_wait_s
        self.disk_full_retry_s = disk_full_retry_s
        self._setup()

    def _setup(self) -> None:
        self._transport = CountingTransport(self.socket, self.timeout, f"{_V1}/shards/release")
        self._control = ControlClient(self.socket, self.timeout)
        self._session = session_for(self.socket)
        self._state_lock = threading.Lock()
        self._down_at = None  # the daemon's state as this client sees it (see DaemonAvailability)
        self._seen_up = False
        self._shardlists_uploaded: set[str] = set()  # digests of shard lists this process uploaded
        self._shardlists_refused = False  # the daemon has no shard lists (older): plans go as url lists
        self._warned_path = False
        self._warned_capacity = False
        self._takes_immutable = True  # False once the daemon refused the field (older than it)
        self._disk_full = DiskFullMemory(self.disk_full_retry_s)
        # Pins end sooner than a full disk empties (readers close shards; a dead holder's go within a
        # second): remembered for a few seconds, never longer than the disk-full memory.
        self._pinned = DiskFullMemory(min(PINNED_RETRY_S, self.disk_full_retry_s), advice=PINNED_ADVICE)
        forksafe.reset_in_child(self)

    def _reset_after_fork(self) -> None:
        # A forked DataLoader worker shares this object with the trainer; a lock another trainer thread held
        # at the fork would never be released in the worker (see `shardcache.forksafe`).
        self._state_lock = threading.Lock()

    # -- pickling: DataLoader workers get a copy without the parent's sockets and locks --------------------

    def __getstate__(self) -> dict[str, Any]:
        keep = (
            "discovery",
            "socket",
            "system_socket",
            "required",
            "timeout",
            "handoff",
            "reprobe_interval",
            "restart_wait_s",
            "disk_full_retry_s",
        )
        return {name: self.__dict__[name] for name in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    def __repr__(self) -> str:
        return f"DaemonClient(socket={self.socket!r}, required={self.required}, handoff={self.handoff!r})"

    # -- the hot path ---------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def open(
        self, url: str, *, plan: str | None = None, size: int | None = None, checksum: str | None = None
    ) -> Iterator[BinaryIO]:
        """Open a shard for reading, through the daemon's cache.

        Yields a real file (with `fileno()`, so it can be mmap-ed) when the daemon's path is visible, a
        streamed answer otherwise, or the URL read directly (fsspec) when no daemon answers and the client
        is not `required`. A daemon restart (503 shutting_down, or the socket gone after the daemon
        answered) during the open or while a streamed answer starts is waited out (`restart_wait_s`).

        Args:
            url: the shard: an fsspec URL or a local path.
            plan: the plan id (from `register_plan`) this open belongs to, so the daemon advances its cursor.
            size: the expected size in bytes, checked by the daemon after a download.
            checksum: the expected checksum, `"<algo>:<hex>"`, checked by the daemon after a download.

        Raises:
            DaemonUnavailable: no daemon answers (within `restart_wait_s`) and `required=True`.
            InsufficientCapacity: the cache cannot hold the shard and `required=True` (an `auto` client
                reads it directly).
            NotAllowed, RemoteNotFound, RemoteFailed, BadRequest: the daemon refused; the message names the
                URL.
        """
        grant = self._acquire(url, plan, size, checksum)
        if grant is None:
            with open_direct(url) as direct:
                yield direct
            return
        opened = time.monotonic()
        try:
            with self._open_granted(url, grant.path) as handle:
                yield handle
        finally:
            # The lease ends only after the file is closed, so the daemon counts the bytes until then.
            self._release(grant.lease, time.monotonic() - opened)

    def _acquire(
        self, url: str, plan: str | None, size: int | None, checksum: str | None
    ) -> OpenGrant | None:
        """Ask the daemon for the shard; its grant (`path`, `lease`, ...), or None to read directly."""
        if self._disk_full.skip_daemon() or self._pinned.skip_daemon():
            return None  # the cache filesystem was full, or pinned, moments ago
        body: dict[str, object] = {"url": url}
        if plan is not None:
            body["plan"] = plan
        if size is not None:
            body["size"] = size
        if checksum is not None:
            body["checksum"] = checksum
        path = f"{_V1}/shards/open"

        def send(session: str | None) -> Response:
            return self._transport.request("POST", path, {**body, "session": session} if session else body)

        try:
            grant = self._through_restarts(
                lambda: parse_grant(self._in_session(send).raise_for_status(url), url)
            )
        except InsufficientCapacity as exc:
            self._cannot_fit(url, exc)
            return None
        if grant is not None:
            self._disk_full.served()
            self._pinned.served()
        return grant

    def _cannot_fit(self, url: str, exc: InsufficientCapacity) -> None:
        """A shard the cache cannot hold (507): read it directly (`auto`), or say how to size the cache.

        A full cache filesystem (`cache_disk_full`) is not about this shard: an `auto` client then reads
        every shard directly for `disk_full_retry_s` without asking (`direct.DiskFullMemory`). Neither is a
        cache pinned by open shards (`cache_pinned`): read directly for `PINNED_RETRY_S` (5 s).
        """
        if exc.code == DISK_FULL_CODE and not self.required:
            self._disk_full.refused(url, exc)
            return
        if exc.code == PINNED_CODE and not self.required:
            self._pinned.refused(url, exc)
            return
        first, self._warned_capacity = not self._warned_capacity, True
        cannot_fit(url, exc, required=self.required, first=first)

    def _open_granted(self, url: str, path: str) -> contextlib.AbstractContextManager[BinaryIO]:
        if self.handoff != "stream":
            try:
                return open(path, "rb")  # noqa: SIM115 - the caller's `with` closes it
            except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
                if self.handoff == "path":
                    raise
                if not self._warned_path:
                    self._warned_path = True
                    logger.warning(
                        "cannot open the daemon's cached file %s (%s); streaming shards over the socket "
                        "instead, which is much slower. Mount the daemon's cache directory into this "
                        "container at the same path to read shards in place.",
                        path,
                        exc.strerror,
                    )
        # The stream is a request of its own: a daemon restarted since the grant is waited for like an
        # open (`restart_wait_s`), and an `auto` client whose daemon does not come back reads directly.
        streamed = self._through_restarts(lambda: self.stream(url))
        if streamed is None:
            return open_direct(url)
        return contextlib.closing(streamed)

    def stream(self, url: str) -> BinaryIO:
        """The shard's bytes streamed by the daemon (`GET /v1/shards/data`); close the result when done.

        Raises:
            DaemonUnavailable: no daemon answers.
            NotAllowed, RemoteNotFound, ...: the daemon refused; the message names the URL.
        """
        answer = self._transport.stream(f"{_V1}/shards/data?url={_quote(url)}")
        if answer.status != 200:
            try:
                Response(answer.status, answer.read()).raise_for_status(url)
            finally:
                answer.close()
        return cast(BinaryIO, answer)

    @contextlib.contextmanager
    def local_path(
        self, url: str, *, plan: str | None = None, size: int | None = None, checksum: str | None = None
    ) -> Iterator[str | None]:
        """The daemon's local path of a shard, leased (not deleted) until the block ends.

        Yields None when no daemon answers and the client is not `required`; read the URL directly then.
        Arguments and errors as for `open`.
        """
        grant = self._acquire(url, plan, size, checksum)
        if grant is None:
            yield None
            return
        opened = time.monotonic()
        try:
            yield grant.path
        finally:
            self._release(grant.lease, time.monotonic() - opened)

    def _release(self, lease: str, held_s: float) -> None:
        """End a lease without waiting for the daemon's answer.

        A shard held briefly means shards are opened in a tight loop: the release rides on the next open
        (a header), one request per shard instead of two. A shard held longer is released at once by a
        request whose answer is read during the next one. A reader that closes a shard quickly and then
        stops opening keeps it leased until its next request, `close()`, or the daemon's lease TTL.
        """
        if held_s < PIGGYBACK_WITHIN_S:
            self._transport.hold_release(lease)
        else:
            self._transport.send_deferred("POST", f"{_V1}/shards/release", {"lease": lease})

    def _in_session(self, send: Callable[[str | None], Response]) -> Response:
        """`send(session)`'s answer, naming this process's session (None with a daemon that has none).

        An error answer to a request that named a session is checked: when the daemon no longer knows the
        session (it restarted: 404 `unknown_session`) or ended it (it stopped), the request is sent again
        in a new session. A lease or plan is never taken outside a session the daemon knows, so it always
        ends with this process.
        """
        session = self._session.current(self.timeout)
        answer = send(session)
        if session is not None and answer.status >= 400 and self._session.gone(answer):
            self._session.lost(session)
            answer = send(self._session.current(self.timeout))
        return answer

    # -- connections (availability and restarts: `availability`) ------------------------------

    @property
    def generation(self) -> int:
        """How many connections to the daemon this client has opened (in any thread of this process).

        Plans are soft state in the daemon: one that was killed and came back has forgotten them, and a
        client that fell back to direct reads registered none. Either way the next request runs on a new
        connection, so a reader that remembers this number when it registers its plans knows, with one
        comparison per shard, when to register them again. A keep-alive connection the daemon closed
        while idle also counts; registering again is harmless then (the daemon keeps identical plans).
        """
        return self._transport.connects

    # -- control plane --------------------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: object = None, url: str | None = None) -> JSONValue:
        answer = self._control.request(method, path, body, headers=self._held_releases())
        self._came_up()
        return answer.raise_for_status(url).json()

    def _held_releases(self) -> dict[str, str] | None:
        """The leases this thread still holds, as the `Shardcache-Release` header of a control request.

        Every request ends the leases of shards closed just before it, whichever transport carries it.
        """
        held = self._transport.take_releases()
        return {RELEASE_HEADER: ",".join(held)} if held else None

    def register_plan(
        self,
        job: str,
        slot: int,
        epoch: int,
        urls: Sequence[str],
        *,
        ahead: bool = False,
        immutable: bool = False,
    ) -> str | None:
        """Announce the ordered shards one slot reads in one epoch; the plan id, or None without a daemon.

        Urls given as positions in a shard list (`ListedUrls`) go in the compact form: the plan names
        positions in the list, which is uploaded (`PUT /v1/shardlists/{digest}`) only when the daemon
        answers that it does not hold it: once per node and job, whatever the ranks and workers, and again
        after a restart of the daemon. A daemon without shard lists gets the urls themselves.

        `ahead`: a plan for later (the next epoch), registered from another thread than the one opening
        shards: it goes over the control connection only, so it opens no connection that `generation`
        would count as a reconnect. `immutable`: the shards are never rewritten in place; the daemon serves
        its cached copies to the plan without checking the remote. A daemon older than that field refuses
        it (422): the plan is then registered without it, and later ones never offer it.

        Raises:
            DaemonUnavailable: no daemon answers and `required=True`.
            BadRequest: the daemon rejected the plan.
        """
        # Fields beside the urls: `immutable` only when true (what an older daemon can refuse), and the
        # process's session, added per attempt (a restarted daemon gives a new one).
        fields: dict[str, object] = {"immutable": True} if immutable and self._takes_immutable else {}

        def register(session: str | None) -> Response:
            named = {**fields, "session": session} if session else fields
            if isinstance(urls, ListedUrls) and not self._shardlists_refused:
                listed = self._send_listed(job, slot, epoch, urls, named)
                if listed is not None:
                    return listed
            body = {"job": job, "slot": slot, "epoch": epoch, "urls": list(urls), **named}
            return self._control.request("POST", f"{_V1}/plans", body, headers=self._held_releases())

        def send() -> Response:
            # The plan belongs to the current `generation`: the open path's connection is made first, so the
            # open that follows this registration does not look like a reconnect to a restarted daemon.
            if not ahead:
                self._transport.connect()
            answer = self._in_session(register)
            if answer.status == 422 and "immutable" in fields and b"immutable" in answer.body:
                logger.info(
                    "the daemon at %s is older than immutable plans; registering without (it checks the "
                    "remote only after --revalidate-after-s anyway)",
                    self.socket,
                )
                self._takes_immutable = False
                del fields["immutable"]
                answer = self._in_session(register)
            return answer

        answer = self._through_restarts(lambda: send().raise_for_status())
        if answer is None:
            return None
        return str(PlanResponse.model_validate(answer.json()).plan)

    def _send_listed(
        self, job: str, slot: int, epoch: int, urls: ListedUrls, fields: dict[str, object]
    ) -> Response | None:
        """Register a plan over its shard list (with `fields`: its session, immutable), uploading the list
        when the daemon lacks it (the first plan of a job on the node, or the daemon restarted); None when
        the daemon has no shard lists (an older one: it refuses the form and has no upload route), to send
        the urls instead."""
        shards = urls.shards
        digest = shards.urls_digest
        positions = base64.b64encode(urls.positions.astype("<i4").tobytes()).decode("ascii")
        body = {
            "job": job,
            "slot": slot,
            "epoch": epoch,
            "shardlist": digest,
            "positions": positions,
            **fields,
        }
        answer = self._control.request("POST", f"{_V1}/plans", body, headers=self._held_releases())
        unknown = answer.status == 404 and _error_code(answer) == UNKNOWN_SHARDLIST
        if unknown or (answer.status == 422 and digest not in self._shardlists_uploaded):
            put = self._control.request(
                "PUT", f"{_V1}/shardlists/{digest}", content=shards.urls_blob, headers=self._held_releases()
            )
            if put.status in (404, 405):
                logger.info("shardcached has no shard lists (an older daemon): plans go as url lists")
                self._shardlists_refused = True
                return None
            put.raise_for_status()
            self._shardlists_uploaded.add(digest)
            answer = self._control.request("POST", f"{_V1}/plans", body, headers=self._held_releases())
        return answer

    def delete_plan(self, plan_id: str) -> None:
        """Withdraw a plan; quiet when no daemon answers or it no longer knows the plan (it restarted)."""
        try:
            self._call("DELETE", f"{_V1}/plans/{_quote(plan_id)}")
        except (DaemonUnavailable, RemoteNotFound) as exc:
            logger.debug("plan %s not deleted: %s", plan_id, exc)

    def plans(self) -> list[JSONObject]:
        """The live plans (`GET /v1/plans`): id, job, slot, epoch, cursor, len, pace; for debugging."""
        answer = self._call("GET", f"{_V1}/plans")
        return [plan for plan in answer if isinstance(plan, dict)] if isinstance(answer, list) else []

    def stats(self) -> Stats:
        """The daemon's counters (`GET /v1/stats`). Raises `DaemonUnavailable` when none answers."""
        return Stats.model_validate(self._call("GET", f"{_V1}/stats"))

    def telemetry(self, job: str | None = None) -> TelemetrySummary:
        """The trainers' reported figures per job (`GET /v1/telemetry`; `job`: that job only), stage times
        included. Raises `DaemonUnavailable` when none answers, `NotFound` from a daemon without the route."""
        query = "" if job is None else "?" + urllib.parse.urlencode({"job": job})
        return TelemetrySummary.model_validate(self._call("GET", f"{_V1}/telemetry{query}"))

    def shards(self) -> list[ShardInfo]:
        """The resident shards: url, size, last use, next planned use (`GET /v1/shards`, every page)."""
        shards: list[ShardInfo] = []
        path = f"{_V1}/shards"
        while True:
            answer = self._call("GET", path)
            if isinstance(answer, list):  # a daemon from before the listing had pages
                answer = {"shards": answer}
            page = ShardList.model_validate(answer)
            shards.extend(page.shards)
            if page.next_after is None:
                return shards
            path = f"{_V1}/shards?after={_quote(page.next_after)}"

    def prefetch(self, urls: Sequence[str]) -> None:
        """Ask the daemon to fetch shards in the background (`POST /v1/prefetch`); returns at once."""
        if urls:
            self._call("POST", f"{_V1}/prefetch", {"urls": list(urls)}, url=", ".join(urls[:3]))

    def evict(self, url: str) -> None:
        """Remove one shard from the cache (`DELETE /v1/shards?url=`)."""
        self._call("DELETE", f"{_V1}/shards?url={_quote(url)}", url=url)

    def revalidate(self, url: str) -> Revalidated:
        """Report a shard found corrupt (`POST /v1/shards/revalidate?url=`): the daemon compares its copy
        with the remote at once and drops it when the remote changed."""
        answer = self._call("POST", f"{_V1}/shards/revalidate?url={_quote(url)}", url=url)
        return Revalidated.model_validate(answer)

    def health(self) -> Health:
        """The daemon's health answer (`GET /v1/health`)."""
        return Health.model_validate(self._call("GET", f"{_V1}/health"))

    def close(self) -> None:
        """Close this thread's connection to the daemon (other threads' close when the threads end).

        The process's session stays (`session`): the plans this client registered stay with the process,
        and the daemon ends what the process still holds when the process ends."""
        self._transport.close()
        self._control.close()

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _quote(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _error_code(answer: Response) -> str | None:
    """The `error` code of an error answer's JSON body, None when it has none."""
    try:
        payload = answer.json()
    except ValueError:
        return None
    return str(payload.get("error")) if isinstance(payload, dict) else None
