"""Sources: one module per kind. Each gives `check_options(options)` (the keywords, checked), its options
dataclass (a `sources.options.SourceOptions`) and a `SourceNode` subclass that reads with it."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from shardcache.errors import ConfigError
from shardcache.sources import jsonl, parquet, tars
from shardcache.sources.base import SourceNode
from shardcache.sources.deal.partition import Unit, check_partition_options
from shardcache.sources.deal.schedule import PLAN_OPTIONS, check_plan_options, check_shuffle_mode
from shardcache.sources.deal.subset import check_subset
from shardcache.sources.lance import source as lance
from shardcache.sources.spec import SourceSpec, check_on_error

# The shard kinds' partitioning options (`shardcache.sources.deal.partition`).
PARTITION_OPTIONS = ("placement", "even", "exchange")

# Every kind takes a row/unit subset (`shardcache.sources.deal.subset`, set by split() and sample()).
SUBSET_OPTIONS = ("subset",)

# kind -> (module, node class name, accepted keyword arguments besides context/daemon, data suffix)
_KINDS: dict[str, tuple[str, str, tuple[str, ...], str | None]] = {
    "tars": (
        "tars",
        "TarsSource",
        ("resample", "sidecars", "on_corrupt", "on_error", "shuffle_mode"),
        ".tar",
    ),
    "jsonl": ("jsonl", "JsonlSource", ("resample", "ref_fields", "on_error", "shuffle_mode"), ".jsonl"),
    "parquet": (
        "parquet",
        "ParquetSource",
        (
            "resample",
            "columns",
            "batch_size",
            "use_threads",
            "on_error",
            "shuffle_mode",
            "min_row_groups_per_chunk",
        ),
        ".parquet",
    ),
    "lance": (
        "lance",
        "LanceSource",
        (
            "resample",
            "columns",
            "batch_size",
            "read_batch_size",
            "shuffle_mode",
            "chunk_shuffle",
            "filter",
            "storage_options",
            "ref_columns",
        ),
        None,
    ),
}
_MODULES: dict[str, ModuleType] = {"tars": tars, "jsonl": jsonl, "parquet": parquet, "lance": lance}
ALIASES = {"tar": "tars"}
KINDS = tuple(_KINDS)


def canonical_kind(kind: Any) -> str:
    """The source kind a name stands for ("tar" is "tars"); ConfigError for unknown kinds."""
    name = ALIASES.get(kind, kind) if isinstance(kind, str) else kind
    if name not in _KINDS:
        raise ConfigError(f"source_kind={kind!r}: expected one of {', '.join(map(repr, KINDS))}")
    return str(name)


def data_suffix(kind: str) -> str | None:
    return _KINDS[kind][3]


def check_options(kind: str, options: dict[str, Any]) -> None:
    """Refuse unknown keyword arguments and bad values, naming the argument and what is accepted."""
    partition = PARTITION_OPTIONS if kind != "lance" else ("even",)  # lance cuts rows itself
    accepted = (*_KINDS[kind][2], *partition, *SUBSET_OPTIONS, *PLAN_OPTIONS)
    for name in options:
        if name not in accepted:
            raise ConfigError(
                f"from_source({kind!r}, ...): unknown argument {name}=; accepted: "
                f"context, daemon, {', '.join(accepted)}"
            )
    checker: Callable[[dict[str, Any]], None] = _MODULES[kind].check_options
    checker(options)
    check_shuffle_mode(kind, options)
    check_plan_options(options)
    check_partition_options(options)
    check_on_error(options)
    if "subset" in options:
        check_subset(options["subset"])


def node_class(kind: str) -> type[SourceNode]:
    cls: type[SourceNode] = getattr(_MODULES[kind], _KINDS[kind][1])
    return cls


__all__ = ["KINDS", "SourceNode", "SourceSpec", "Unit", "canonical_kind", "check_options", "node_class"]
