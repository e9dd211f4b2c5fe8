"""`SourceSpec`: the frozen description of a source — its kind, shards, the user's options as given, an
optional explicit context, the daemon setting and the internal hints — and the keyword checks every kind
shares. What a source node reads with it is `sources.base`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardcache.context import RuntimeContext
from shardcache.errors import ConfigError, positive_int
from shardcache.formatting import callable_name
from shardcache.memo import IdentityMemo
from shardcache.shards import ShardRef, ShardTuple, urls_blob
from shardcache.sources.deal.schedule import order_neutral, shuffles_units
from shardcache.sources.kinds import kind_of
from shardcache.sources.opener import DaemonSetting
from shardcache.sources.options import PlanHints

ON_ERROR = ("raise", "skip")
_DESCRIPTIONS: IdentityMemo[str] = IdentityMemo()


# Rows per record batch of the tabular sources (parquet, lance) unless batch_size= says otherwise.
DEFAULT_BATCH_ROWS = 65536


def check_columns_and_batch_size(options: Mapping[str, object]) -> None:
    """Validate the `columns` and `batch_size` keyword arguments of the tabular sources (parquet, lance)."""
    columns = options.get("columns")
    if columns is not None and (isinstance(columns, str) or not isinstance(columns, Sequence)):
        raise ConfigError(f"columns={columns!r}: expected a list of column names or None")
    positive_int("batch_size", options.get("batch_size", DEFAULT_BATCH_ROWS))


def check_on_error(options: Mapping[str, object]) -> None:
    """Validate `on_error` ("raise" or "skip")."""
    if options.get("on_error", "raise") not in ON_ERROR:
        raise ConfigError(f"on_error={options['on_error']!r}: expected one of {ON_ERROR}")


@dataclass(frozen=True)
class SourceSpec:
    """A source: its kind, shards, the user's kind-specific options (as given: see `sources.options`), an
    optional explicit context, the daemon setting, and the internal fields features set (`hints`)."""

    kind: str
    shards: tuple[ShardRef, ...]
    options: Mapping[str, Any] = field(default_factory=dict)
    context: RuntimeContext | None = None
    daemon: DaemonSetting = "auto"
    hints: PlanHints = field(default_factory=PlanHints)

    def __post_init__(self) -> None:
        # The URL buffer is made here, in the process that builds the spec: DataLoader workers forked
        # later hash it instead of walking the refs (see `ShardTuple`); a spec made by `replace` keeps it.
        if not isinstance(self.shards, ShardTuple):
            object.__setattr__(self, "shards", ShardTuple(self.shards))
        urls_blob(self.shards)

    @property
    def resample(self) -> bool:
        return bool(self.options.get("resample", False))

    @property
    def shuffles_units(self) -> bool:
        """Whether the unit order is permuted per epoch (`shuffle_mode`, see `sources.deal.schedule`)."""
        return shuffles_units(self.kind, self.options)

    def describe(self) -> str:
        """A stable description (no object ids) used for state and cache fingerprints (memoised per spec:
        it lists every shard URL, and a resume checks it several times)."""
        return _DESCRIPTIONS.get(self, None, self._describe)

    def description_parts(self) -> tuple[str, bytes | None]:
        """`describe()` as its first line and the UTF-8 of the rest (None: no rest), without making the
        description: the rest is the shard list's URL buffer (`ShardTuple.urls_blob`), a hash of which
        touches no `ShardRef` (the fingerprint, the short description of `resume.check`)."""
        return self._head(), urls_blob(self.shards)

    def _describe(self) -> str:
        return f"{self._head()}\n{urls_blob(self.shards).decode()}"

    def _head(self) -> str:

        def show(value: object, name: str = "") -> str:
            canonical = kind_of(self.kind).shown(name, value)
            if canonical is not None:  # e.g. a chunk_shuffle dict, whatever its key order
                return canonical
            if callable(value):
                return callable_name(value)
            if isinstance(value, (list, tuple)):
                return "[" + ",".join(show(v) for v in value) + "]"
            return repr(value)

        # Credentials (lance storage_options) and options that leave the data and its order as their
        # default does (`schedule.order_neutral`) change neither the data nor the fingerprint; of the hints,
        # only those that choose samples (subset, filter) do, spelled as the keywords were.
        given = {**self.options, **self.hints.described()}
        shown = (
            k for k in sorted(given) if k != "storage_options" and not order_neutral(self.kind, k, given[k])
        )
        options = ",".join(f"{k}={show(given[k], k)}" for k in shown)
        return f"{self.kind}({options})"
