"""`Dataset.resolve_ref(names)`: replace a lance source's reference columns by the values they reference.

The stage is a 1:1 stage over any samples (dicts, or lists of dicts after `.batch()`): it reads
`resolve_batch_size` samples ahead, fetches their values with one Lance `take` per reference dataset
(`shardcache.sources.lance.refs`: the columns, the tables, the lookup) and emits them in order. Its resume
state is its upstream's state at the start of the current read-ahead plus how many of it were emitted, so a
resume re-reads at most one read-ahead and skips what was emitted.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, TypedDict

from shardcache.errors import ConfigError, StateError, positive_int
from shardcache.node import Node, State
from shardcache.sources.kinds import kind_of, registered
from shardcache.sources.lance.refs import RefColumn, RefTable, check_index, parse_ref_columns, resolve_batch
from shardcache.stages.traits import StageTraits

if TYPE_CHECKING:
    from shardcache.context import RuntimeContext
    from shardcache.sources.spec import SourceSpec


@dataclass(frozen=True)
class ResolveRefStage(StageTraits):
    """The `resolve_ref()` stage: the reference columns it resolves and its read-ahead."""

    refs: tuple[RefColumn, ...]
    batch_size: int = 1024
    storage_options: Mapping[str, str] | None = field(default=None, compare=False)
    kind: ClassVar[str] = "resolve_ref"

    def node(self, up: Node, ctx: RuntimeContext) -> Node:
        return ResolveRefNode(up, self)

    def describe(self) -> str:
        # The read-ahead and credentials change no sample: they stay out of fingerprints.
        return f"resolve_ref({';'.join(ref.describe() for ref in self.refs)})"


class ResolveRefState(TypedDict):
    """A resolve_ref stage's state: the upstream state where its current read-ahead began, and the items
    of that read-ahead emitted."""

    up: State
    emitted: int


class ResolveRefNode(Node):
    def __init__(self, up: Node, stage: ResolveRefStage) -> None:
        super().__init__()
        self.up = up
        self.stage = stage
        self._mark: State | None = None  # upstream state at the start of the current read-ahead
        self._emitted = 0  # items of that read-ahead already emitted

    def gen(self) -> Iterator[object]:
        tables = [RefTable(ref, self.stage.storage_options) for ref in self.stage.refs]
        it = self.up.iterator()
        skip = self._emitted
        while True:
            mark = self.up.state_dict()
            batch = list(itertools.islice(it, self.stage.batch_size))
            if not batch:
                return
            resolve_batch(tables, batch)
            self._mark, self._emitted = mark, skip
            for item in batch[skip:]:
                self._emitted += 1
                yield item
            skip = 0

    def state_dict(self) -> ResolveRefState:
        if self._mark is None:
            return {"up": self.up.state_dict(), "emitted": self._emitted}
        return {"up": self._mark, "emitted": self._emitted}

    def load_state_dict(self, state: State) -> None:
        self._check_not_started()
        emitted = state.get("emitted") if isinstance(state, dict) else None
        up = state.get("up") if isinstance(state, dict) else None
        if not isinstance(emitted, int) or emitted < 0 or not isinstance(up, dict):
            raise StateError(f"resolve_ref resume state {state!r}: expected {{'up': {{...}}, 'emitted': n}}")
        self.up.load_state_dict(up)
        self._mark, self._emitted = up, emitted


def resolve_ref_stage(
    source: SourceSpec, names: str | Sequence[str], resolve_batch_size: int, index: object
) -> ResolveRefStage:
    """The stage `Dataset.resolve_ref(names, ...)` adds over a lance source with `ref_columns`."""
    kind = getattr(source, "kind", None)
    resolves = isinstance(kind, str) and kind in registered() and kind_of(kind).resolves_refs
    options = getattr(source, "options", {}) if resolves else {}
    configured = {ref.column: ref for ref in parse_ref_columns(options.get("ref_columns"))}
    wanted = [names] if isinstance(names, str) else list(names)
    if not wanted or not all(isinstance(n, str) and n for n in wanted):
        raise ConfigError(f"resolve_ref({names!r}): expected one or more column names")
    unknown = [n for n in dict.fromkeys(wanted) if n not in configured]
    if unknown:
        raise ConfigError(
            f"resolve_ref: {', '.join(map(repr, unknown))} not in the lance source's ref_columns "
            f"(configured: {sorted(configured) or 'none'}); pass ref_columns= to from_source('lance', ...)"
        )
    positive_int("resolve_batch_size", resolve_batch_size)
    check_index(index)
    storage = options.get("storage_options")
    # Versions are pinned here, as mvp-dataset does, so the pipeline resolves against one snapshot.
    refs = tuple(configured[n].pinned(storage) for n in dict.fromkeys(wanted))
    return ResolveRefStage(refs, resolve_batch_size, storage)
