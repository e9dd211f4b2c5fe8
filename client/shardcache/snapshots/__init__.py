"""Snapshots: what `Dataset.cache()` / `.snapshot()` materialise — expensive preprocessing written once per
node into a local Lance dataset, with exact invalidation.

"Snapshot" is this package's word for it, so that "cache" keeps meaning the node daemon's shard cache;
the public methods keep their names. Modules: `boundary` (the `.cache()` stage checked, and a pipeline cut
there), `snapshot` (`Dataset.snapshot`), `identity` (checks and the plan fingerprint, from
`fingerprint`), `build` (`materialise`: parts, locks, merge), `pipeline` (iterating one part, leading maps
in parallel via `parallel`), `writer` (samples to Lance and back, with `shardcache.sources.lance.codec`),
`store` (on-disk layout, atomic publication, `ls`/`rm`), `config` and `entries` (mvp-dataset's
`CacheConfig` and entry listing), `cli`. Lance and pyarrow are imported only when a snapshot is built or
read.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from shardcache.context import RuntimeContext
from shardcache.errors import ConfigError
from shardcache.snapshots import cli
from shardcache.snapshots.identity import validate_pre_cache
from shardcache.snapshots.store import CacheEntry, cache_ls, cache_rm
from shardcache.spec import NodeBuilder, PipelineSpec

if TYPE_CHECKING:
    from shardcache.snapshots.build import CacheOptions
    from shardcache.snapshots.cli import Subparsers


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


def materialise(
    pre: PipelineSpec,
    context: RuntimeContext,
    options: CacheOptions | dict[str, Any] | None,
    build_nodes: NodeBuilder,
) -> str:
    """Build (once, across processes) the cache entry of `pre`; return its local Lance dataset path.

    See `shardcache.snapshots.build.materialise`.
    """
    with _needs_lance_extra():
        # `build` and `writer` import pyarrow, an optional package (the lance extra): loaded on first use.
        from shardcache.snapshots import build

        return build.materialise(pre, context, options, build_nodes)


def read_rows(uri: str) -> Iterator[dict[str, Any]]:
    """Every sample of a cache dataset, decoded, in order (see `shardcache.snapshots.writer.read_rows`)."""
    with _needs_lance_extra():
        from shardcache.snapshots import writer

        return writer.read_rows(uri)


def add_cache_subcommands(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add `shardcache cache ls | rm` (see `shardcache.snapshots.cli`)."""
    return cli.add_cache_subcommands(subparsers)


__all__ = [
    "CacheEntry",
    "add_cache_subcommands",
    "cache_ls",
    "cache_rm",
    "materialise",
    "read_rows",
    "validate_pre_cache",
]
