"""Errors raised by the shardcache client.

ShardcacheError
├── ConfigError (also ValueError)        bad arguments: names the argument and the accepted values
│   ├── ArgumentTypeError (also TypeError)          an argument of the wrong type
│   ├── UnsupportedOperation (also NotImplementedError) a method this dataset's kind does not have
│   └── InvalidPredicate (also OSError)             a filter predicate Lance refuses
├── DaemonError                          the daemon could not serve a request
│   ├── DaemonUnavailable                no daemon answers on the socket
│   └── DaemonRequestError               the daemon answered with an error status
│       ├── BadRequest          400/422
│       ├── NotAllowed          403  the URL is outside the daemon's allow-list
│       ├── RemoteNotFound      404  the remote object does not exist (or unknown lease)
│       │   └── ShardNotFound (also FileNotFoundError)  the same, found reading the shard directly
│       ├── RemoteFailed        502  the remote failed after retries
│       │   └── RemoteAccessDenied (also PermissionError) no credentials or access refused, read directly
│       └── InsufficientCapacity 507 the shard cannot fit in the cache
├── ShardError                           a shard cannot be read
│   └── CorruptShardError                truncated or malformed shard (names the shard and member or line)
│       └── CorruptImageError            an image field `shardcache.images` cannot decode (names the sample)
├── CacheError                           Lance `.cache()` failures (lock timeouts, bad entries)
├── StateError (also ValueError)         a resume state does not fit this pipeline (alias: ResumeStateError)
├── UnsupportedResume (also RuntimeError) a stage or source cannot save or restore its position
└── LengthUnknown (also TypeError)       `len()` of a pass whose length is not known before reading
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable


class ShardcacheError(Exception):
    """Root of every error the shardcache client raises.

    `code` (keyword): a short, stable name of the failure, for programs and logs, e.g. "UnsupportedResume"
    or "ResumeIdentityMismatch" (mvp-dataset 0.2.3's error codes, which its users match on). When given,
    the message starts with it in brackets: ``[ResumeIdentityMismatch] resume state was taken ...``.
    """

    code: str | None = None

    def __init__(self, *args: object, code: str | None = None) -> None:
        if code is not None:
            args = (f"[{code}] {args[0]}", *args[1:]) if args else (f"[{code}]",)
            self.code = code
        super().__init__(*args)

    def __init_subclass__(cls, **kwargs: object) -> None:
        # torch's DataLoader re-raises a worker's exception as `type(exc)(message)` and falls back to a
        # RuntimeError when that call fails: every error whose constructor needs more than a message would
        # reach the trainer untyped (`except CorruptShardError` would miss it). Accept the message alone;
        # the fields the constructor would set from its parameters (`url`, `shard`, ...) are then None (the
        # message still names them).
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "_accepts_message", False):
            return
        fields = [
            name
            for name in inspect.signature(init).parameters
            if name != "self" and not hasattr(cls, name)  # a class-level `code` keeps its value
        ]

        @functools.wraps(init)
        def __init__(self: ShardcacheError, *args: object, **kw: object) -> None:
            try:
                init(self, *args, **kw)
            except TypeError:
                if kw or len(args) != 1 or not isinstance(args[0], str):
                    raise
                Exception.__init__(self, args[0])
                for name in fields:
                    setattr(self, name, None)

        __init__._accepts_message = True  # type: ignore[attr-defined]
        cls.__init__ = __init__  # type: ignore[method-assign]

    def __reduce__(self) -> tuple[Callable[..., ShardcacheError], tuple[object, ...]]:
        # Keeps `code` across pickling (DataLoader workers, multiprocessing), which passes only `args`.
        return _rebuild, (type(self), self.args, self.__dict__)


def _rebuild(
    cls: type[ShardcacheError], args: tuple[object, ...], state: dict[str, object]
) -> ShardcacheError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class ConfigError(ShardcacheError, ValueError):
    """A bad argument; the message names the argument and what is accepted."""


def positive_int(name: str, value: object, why: str = "") -> int:
    """`value` if it is an int >= 1, else ConfigError naming `name` (`why`: what the argument is for).

    A bool is an int subclass, but True as a size is a mistake, not 1: it is refused too.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r}: expected a positive integer (an integer >= 1){why}")
    return value


class ArgumentTypeError(ConfigError, TypeError):
    """An argument of the wrong type: a ConfigError that is also the TypeError mvp-dataset raises there."""


class UnsupportedOperation(ConfigError, NotImplementedError):
    """A method this dataset's kind does not have (`filter()` on jsonl): also NotImplementedError, as in
    mvp-dataset, so either `except` catches it."""


class InvalidPredicate(ConfigError, OSError):
    """A `filter()` predicate Lance refuses (an unknown column, bad SQL). Also an OSError: Lance itself raises
    OSError for it on some datasets (mvp-dataset lets that through), so code catching that keeps working."""


class DaemonError(ShardcacheError):
    """The daemon could not serve a request."""


START_DAEMON = "Start the daemon (`shardcached`), or point SHARDCACHE_SOCKET at its socket."


class DaemonUnavailable(DaemonError):
    """No daemon answers on the socket.

    Attributes:
        socket: the socket path that was tried.
        reason: why it failed, in words: "the socket does not exist", "connection refused (the daemon is
            not running)", "no answer within 600s", ... A command-line tool prints `socket` and `reason`
            with advice of its own (its flags) instead of the message, whose advice is for Python callers.
        advice: what to do, the end of the message.
    """

    def __init__(self, socket: str, reason: str, advice: str = START_DAEMON) -> None:
        super().__init__(f"no shardcached daemon answers on {socket}: {reason}. {advice}")
        self.socket = socket
        self.reason = reason
        self.advice = advice

    def __reduce__(self) -> tuple[type[DaemonUnavailable], tuple[str, str, str]]:
        return type(self), (self.socket, self.reason, self.advice)  # picklable across processes


class OutOfFileDescriptors(ShardcacheError, OSError):
    """This process has no file descriptor left (EMFILE/ENFILE) when it reached for the daemon's socket: a
    leak in the process (shards or iterators kept open), not a daemon that is down."""


class DaemonRequestError(DaemonError):
    """The daemon answered with an error status."""

    status: int = 0
    code: str  # the daemon's error code (shardcache_protocol.ErrorBody.code)

    def __init__(self, status: int, code: str, detail: str, url: str | None = None) -> None:
        where = f" ({url})" if url else ""
        super().__init__(f"shardcached answered {status} {code}{where}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.url = url


class BadRequest(DaemonRequestError):
    """400/422: the request was malformed."""


class NotAllowed(DaemonRequestError):
    """403: the URL is outside the daemon's allow-list (`shardcached --allow PREFIX`)."""


class RemoteNotFound(DaemonRequestError):
    """404: the remote object (or the lease) does not exist."""


class RemoteFailed(DaemonRequestError):
    """502: the remote failed after the daemon's retries."""


class ShardNotFound(RemoteNotFound, FileNotFoundError):
    """A shard read directly (no daemon, or a shard read around it) does not exist.

    The same type as the daemon's 404 (`except RemoteNotFound` catches both ways of reading, and
    `on_error="skip"` skips both), and still the FileNotFoundError code reading files expects.
    """

    def __init__(self, url: str, reason: str) -> None:
        detail = (
            f"{url} does not exist or is not a file: {reason}. Check the URL (and that the shard list is "
            f"current), or pass on_error='skip' to skip shards that are gone"
        )
        ShardcacheError.__init__(self, f"shard not found: {detail}")
        self.status, self.code, self.detail, self.url = 404, "remote_not_found", detail, url


class RemoteAccessDenied(RemoteFailed, PermissionError):
    """A shard read directly was refused: no credentials found, or the remote refused them.

    The same type as the daemon's 502 `remote_forbidden` (a RemoteFailed), and still a PermissionError.
    """

    def __init__(self, url: str, reason: str) -> None:
        detail = (
            f"the remote refused access to {url}: {reason}; check the credentials of this process "
            f"(AWS_* variables, ~/.aws, an instance role) or read through the daemon, which has its own"
        )
        ShardcacheError.__init__(self, f"cannot read shard: {detail}")
        self.status, self.code, self.detail, self.url = 502, "remote_forbidden", detail, url


class InsufficientCapacity(DaemonRequestError):
    """507: the shard is larger than the cache can hold."""


_BY_STATUS: dict[int, type[DaemonRequestError]] = {
    400: BadRequest,
    422: BadRequest,
    403: NotAllowed,
    404: RemoteNotFound,
    502: RemoteFailed,
    507: InsufficientCapacity,
}


def error_for_status(status: int, code: str, detail: str, url: str | None = None) -> DaemonRequestError:
    """Map a daemon error answer back to its typed exception."""
    return _BY_STATUS.get(status, DaemonRequestError)(status, code, detail, url)


class ShardError(ShardcacheError):
    """A shard cannot be read."""


class CorruptShardError(ShardError):
    """A shard is truncated or malformed."""

    def __init__(
        self,
        shard: str,
        detail: str,
        member: str | None = None,
        *,
        line: int | None = None,
        advice: str = "Re-create the shard",
    ) -> None:
        where = f" at member {member!r}" if member else ""
        where += f" at line {line}" if line is not None else ""
        super().__init__(
            f"corrupt shard {shard}{where}: {detail}. {advice}, or pass on_error='skip' "
            f"to skip the rest of a corrupt shard."
        )
        self.shard = shard
        self.detail = detail
        self.member = member
        self.line = line

    def with_advice(self, advice: str) -> CorruptShardError:
        """The same error, saying `advice` instead of "Re-create the shard"."""
        return CorruptShardError(self.shard, self.detail, self.member, line=self.line, advice=advice)


class CacheError(ShardcacheError):
    """A Lance `.cache()` entry could not be built or read."""


class StateError(ShardcacheError, ValueError):
    """A resume state does not fit this pipeline."""


ResumeStateError = StateError
"""mvp-dataset's name for `StateError`: `except ResumeStateError` catches every refused resume state."""


class UnsupportedResume(ShardcacheError, RuntimeError):
    """A stage or source cannot save or restore its position; the message names it and what to do.

    Its code is always "UnsupportedResume" (mvp-dataset's), so every message starts with it.
    """

    def __init__(self, *args: object, code: str | None = "UnsupportedResume") -> None:
        super().__init__(*args, code=code)


class LengthUnknown(ShardcacheError, TypeError):
    """`len()` of a Dataset or TorchLoader whose pass length is not known before reading; the message says
    what is missing and how to get it. A TypeError, as Python's `len()` raises for an object without a
    length: torch, Lightning and the Hugging Face Trainer then treat the loader as one without a length."""


class CorruptImageError(CorruptShardError):
    """An image field of a sample that `shardcache.images` cannot decode (truncated, not an image).

    Names the shard (`__shard__`, when the sample has it), the sample's `__key__` and the field; a
    CorruptShardError, so code that handles corrupt shards handles it too. Raised by the decode stage, after
    the source read the sample: the source's `on_error="skip"` does not see it; the decoder's own
    `on_error="skip"` drops the sample instead.

    Built with `CorruptImageError.of(shard, key, field, detail)`. The constructor takes the message alone, as
    torch's DataLoader rebuilds a worker's exception (`type(exc)(message)`): the trainer then gets this type
    (with `key` and `field` None, the message still naming them) rather than a RuntimeError.
    """

    def __init__(
        self,
        message: str,
        *,
        shard: str = "?",
        key: str | None = None,
        field: str | None = None,
        detail: str | None = None,
    ) -> None:
        ShardError.__init__(self, message)
        self.shard, self.detail, self.line = shard, detail if detail is not None else message, None
        self.member = f"{key}.{field}" if key is not None and field is not None else None
        self.key = key
        self.field = field

    @classmethod
    def of(cls, shard: str, key: str, field: str, detail: str) -> CorruptImageError:
        """The error for `sample[field]` of the sample `key` in `shard`, the codec's `detail` said."""
        return cls(
            f"corrupt image in shard {shard}, sample {key!r}, field {field!r}: {detail}. Re-create the "
            f"sample, or decode with on_error='skip' (`.assemble(decoder.each_epoch)`) to drop such samples.",
            shard=shard,
            key=key,
            field=field,
            detail=detail,
        )
