"""Lance `.cache()`: materialise expensive preprocessing once per node, with exact invalidation.

Modules: `identity` (checks and the plan fingerprint, from `fingerprint`), `build` (`materialise`: parts,
locks, merge), `pipeline` (iterating one part, leading maps in parallel via `parallel`), `codec` and
`writer` (samples to Lance and back), `store` (on-disk layout, atomic publication, `ls`/`rm`), `cli`.
Lance and pyarrow are imported only when a cache is built or read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from shardcache.cache.identity import validate_pre_cache
from shardcache.cache.store import CacheEntry, cache_ls, cache_rm
from shardcache.errors import ConfigError

if TYPE_CHECKING:
    from shardcache.cache.build import CacheOptions


@contextlib.contextmanager
def _needs_lance_extra() -> Iterator[None]:
    """Turn a missing pyarrow or pylance into a ConfigError that names the extra."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in ("pyarrow", "lance"):
            raise
        raise ConfigError(
            f".cache() needs pylance and pyarrow ({exc.name} is missing): pip install 'shardcache[lance]'"
        ) from exc


def materialise(pre: Any, context: Any, options: CacheOptions | dict[str, Any] | None = None) -> str:
    """Build (once, across processes) the cache entry of `pre`; return its local Lance dataset path.

    See `shardcache.cache.build.materialise`.
    """
    with _needs_lance_extra():
        from shardcache.cache.build import materialise as build

    return build(pre, context, options)


def read_rows(uri: str) -> Any:
    """Every sample of a cache dataset, decoded, in order (see `shardcache.cache.writer.read_rows`)."""
    with _needs_lance_extra():
        from shardcache.cache.writer import read_rows as read

    return read(uri)


def add_cache_subcommands(subparsers: Any) -> Any:
    """Add `shardcache cache ls | rm` (see `shardcache.cache.cli`)."""
    from shardcache.cache.cli import add_cache_subcommands as add

    return add(subparsers)


__all__ = [
    "CacheEntry",
    "add_cache_subcommands",
    "cache_ls",
    "cache_rm",
    "materialise",
    "read_rows",
    "validate_pre_cache",
]
