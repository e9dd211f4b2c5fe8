"""What code outside a source kind's own module may ask of the kind: each kind declares a `SourceKind`.

Dataset construction, the deal's shuffle modes and fingerprints, subsets, `Dataset.filter`, the snapshot
identity and the ref stage decide by these fields, never by the kind's name. A new kind is its module (its
node class, its `check_options` and its `SourceKind`) plus one registration line in `shardcache.sources`.
The registry is filled when `shardcache.sources` is imported, which Python does before any of its modules,
so every reader of `kind_of` finds it filled; this module imports nothing of the client so that the spec
and the deal below the kinds' modules can ask it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from shardcache.errors import ConfigError


def _no_option(name: str, value: object) -> bool:
    return False


def _as_given(name: str, value: object) -> str | None:
    return None


@dataclass(frozen=True)
class SourceKind:
    """One source kind's traits (the defaults are those of a kind of whole shards read through the deal)."""

    name: str
    # Its keyword arguments besides context/daemon and the options every kind takes (partition, subset, plan).
    options: tuple[str, ...]
    # Validates its own keyword arguments (ConfigError naming the argument).
    # (Any: a kind's own checker may take its options as a dict of whatever it reads.)
    check_options: Callable[[dict[str, Any]], None]
    # The suffix of its data files, which directories and globs list (None: it names datasets, not files).
    data_suffix: str | None
    # The deal's shuffle modes, the default first (None: the kind orders its own rows), and mvp-dataset's
    # error code for a refused one.
    unit_shuffle_modes: tuple[str, ...] | None = None
    shuffle_mode_code: str = "InvalidShuffleMode"
    # What split()/sample() cut: "shard" when called (whole shards), "row" in the kind's own reader,
    # "unit" in the deal's reader (weighted by each unit's count).
    subset_level: Literal["shard", "unit", "row"] = "unit"
    # Options of its own that read the same samples in the same order as leaving them out (kept out of
    # fingerprints), and how a fingerprint spells an option with several spellings (None: its repr).
    order_neutral: Callable[[str, object], bool] = _no_option
    shown: Callable[[str, object], str | None] = _as_given
    # Reads its URIs with its own object-store support (not through the daemon), and each dataset carries
    # its own version (what a snapshot's identity records instead of file stats).
    own_object_store: bool = False
    # `Dataset.filter` selects its rows.
    filters_rows: bool = False
    # Reference columns that `Dataset.resolve_ref` resolves (the `ref_columns` option).
    resolves_refs: bool = False


_KINDS: dict[str, SourceKind] = {}


def register(kind: SourceKind) -> None:
    _KINDS[kind.name] = kind


def kind_of(name: str) -> SourceKind:
    """The traits of the source kind `name` (ConfigError naming the kinds there are)."""
    try:
        return _KINDS[name]
    except KeyError:
        raise ConfigError(f"source_kind={name!r}: expected one of {', '.join(map(repr, _KINDS))}") from None


def registered() -> Mapping[str, SourceKind]:
    return _KINDS
