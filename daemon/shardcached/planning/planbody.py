"""A plan's or a prefetch's body, read in a worker thread: parsed, validated, bounded, canonicalised.

A million-url plan is 40 MB of JSON. `json.loads` and pydantic parse it in one C call that holds the GIL
(0.9 s and 2 s here): run from a worker thread they would still stop the event loop for that long. This
module reads the `urls` array one element at a time with a regex, so the GIL can pass to the loop between
elements, validates the urls in small batches with the wire model's `ShardUrl`, and the other fields with
the request's model (`PlanRequest`, `PrefetchRequest`). It stops reading past `max_urls` (a plan: 413,
naming `--max-plan-urls`). `POST /v1/prefetch` comes this way too, so no list of urls is checked on the loop.

A plan's urls are turned into ids (urltable.py) batch by batch as they are read, so no list of a million
strings ever exists: a garbage collection while a long plan is read walks at most one batch of them, and
the plan is two numpy arrays (plans.PlanArrays) made here, off the loop.

Example:
    >>> from shardcached.keys import AllowList
from shardcached.planning.plans import PlanArrays
from shardcached.planning.urltable import UrlTable
    >>> body = b'{"job": "j", "slot": 0, "epoch": 1, "urls": ["s3://b/x.tar", "s3://b/y.tar"]}'
    >>> plan = read_plan([body], AllowList(["s3://b"]), max_urls=10, table=UrlTable())
    >>> (plan.job, plan.slot, plan.epoch, plan.urls)
    ('j', 0, 1, ['s3://b/x.tar', 's3://b/y.tar'])
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, TypeAdapter, ValidationError

from shardcache_protocol import MAX_PLAN_URLS, PlanRequest, PrefetchRequest
from shardcache_protocol.models import ShardUrl
from shardcached.errors import DaemonError, DigestMismatch, Invalid, PlanTooLarge, validation_detail
from shardcached.keys import AllowList
from shardcached.planning.plans import PlanArrays
from shardcached.planning.shardlists import ShardListIds, ShardLists
from shardcached.planning.urltable import UrlTable

_BATCH = 2_000  # urls validated, canonicalised or hashed per C call (~1-3 ms of GIL each)
_WS = re.compile(rb"[ \t\n\r]*")
# One JSON string (escapes allowed) and the separator after it.
_STRING = re.compile(rb'"([^"\\\x00-\x1f]*(?:\\.[^"\\\x00-\x1f]*)*)"')
_SCALAR = re.compile(rb'"(?:[^"\\\x00-\x1f]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null')
# Up to _BATCH strings without escapes, each followed by a comma, in one C call (the common case, ~20x
# faster than one match per string; the GIL passes between runs): their text is then split by `findall`.
_PLAIN_RUN = re.compile(rb'(?:"[^"\\\x00-\x1f]*"[ \t\n\r]*,[ \t\n\r]*){1,%d}' % _BATCH)
_PLAIN_STRINGS = re.compile(r'"([^"]*)"')
_URLS = TypeAdapter(list[ShardUrl])
_Model = TypeVar("_Model", bound=BaseModel)


@dataclass(frozen=True)
class PlanBody:
    """A registration, ready for the planner: the plan's arrays of url ids and the urls' digest."""

    job: str
    slot: int
    epoch: int
    arrays: PlanArrays
    digest: str
    table: UrlTable
    session: str | None = None  # the session that holds the plan (sessions.py)
    immutable: bool = False  # its shards are never rewritten in place: no check against the remote

    @property
    def urls(self) -> list[str]:
        """The canonical urls, in order (made from the ids: for tests and small plans)."""
        return self.table.urls(self.arrays.ids)


def read_plan(
    chunks: Sequence[bytes],
    allow: AllowList,
    max_urls: int,
    table: UrlTable,
    shardlists: ShardLists | None = None,
) -> PlanBody:
    """Parse and check a `POST /v1/plans` body (blocking; run it in a worker thread): the urls get their
    ids in `table` as they are read; a plan over a shard list takes its ids from `shardlists`.

    Raises:
        Invalid: 422, the body is not JSON or does not match `PlanRequest`, or a position lies outside
            the shard list.
        NotFound: 404 `unknown_shardlist`, the plan names a shard list the daemon does not hold.
        PlanTooLarge: 413, more than `max_urls` urls.
        BadRequest, NotAllowed: a url is malformed or outside the allow-list (the message names it).
    """
    ids: list[npt.NDArray[np.int32]] = []
    head, digest = _read(
        chunks, allow, PlanRequest, max_urls, _too_long(max_urls), lambda batch: ids.append(table.ids(batch))
    )
    if head.shardlist is not None and head.positions is not None:
        listed = (shardlists or ShardLists()).get(head.shardlist)
        positions = _positions(head.positions, len(listed.ids), max_urls)
        arrays = listed.plan(positions)
        digest = hashlib.sha256(head.shardlist.encode() + positions.tobytes()).hexdigest()
    else:
        arrays = PlanArrays.of(np.concatenate(ids) if ids else np.empty(0, dtype=np.int32))
    return PlanBody(head.job, head.slot, head.epoch, arrays, digest, table, head.session, head.immutable)


def read_shardlist(
    chunks: Sequence[bytes], digest: str, allow: AllowList, max_urls: int, table: UrlTable
) -> ShardListIds:
    """Check a `PUT /v1/shardlists/{digest}` body (blocking, as `read_plan`): its sha256 is `digest`, and
    it is UTF-8 urls one per line, each valid and allow-listed; they get their ids in `table`.

    Raises:
        DigestMismatch: 409, the body's sha256 differs from the digest in the path.
        Invalid: 422, the body is not UTF-8 lines.
        PlanTooLarge: 413, more than `max_urls` urls.
        BadRequest, NotAllowed: as `read_plan`.
    """
    body = b"".join(chunks)
    found = hashlib.sha256(body).hexdigest()
    if found != digest:
        raise DigestMismatch(
            f"shard list {digest}: the body's sha256 is {found}; send the urls one per line, UTF-8, and "
            f"name the list by their sha256; see docs/api.md"
        )
    if body.endswith(b"\n"):
        body = body[:-1]
    # Where each line ends (its newline, or the body's end), found in one pass; lines are read in batches.
    ends = np.append(np.flatnonzero(np.frombuffer(body, dtype=np.uint8) == ord("\n")), len(body))
    count = len(ends) if body else 0
    if count > max_urls:
        raise _too_long(max_urls)()
    ids: list[npt.NDArray[np.int32]] = []
    batches = _Batches(allow, lambda batch: ids.append(table.ids(batch)))
    start = 0
    for first in range(0, count, _BATCH):
        stop = int(ends[min(first + _BATCH, count) - 1])
        try:
            batches.add(body[start:stop].decode("utf-8").split("\n"))
        except UnicodeDecodeError as exc:
            raise Invalid(f"shard list {digest}: not UTF-8 text ({exc}); see docs/api.md") from exc
        start = stop + 1
    batches.flush()
    return ShardListIds.of(digest, np.concatenate(ids) if ids else np.empty(0, dtype=np.int32))


def read_prefetch(chunks: Sequence[bytes], allow: AllowList) -> list[str]:
    """Parse and check a `POST /v1/prefetch` body (blocking, as `read_plan`): its canonical urls.

    Raises:
        Invalid: 422, the body is not JSON, does not match `PrefetchRequest` or names more than
            `MAX_PLAN_URLS` urls.
        BadRequest, NotAllowed: as `read_plan`.
    """

    def too_large() -> DaemonError:
        return Invalid(f"urls: at most {MAX_PLAN_URLS} urls per prefetch; send several; see docs/api.md")

    urls: list[str] = []
    _read(chunks, allow, PrefetchRequest, MAX_PLAN_URLS, too_large, urls.extend)
    return urls


class _Batches:
    """Url strings as they are read, handed on `_BATCH` at a time: validated, canonicalised, then sunk."""

    def __init__(self, allow: AllowList, sink: Callable[[list[str]], object]) -> None:
        self.allow = allow
        self.sink = sink
        self.pending: list[str] = []
        self.count = 0  # urls read so far
        self.first: str | None = None
        self.digest = hashlib.sha256()

    def add(self, urls: list[str]) -> None:
        if self.first is None and urls:
            self.first = urls[0]
        self.pending.extend(urls)
        self.count += len(urls)
        if len(self.pending) >= _BATCH:
            self.flush()

    def flush(self) -> None:
        batch, self.pending = self.pending, []
        if not batch:
            return
        start = self.count - len(batch)
        try:
            _URLS.validate_python(batch)
        except ValidationError as exc:
            errors = [{**e, "loc": ("urls", start + int(e["loc"][0]), *e["loc"][1:])} for e in exc.errors()]
            raise Invalid(validation_detail(errors)) from exc
        canonical = self.allow.check_many(batch)
        self.digest.update("\n".join(canonical).encode() + b"\n")
        self.sink(canonical)


def _read(
    chunks: Sequence[bytes],
    allow: AllowList,
    model: type[_Model],
    max_urls: int,
    too_large: Callable[[], DaemonError],
    sink: Callable[[list[str]], object],
) -> tuple[_Model, str]:
    """A body holding a `urls` array checked by `model`: the model (with only the first url) and the
    canonical urls' digest; the canonical urls go to `sink` in batches as they are read and checked."""
    body = b"".join(chunks)
    batches = _Batches(allow, sink)
    fields, has_urls = _parse(body, max_urls, too_large, batches)
    batches.flush()
    try:
        # The urls were checked in batches; the first one stands in for the rest (`min_length`).
        urls = {} if not has_urls else {"urls": [] if batches.first is None else [batches.first]}
        head = model.model_validate({**fields, **urls})
    except ValidationError as exc:
        raise Invalid(validation_detail(exc.errors())) from exc
    return head, batches.digest.hexdigest()


def _parse(
    body: bytes, max_urls: int, too_large: Callable[[], DaemonError], into: _Batches
) -> tuple[dict[str, Any], bool]:
    """The top-level object's scalar fields, and whether it has a `urls` array (read `into`)."""
    fields: dict[str, Any] = {}
    urls = False
    pos = _expect(body, _skip(body, 0), b"{")
    pos = _skip(body, pos)
    if body[pos : pos + 1] == b"}":
        return fields, urls
    while True:
        match = _STRING.match(body, pos)
        if match is None:
            raise _syntax(pos, "a field name")
        key = _string(match.group(0), pos)
        pos = _skip(body, _expect(body, _skip(body, match.end()), b":"))
        if key == "urls":
            pos = _urls(body, pos, max_urls, too_large, into)
            urls = True
        else:
            end = _plain_string_end(body, pos)
            if end is not None:
                fields[key] = _string(body[pos:end], pos)
                pos = end
            else:
                value = _SCALAR.match(body, pos)
                if value is None:
                    raise Invalid(f"{key}: expected a string or a number; see docs/api.md")
                fields[key] = json.loads(value.group(0))
                pos = value.end()
        pos = _skip(body, pos)
        if body[pos : pos + 1] == b",":
            pos = _skip(body, pos + 1)
            continue
        pos = _expect(body, pos, b"}")
        break
    if _skip(body, pos) != len(body):
        raise _syntax(pos, "the end of the body")
    return fields, urls


def _urls(body: bytes, pos: int, max_urls: int, too_large: Callable[[], DaemonError], urls: _Batches) -> int:
    """The strings of the array at `pos` added to `urls`; the position after the array."""
    pos = _skip(body, _expect(body, pos, b"["))
    if body[pos : pos + 1] == b"]":
        return pos + 1
    match_string, match_run, skip = _STRING.match, _PLAIN_RUN.match, _skip
    while True:
        run = match_run(body, pos)
        if run is not None:
            try:
                text = run.group(0).decode("utf-8")
            except UnicodeDecodeError:
                pass  # read one by one below, which names the position
            else:
                if urls.count + len(found := _PLAIN_STRINGS.findall(text)) > max_urls:
                    raise too_large()
                urls.add(found)
                pos = run.end()
                continue
        match = match_string(body, pos)
        if match is None:
            raise _syntax(pos, "a url string")
        raw = match.group(1)
        if urls.count + 1 > max_urls:
            raise too_large()
        urls.add([_string(match.group(0), pos) if b"\\" in raw else _utf8(raw, pos)])
        pos = skip(body, match.end())
        separator = body[pos : pos + 1]
        if separator == b"]":
            return pos + 1
        if separator != b",":
            raise _syntax(pos, "',' or ']' in urls")
        pos = skip(body, pos + 1)


def _too_long(max_urls: int) -> Callable[[], DaemonError]:
    def too_large() -> DaemonError:
        return PlanTooLarge(
            f"the plan names more than {max_urls} urls, the daemon's bound on a plan's length "
            f"(shardcached --max-plan-urls, SHARDCACHE_MAX_PLAN_URLS): register shorter plans "
            f"(e.g. Dataset.mini_epochs) or raise the bound"
        )

    return too_large


def _positions(text: str, length: int, max_urls: int) -> npt.NDArray[np.int32]:
    """A plan's positions in a shard list of `length` urls, from their base64 (int32, little-endian)."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise Invalid(f"positions: not base64 ({exc}); see docs/api.md") from exc
    if len(raw) % 4:
        raise Invalid("positions: the decoded length is not a multiple of 4 (int32 each); see docs/api.md")
    if len(raw) // 4 > max_urls:
        raise _too_long(max_urls)()
    positions = np.frombuffer(raw, dtype="<i4").astype(np.int32)
    if len(positions) and (int(positions.min()) < 0 or int(positions.max()) >= length):
        raise Invalid(f"positions: a position lies outside the shard list of {length} urls; see docs/api.md")
    return positions


def _plain_string_end(body: bytes, pos: int) -> int | None:
    """Where the JSON string at `pos` ends, when it holds no escape; None otherwise (or no string there).

    Found with two byte searches in C: the scalar pattern's alternation steps per character, which held the
    GIL for seconds over the megabytes of a plan's base64 positions."""
    if body[pos : pos + 1] != b'"':
        return None
    close = body.find(b'"', pos + 1)
    if close < 0 or body.find(b"\\", pos + 1, close) >= 0:
        return None
    return close + 1


def _string(token: bytes, pos: int) -> str:
    try:
        value = json.loads(token)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _syntax(pos, "a valid JSON string") from exc
    return str(value)


def _utf8(raw: bytes, pos: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _syntax(pos, "UTF-8 text") from exc


def _skip(body: bytes, pos: int) -> int:
    match = _WS.match(body, pos)
    return pos if match is None else match.end()


def _expect(body: bytes, pos: int, token: bytes) -> int:
    if body[pos : pos + 1] != token:
        raise _syntax(pos, repr(token.decode()))
    return pos + 1


def _syntax(pos: int, expected: str) -> Invalid:
    return Invalid(f"body: invalid JSON at byte {pos}: expected {expected}; see docs/api.md")
