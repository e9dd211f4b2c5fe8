"""What a cache entry is a function of: the checks on pre-cache stages and the plan fingerprint.

The fingerprint covers the source (kind, options, every shard's URL and its current version: the ETag, or
size and mtime; a Lance dataset's version) and every traceable stage before `.cache()`: `map` by its
function, `select` by its fields, `assemble` by its factory and `drop_last`. `shuffle` is left out on
purpose (it only reorders) and logged as a warning; `batch` and `unbatch` are refused. Lambdas and local
closures are accepted: their code and captured values are fingerprinted when `.cache()` is called
(`frozen_identities`), as mvp-dataset does at `snapshot()`.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import fsspec

from shardcache.errors import CacheError, ConfigError
from shardcache.node import JSONObject, JSONValue
from shardcache.shards import has_protocol, local_path
from shardcache.snapshots.fingerprint import Fingerprinter, fingerprint_of, is_local
from shardcache.sources.kinds import kind_of
from shardcache.stages.traits import StageTraits

if TYPE_CHECKING:
    from shardcache.sources.spec import SourceSpec

logger = logging.getLogger(__name__)

LAYOUT_VERSION = 1

# A shard's version as the fingerprint holds it: a tag ("etag", "size_mtime", ...) and what it read.
ShardVersion = tuple[object, ...]
_NOT_CONTENT_OPTIONS = frozenset({"context", "daemon"})


def _name(fn: object) -> str:
    return str(getattr(fn, "__qualname__", type(fn).__qualname__))


def validate_pre_cache(stages: Sequence[StageTraits], *, warn: bool = True) -> None:
    """Check that the stages before `.cache()` can be cached; log their trade-offs (a shuffle's).

    Args:
        stages: The stage specs before the cache boundary.
        warn: Log each stage's `before_cache_warning` (off when re-checking at iteration time).

    Raises:
        ConfigError: A `batch`/`unbatch` stage, or a stage kind that cannot go into a cache.
    """
    for stage in stages:
        kind = stage.kind
        if stage.batches is not None:
            raise ConfigError(
                f".{kind}() before .cache() is not supported: the cache stores samples, not batches. "
                f"Move .{kind}() after .cache()"
            )
        if not stage.before_cache:
            raise ConfigError(f"stage {kind!r} before .cache() is not supported")
        warning = stage.before_cache_warning() if warn else None
        if warning is not None:
            logger.warning("%s", warning)


def frozen_identities(stages: Sequence[StageTraits]) -> tuple[str | None, ...]:
    """The fingerprints, taken now, of the lambdas and local closures of `stages` (None for the others).

    `.cache()` calls it when it is called: a closure's captured values (a counter, a list it appends to)
    change while the pipeline runs, and would otherwise rename the entry on every pass. Module-level
    callables are fingerprinted at each build instead, so editing a global they read rebuilds the entry.
    """
    return tuple(
        fingerprint_of(fn) if (fn := stage.user_callable) is not None and is_local(fn) else None
        for stage in stages
    )


def _version_from_info(info: Mapping[str, object]) -> ShardVersion:
    for key in ("ETag", "etag", "e_tag"):
        if info.get(key):
            return ("etag", str(info[key]).strip('"'))
    for key in ("mtime", "LastModified", "last_modified", "updated", "modified", "created"):
        if info.get(key) is not None:
            return ("size_mtime", info.get("size"), str(info[key]))
    return ("size", info.get("size"))


def _local_version(path: str) -> ShardVersion:
    stat = os.stat(path)
    if not os.path.isdir(path):
        return ("size_mtime", stat.st_size, stat.st_mtime_ns)
    newest, total = stat.st_mtime_ns, 0
    for directory, _dirs, files in os.walk(path):
        for name in files:
            child = os.stat(os.path.join(directory, name))
            newest, total = max(newest, child.st_mtime_ns), total + child.st_size
    return ("tree", total, newest)


def _lance_version(url: str) -> ShardVersion:
    import lance

    dataset = lance.dataset(url)
    latest = dataset.versions()[-1]
    return ("lance", dataset.version, str(latest.get("timestamp")))


def shard_versions(urls: Sequence[str], kind: str) -> list[ShardVersion]:
    """The current version of every shard: one listing per remote directory, a stat per local file.

    Raises:
        CacheError: A shard's version cannot be read (names the URL).
    """
    versions: dict[str, ShardVersion] = {}
    remote: dict[str, list[str]] = defaultdict(list)
    for url in urls:
        try:
            if kind_of(kind).own_object_store:
                versions[url] = _lance_version(url)
            elif not has_protocol(url) or url.startswith("file://"):
                versions[url] = _local_version(local_path(url))
            else:
                remote[url.rsplit("/", 1)[0]].append(url)
        except (OSError, ValueError) as exc:
            raise CacheError(f"cannot read the version of {url} for the cache fingerprint: {exc}") from exc
    for parent, members in remote.items():
        versions.update(_remote_versions(parent, members))
    return [versions[url] for url in urls]


def _remote_versions(parent: str, urls: list[str]) -> dict[str, ShardVersion]:
    try:
        fs, parent_path = fsspec.core.url_to_fs(parent)
        # One listing answers for every shard of a directory; fall back to one info() per shard. The
        # listing cache of fsspec instances (shared per process) would hide a rewritten object.
        fs.invalidate_cache(parent_path)
        listing = {str(info["name"]).rstrip("/"): info for info in fs.ls(parent_path, detail=True)}
        out = {}
        for url in urls:
            path = fs._strip_protocol(url)
            info = listing.get(path) or fs.info(path)
            out[url] = _version_from_info(info)
        return out
    except Exception as exc:  # fsspec backends raise many types; all mean "version unknown"
        raise CacheError(
            f"cannot read the remote version of {urls[0]} (and {len(urls) - 1} more under {parent}) for the "
            f"cache fingerprint: {exc}. Check credentials and the endpoint (AWS_ENDPOINT_URL_S3)"
        ) from exc


def plan_fingerprint(
    source: SourceSpec, stages: Sequence[StageTraits], frozen: Sequence[str | None] = ()
) -> tuple[str, JSONObject]:
    """The fingerprint of a pre-cache pipeline, and a description of it for `shardcache cache ls`.

    Args:
        source: The pipeline's source spec (`kind`, `shards`, `options`).
        stages: The stage specs before the cache boundary.
        frozen: `frozen_identities(stages)` as taken by `.cache()` (empty: none frozen).
    """
    fingerprinter = Fingerprinter()
    fingerprinter.add(("shardcache.snapshots", LAYOUT_VERSION, source.kind))
    options = {k: v for k, v in dict(source.options).items() if k not in _NOT_CONTENT_OPTIONS}
    fingerprinter.add(options)
    urls = [ref.url for ref in source.shards]
    versions = shard_versions(urls, source.kind)
    for ref, version in zip(source.shards, versions, strict=True):
        fingerprinter.add((ref.url, ref.size, ref.checksum, version))
    for i, stage in enumerate(stages):
        token = stage.cache_identity(frozen[i] if i < len(frozen) else None)
        if token is not None:
            fingerprinter.add(token)
    return fingerprinter.hexdigest(), describe_plan(source, stages)


def describe_plan(source: SourceSpec, stages: Sequence[StageTraits], **extra: JSONValue) -> JSONObject:
    """What `shardcache cache ls` shows of an entry: the source, its shards, the stages (no I/O)."""
    return {
        "source": source.kind,
        "shards": len(source.shards),
        "first_shard": source.shards[0].url if source.shards else None,
        "stages": [stage.describe() if hasattr(stage, "describe") else stage.kind for stage in stages],
        **extra,
        "created": time.time(),
    }


def snapshot_entry_name(identity: str) -> str:
    """The entry name of a `snapshot()` whose upstream is named `identity` (a plan or provided fingerprint).

    A snapshot's rows differ from `.cache()`'s for the same pipeline (upstream `__key__`/`__file__` are
    stored as `__source_key__`/`__source_file__`), so the two must not share an entry.
    """
    fingerprinter = Fingerprinter()
    fingerprinter.add(("shardcache.snapshots", LAYOUT_VERSION, "snapshot-rows", "source-metadata-aliased"))
    fingerprinter.add(identity)
    return fingerprinter.hexdigest()


def provided_fingerprint(
    provider: Callable[[], object], source: SourceSpec, stages: Sequence[StageTraits]
) -> tuple[str, JSONObject]:
    """The fingerprint of an entry named by `snapshot(fingerprint_provider=...)`, and its description.

    The provider's string replaces the pipeline's identity: equal strings declare equal outputs, whatever
    the source and stages (the caller's promise, as in mvp-dataset's snapshot()).

    Raises:
        ConfigError: the provider does not return a non-empty string.
    """
    value = provider()
    if not isinstance(value, str) or not value:
        raise ConfigError(
            f"snapshot(fingerprint_provider=...) returned {value!r}: it must return a non-empty string"
        )
    fingerprinter = Fingerprinter()
    fingerprinter.add(("shardcache.snapshots", LAYOUT_VERSION, "provided", value))
    return fingerprinter.hexdigest(), describe_plan(source, stages, fingerprint_provider=value)
