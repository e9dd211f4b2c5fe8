"""Sources: one module per kind. Each gives `check_options(options)` (the keywords, checked), its options
dataclass (a `sources.options.SourceOptions`) and a `SourceNode` subclass that reads with it."""

from __future__ import annotations

from typing import Any

from shardcache.errors import ConfigError
from shardcache.sources import jsonl, parquet, tars
from shardcache.sources.base import SourceNode
from shardcache.sources.deal.partition import Unit, check_partition_options
from shardcache.sources.deal.schedule import PLAN_OPTIONS, check_plan_options, check_shuffle_mode
from shardcache.sources.deal.subset import check_subset
from shardcache.sources.kinds import SourceKind, kind_of, register
from shardcache.sources.lance import source as lance
from shardcache.sources.spec import SourceSpec, check_on_error

# The shard kinds' partitioning options (`shardcache.sources.deal.partition`).
PARTITION_OPTIONS = ("placement", "even", "exchange")

# Every kind takes a row/unit subset (`shardcache.sources.deal.subset`, set by split() and sample()).
SUBSET_OPTIONS = ("subset",)

_NODES: dict[str, type[SourceNode]] = {}


def register_kind(kind: SourceKind, node: type[SourceNode]) -> None:
    """Make `Dataset.from_source(kind.name, ...)` read with `node`, its traits declared by `kind`."""
    register(kind)
    _NODES[kind.name] = node


# The kinds and their node classes: the one line a new kind adds (`shardcache.sources.kinds`).
register_kind(tars.KIND, tars.TarsSource)
register_kind(jsonl.KIND, jsonl.JsonlSource)
register_kind(parquet.KIND, parquet.ParquetSource)
register_kind(lance.KIND, lance.LanceSource)

ALIASES = {"tar": "tars"}
KINDS = tuple(_NODES)  # the built-in kinds


def canonical_kind(kind: object) -> str:
    """The source kind a name stands for ("tar" is "tars"); ConfigError for unknown kinds."""
    name = ALIASES.get(kind, kind) if isinstance(kind, str) else kind
    if name not in _NODES:
        raise ConfigError(f"source_kind={kind!r}: expected one of {', '.join(map(repr, _NODES))}")
    return str(name)


def check_options(kind: str, options: dict[str, Any]) -> None:
    """Refuse unknown keyword arguments and bad values, naming the argument and what is accepted."""
    traits = kind_of(kind)
    # A kind the deal does not partition cuts its rows itself: only even= applies to it.
    partition = PARTITION_OPTIONS if _NODES[kind].partitionable else ("even",)
    accepted = (*traits.options, *partition, *SUBSET_OPTIONS, *PLAN_OPTIONS)
    for name in options:
        if name not in accepted:
            raise ConfigError(
                f"from_source({kind!r}, ...): unknown argument {name}=; accepted: "
                f"context, daemon, {', '.join(accepted)}"
            )
    traits.check_options(options)
    check_shuffle_mode(kind, options)
    check_plan_options(options)
    check_partition_options(options)
    check_on_error(options)
    if "subset" in options:
        check_subset(options["subset"])


def node_class(kind: str) -> type[SourceNode]:
    return _NODES[kind]


__all__ = [
    "KINDS",
    "SourceKind",
    "SourceNode",
    "SourceSpec",
    "Unit",
    "canonical_kind",
    "check_options",
    "node_class",
    "register_kind",
]
