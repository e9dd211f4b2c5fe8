"""`.cache(...)`: the boundary before which outputs are materialised once into a local Lance dataset.

This module holds only the stage spec; `shardcache.snapshots` (imported lazily) does the materialising.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from shardcache.context import RuntimeContext
from shardcache.errors import ConfigError
from shardcache.formatting import callable_name
from shardcache.node import Node
from shardcache.stages.traits import StageTraits

SNAPSHOT_SUBSET = "subset"
"""The option holding a split()/sample() step of the snapshot's own rows (`shardcache.pipeline.subsets`)."""

SNAPSHOT_IDENTITY = "snapshot"
"""The option `Dataset.snapshot()` sets (`.cache()` does not): the entry's name, fixed when `snapshot()` is
called, whose rows store upstream `__key__`/`__file__` as `__source_key__`/`__source_file__` and are read
back with fresh row metadata (`shardcache.snapshots.snapshot`)."""


@dataclass(frozen=True)
class CacheStage(StageTraits):
    """Materialise everything before this stage; the options are `.cache()`'s keyword arguments."""

    options: Mapping[str, Any] = field(default_factory=dict)  # `.cache()` keywords and internal keys
    kind: ClassVar[str] = "cache"
    before_cache: ClassVar[bool] = True

    def cache_identity(self, frozen: str | None = None) -> tuple[object, ...]:
        return ("cache",)

    def node(self, up: Node, ctx: RuntimeContext) -> Node:
        raise ConfigError("a cache stage is resolved by Dataset iteration, not built as a node")

    def describe(self) -> str:

        # Callables (snapshot's fingerprint_provider) by name: their repr holds an address.
        shown = [(k, callable_name(v) if callable(v) else v) for k, v in sorted(self.options.items())]
        return f"cache({shown})"
