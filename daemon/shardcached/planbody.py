"""A plan's or a prefetch's body, read in a worker thread: parsed, validated, bounded, canonicalised.

A million-url plan is 40 MB of JSON. `json.loads` and pydantic parse it in one C call that holds the GIL
(0.9 s and 2 s here): run from a worker thread they would still stop the event loop for that long. This
module reads the `urls` array one element at a time with a regex, so the GIL can pass to the loop between
elements, validates the urls in small batches with the wire model's `ShardUrl`, and the other fields with
the request's model (`PlanRequest`, `PrefetchRequest`). It stops reading past `max_urls` (a plan: 413,
naming `--max-plan-urls`). `POST /v1/prefetch` comes this way too, so no list of urls is checked on the loop.

A long body (`freeze_bytes`, ~50k urls) freezes the garbage collector (`gc.freeze`, O(1)) once its two url
lists exist and before they grow: a collection triggered meanwhile by the event loop's own allocations
walked the half-built lists with the GIL held (a young collection of 235 ms wall, ~70 ms CPU, at 1M urls
here), and the first ones after the registration walked the finished list. Frozen, no collection walks them.

Example:
    >>> from shardcached.keys import AllowList
    >>> body = b'{"job": "j", "slot": 0, "epoch": 1, "urls": ["s3://b/x.tar", "s3://b/y.tar"]}'
    >>> plan = read_plan([body], AllowList(["s3://b"]), max_urls=10)
    >>> (plan.job, plan.slot, plan.epoch, plan.urls)
    ('j', 0, 1, ['s3://b/x.tar', 's3://b/y.tar'])
"""

from __future__ import annotations

import gc
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from shardcache_protocol import MAX_PLAN_URLS, PlanRequest, PrefetchRequest
from shardcache_protocol.models import ShardUrl
from shardcached.errors import DaemonError, Invalid, PlanTooLarge, validation_detail
from shardcached.keys import AllowList

_BATCH = 2_000  # urls validated, canonicalised or hashed per C call (~1-3 ms of GIL each)
FREEZE_BYTES = 2_000_000  # a body this long (~50k urls) freezes the collector before its lists grow
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
    """A registration, ready for the planner: canonical urls and their digest."""

    job: str
    slot: int
    epoch: int
    urls: list[str]
    digest: str
    session: str | None = None  # the session that holds the plan (sessions.py)
    immutable: bool = False


def read_plan(
    chunks: Sequence[bytes], allow: AllowList, max_urls: int, freeze_bytes: int = FREEZE_BYTES
) -> PlanBody:
    """Parse and check a `POST /v1/plans` body (blocking; run it in a worker thread; a body of at least
    `freeze_bytes` freezes the garbage collector first, see the module's docstring).

    Raises:
        Invalid: 422, the body is not JSON or does not match `PlanRequest`.
        PlanTooLarge: 413, more than `max_urls` urls.
        BadRequest, NotAllowed: a url is malformed or outside the allow-list (the message names it).
    """

    def too_large() -> DaemonError:
        return PlanTooLarge(
            f"the plan names more than {max_urls} urls, the daemon's bound on a plan's length "
            f"(shardcached --max-plan-urls, SHARDCACHE_MAX_PLAN_URLS): register shorter plans "
            f"(e.g. Dataset.mini_epochs) or raise the bound"
        )

    head, urls, digest = _read(chunks, allow, PlanRequest, max_urls, too_large, freeze_bytes)
    return PlanBody(head.job, head.slot, head.epoch, urls, digest, head.session, head.immutable)


def read_prefetch(chunks: Sequence[bytes], allow: AllowList) -> list[str]:
    """Parse and check a `POST /v1/prefetch` body (blocking, as `read_plan`): its canonical urls.

    Raises:
        Invalid: 422, the body is not JSON, does not match `PrefetchRequest` or names more than
            `MAX_PLAN_URLS` urls.
        BadRequest, NotAllowed: as `read_plan`.
    """

    def too_large() -> DaemonError:
        return Invalid(f"urls: at most {MAX_PLAN_URLS} urls per prefetch; send several; see docs/api.md")

    return _read(chunks, allow, PrefetchRequest, MAX_PLAN_URLS, too_large, FREEZE_BYTES)[1]


def _read(
    chunks: Sequence[bytes],
    allow: AllowList,
    model: type[_Model],
    max_urls: int,
    too_large: Callable[[], DaemonError],
    freeze_bytes: int,
) -> tuple[_Model, list[str], str]:
    """A body holding a `urls` array checked by `model`: the model (with only the first url), the
    canonical urls, and their digest. The urls are validated, canonicalised and hashed in batches."""
    body = b"".join(chunks)
    found: list[str] = []  # the urls as sent
    urls: list[str] = []  # canonical
    if len(body) >= freeze_bytes:
        gc.freeze()  # both lists exist, empty: no collection will walk them as they grow (module docstring)
    fields, raw_urls = _parse(body, max_urls, too_large, found)
    try:
        # The urls are checked below in batches; the first one stands in for the rest (`min_length`).
        head = model.model_validate({**fields, **({} if raw_urls is None else {"urls": raw_urls[:1]})})
    except ValidationError as exc:
        raise Invalid(validation_detail(exc.errors())) from exc
    digest = hashlib.sha256()
    pending = raw_urls or []
    # Batches are taken off the list's end, which drops their references as it goes: released at once
    # when this returns, a million references took 50 ms of GIL here (one cache miss each).
    pending.reverse()
    start = 0
    while pending:
        batch = pending[: -_BATCH - 1 : -1]  # the last _BATCH, in the order sent
        del pending[-_BATCH:]
        try:
            _URLS.validate_python(batch)
        except ValidationError as exc:
            errors = [{**e, "loc": ("urls", start + int(e["loc"][0]), *e["loc"][1:])} for e in exc.errors()]
            raise Invalid(validation_detail(errors)) from exc
        canonical = allow.check_many(batch)
        digest.update("\n".join(canonical).encode() + b"\n")
        urls.extend(canonical)
        start += len(batch)
    return head, urls, digest.hexdigest()


def _parse(
    body: bytes, max_urls: int, too_large: Callable[[], DaemonError], into: list[str]
) -> tuple[dict[str, Any], list[str] | None]:
    """The top-level object's scalar fields, and its `urls` array read `into` (None when absent)."""
    fields: dict[str, Any] = {}
    urls: list[str] | None = None
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
            urls, pos = _urls(body, pos, max_urls, too_large, into)
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


def _urls(
    body: bytes, pos: int, max_urls: int, too_large: Callable[[], DaemonError], urls: list[str]
) -> tuple[list[str], int]:
    """The strings of the array at `pos` appended to `urls` (empty), and the position after the array."""
    pos = _skip(body, _expect(body, pos, b"["))
    if body[pos : pos + 1] == b"]":
        return urls, pos + 1
    match_string, match_run, skip, append = _STRING.match, _PLAIN_RUN.match, _skip, urls.append
    while True:
        run = match_run(body, pos)
        if run is not None:
            try:
                text = run.group(0).decode("utf-8")
            except UnicodeDecodeError:
                pass  # read one by one below, which names the position
            else:
                urls.extend(_PLAIN_STRINGS.findall(text))
                if len(urls) > max_urls:
                    raise too_large()
                pos = run.end()
                continue
        match = match_string(body, pos)
        if match is None:
            raise _syntax(pos, "a url string")
        raw = match.group(1)
        append(_string(match.group(0), pos) if b"\\" in raw else _utf8(raw, pos))
        if len(urls) > max_urls:
            raise too_large()
        pos = skip(body, match.end())
        separator = body[pos : pos + 1]
        if separator == b"]":
            return urls, pos + 1
        if separator != b",":
            raise _syntax(pos, "',' or ']' in urls")
        pos = skip(body, pos + 1)


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
