"""`materialise`: build (or find) the Lance dataset holding everything before a `.cache()` boundary.

Parts: the pre-cache pipeline is cut into one part per data-parallel slot (dp_rank k of dp_size D). Part k
is what the pipeline yields for a context with rank k of D and a single worker, so the source gives every
row to exactly one part, and tensor-parallel co-members (same dp_rank) want the same part. Each part is
built by one process under an exclusive lock; the others wait for it.

Who builds: a process builds its own dp_rank's part first, then any other part whose lock is free, then
waits for the parts being built elsewhere. Taking free parts guarantees progress when ranks are simulated
in one process, and when the cache directory is node-local in a multi-node job (every node then holds the
whole dataset, built in parallel by its own processes). Rows are still written exactly once: a part is
published by one rename, and a holder of its lock rebuilds only a part that is not published.

Merge: the parts, in numeric slot order, are copied into one dataset with `max_rows_per_fragment` rows per
fragment, its row count checked against the parts', and published atomically; the parts are then removed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardcache.context import RuntimeContext
from shardcache.durable import publish, read_json, write_json_atomic
from shardcache.errors import CacheError, ConfigError, positive_int
from shardcache.formatting import callable_name
from shardcache.snapshots.config import TIMEOUT_ENV, resolve_timeout_s
from shardcache.snapshots.identity import (
    describe_plan,
    plan_fingerprint,
    provided_fingerprint,
    validate_pre_cache,
)
from shardcache.snapshots.pipeline import dict_samples, iterate_part, source_metadata_aliased
from shardcache.snapshots.store import (
    DATA,
    DATASET_MARKER,
    PART_MARKER,
    EntryPaths,
    resolve_cache_root,
)
from shardcache.snapshots.writer import _lance, read_rows, write_rows
from shardcache.sources.lance.codec import RowEncoder
from shardcache.sources.lance.rows import Row
from shardcache.spec import NodeBuilder, PipelineSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CacheOptions:
    """`.cache()`'s options.

    Args:
        cache_dir: Cache root (None or ".cache": `$SHARDCACHE_CACHE_DIR`, else `.cache`).
        cache_num_workers: Processes running the leading `map` stages.
        cache_write_batch_size: Rows per batch written to Lance.
        max_rows_per_fragment: Rows per Lance fragment of the merged dataset.
        cache_timeout: Seconds to wait for parts other processes are building (default
            `$SHARDCACHE_CACHE_TIMEOUT`, else `$MVP_DATASET_CACHE_WAIT_TIMEOUT_SECONDS`, else 6 hours).
        fingerprint_provider: `snapshot(fingerprint_provider=...)`: names the entry instead of the plan.
        frozen: Set by `.cache()`, not a user option: the fingerprints of the lambdas and local closures
            before the boundary, taken when `.cache()` was called (`identity.frozen_identities`).
        snapshot: Set by `snapshot()`, not a user option: the entry's name, fixed when `snapshot()` was
            called (the source is not read again), with mvp-dataset's snapshot rows
            (`pipeline.source_metadata_aliased`).
    """

    cache_dir: str | os.PathLike[str] | None = None
    cache_num_workers: int = 1
    cache_write_batch_size: int = 1024
    max_rows_per_fragment: int = 5000
    cache_timeout: float | None = None
    fingerprint_provider: Callable[[], str] | None = None
    frozen: tuple[str | None, ...] = ()
    snapshot: str | None = None

    def __post_init__(self) -> None:
        if self.fingerprint_provider is not None and not callable(self.fingerprint_provider):
            raise ConfigError(
                f"snapshot(fingerprint_provider={self.fingerprint_provider!r}): expected a callable "
                "taking no argument and returning a non-empty string"
            )
        for name in ("cache_num_workers", "cache_write_batch_size", "max_rows_per_fragment"):
            positive_int(name, getattr(self, name), " (an argument of .cache())")
        if self.cache_timeout is not None and not self.cache_timeout > 0:
            raise ConfigError(
                f".cache(cache_timeout={self.cache_timeout!r}): must be a number of seconds > 0"
            )

    @classmethod
    def coerce(cls, options: CacheOptions | Mapping[str, Any] | None) -> CacheOptions:
        """Options from a CacheOptions, a mapping of `.cache()` keyword arguments, or None."""
        if options is None:
            return cls()
        if isinstance(options, CacheOptions):
            return options
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f".cache() got unknown options {unknown}; accepted: {sorted(known)}")
        return cls(**dict(options))

    def timeout_s(self) -> float:
        if self.cache_timeout is not None:
            return float(self.cache_timeout)
        return resolve_timeout_s()


def materialise(
    pre: PipelineSpec,
    context: RuntimeContext,
    options: CacheOptions | Mapping[str, Any] | None,
    build_nodes: NodeBuilder,
) -> str:
    """Build the cache entry of `pre` once (across processes), and return its local Lance dataset path.

    Args:
        pre: The pipeline of every stage before the (last) `.cache()`.
        context: The caller's runtime context; its dp_rank and dp_size decide the parts.
        options: `.cache()`'s options.
        build_nodes: Builds a pipeline's nodes (`shardcache.pipeline.build.build`), for a `pre` that has
            an earlier `.cache()` boundary of its own.

    Returns:
        The path of the merged Lance dataset (read it back in order; see `shardcache.snapshots.read_rows`).

    Raises:
        ConfigError: The pipeline cannot be cached (see `validate_pre_cache`), or its source resamples.
        CacheError: Another process holds a part past the timeout, or a written dataset is incomplete.
    """
    opts = CacheOptions.coerce(options)
    provider = opts.fingerprint_provider
    validate_pre_cache(pre.stages, warn=False)
    if pre.source.resample:
        raise ConfigError(
            ".cache() after a resampling source (resample=True) would never finish; drop resample"
        )
    if opts.snapshot is not None:
        # Named when snapshot() was called: a complete entry is read without touching the source.
        fingerprint = opts.snapshot
        shown = {"fingerprint_provider": callable_name(provider)} if provider is not None else {}
        description = describe_plan(pre.source, pre.stages, snapshot=True, **shown)
    elif provider is not None:
        fingerprint, description = provided_fingerprint(provider, pre.source, pre.stages)
    else:
        fingerprint, description = plan_fingerprint(pre.source, pre.stages, opts.frozen)
    entry = EntryPaths(resolve_cache_root(opts.cache_dir) / fingerprint)
    if entry.dataset_complete():
        return entry.dataset_uri
    entry.root.mkdir(parents=True, exist_ok=True)
    if not entry.description_file.exists():
        write_json_atomic(entry.description_file, description)
    deadline = time.monotonic() + opts.timeout_s()
    slots = int(context.dp_size)
    if not _build_parts(pre, context, entry, slots, opts, deadline, build_nodes):
        return entry.dataset_uri
    with entry.lock("merge") as lock:
        lock.acquire(deadline, f"the merged dataset of {entry.root}")
        if not entry.dataset_complete():
            _merge(entry, slots, opts, fingerprint)
    return entry.dataset_uri


def _build_parts(
    pre: PipelineSpec,
    context: RuntimeContext,
    entry: EntryPaths,
    slots: int,
    opts: CacheOptions,
    deadline: float,
    build_nodes: NodeBuilder,
) -> bool:
    """Make every part exist; False when the merged dataset appeared meanwhile (nothing left to do)."""
    own = int(context.dp_rank)
    pending = [(own + i) % slots for i in range(slots)]  # own part first, then the next slots round-robin
    delay = 0.01
    while pending:
        progressed = False
        for index in list(pending):
            if entry.dataset_complete():
                return False
            if entry.part_complete(slots, index):
                pending.remove(index)
                continue
            lock = entry.lock(f"part-{slots}-{index}")
            if not lock.try_acquire():
                continue  # another process builds it
            with lock:
                if entry.dataset_complete():
                    return False
                if not entry.part_complete(slots, index):
                    _build_part(pre, context, entry, slots, index, opts, build_nodes)
            pending.remove(index)
            progressed = True
        if pending and not progressed:
            if time.monotonic() >= deadline:
                raise CacheError(
                    f"timed out after {opts.timeout_s():.0f}s waiting for cache parts {pending} of "
                    f"{entry.root} that other processes are building. Raise cache_timeout= (or "
                    f"{TIMEOUT_ENV}), or stop the other job and run `shardcache cache rm {entry.fingerprint}`"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
    return True


def _build_part(
    pre: PipelineSpec,
    context: RuntimeContext,
    entry: EntryPaths,
    slots: int,
    index: int,
    opts: CacheOptions,
    build_nodes: NodeBuilder,
) -> None:
    label = f"part-{slots}-{index}"
    tmp = entry.new_tmp(label)
    started = time.monotonic()
    # Data-parallel rank `index` of `slots`, in the trainer's node groups (part r holds its node's share);
    # no workers, epoch 0. Not replace(): the trainer's node layout counts global ranks, not `slots`.
    part_context = RuntimeContext(
        rank=index, world_size=slots, num_nodes=context.node_groups, seed=context.seed
    )
    rows = dict_samples(iterate_part(pre, part_context, opts.cache_num_workers, build_nodes))
    if opts.snapshot is not None:
        rows = source_metadata_aliased(rows)
    result = write_rows(
        rows,
        str(tmp / DATA),
        batch_size=opts.cache_write_batch_size,
        max_rows_per_file=opts.max_rows_per_fragment,
    )
    _check_rows(tmp / DATA, result.rows)
    seconds = time.monotonic() - started
    write_json_atomic(
        tmp / PART_MARKER, {"rows": result.rows, "slot": index, "slots": slots, "seconds": seconds}
    )
    publish(tmp, entry.part_dir(slots, index))
    logger.info(
        "cache part %d/%d of %s: %d rows in %.1fs", index, slots, entry.fingerprint, result.rows, seconds
    )


def _check_rows(uri: Path, expected: int) -> int:
    dataset = _lance().dataset(str(uri))
    counted = dataset.count_rows()
    by_fragment = sum(fragment.count_rows() for fragment in dataset.get_fragments())
    if counted != expected or by_fragment != expected:
        raise CacheError(
            f"cache dataset {uri} holds {counted} rows ({by_fragment} over its fragments) but {expected} "
            f"were written; remove it with `shardcache cache rm` and retry"
        )
    return len(dataset.get_fragments())


def _merge(entry: EntryPaths, slots: int, opts: CacheOptions, fingerprint: str) -> None:
    lance = _lance()
    parts = [entry.part_dir(slots, index) for index in range(slots)]  # numeric order: slot 10 after slot 2
    counts = [int((read_json(part / PART_MARKER) or {}).get("rows", 0)) for part in parts]
    datasets = [lance.dataset(str(part / DATA)) for part in parts]
    total = sum(counts)
    tmp = entry.new_tmp("merge")
    target = str(tmp / DATA)
    schemas = [d.schema for d, n in zip(datasets, counts, strict=True) if n] or [datasets[0].schema]
    if all(schema == schemas[0] for schema in schemas):
        import pyarrow as pa

        def batches() -> Iterator[pa.RecordBatch]:
            for dataset, count in zip(datasets, counts, strict=True):
                if count:
                    yield from dataset.to_batches(scan_in_order=True)

        reader = pa.RecordBatchReader.from_batches(schemas[0], batches())
        lance.write_dataset(reader, target, mode="create", max_rows_per_file=opts.max_rows_per_fragment)
    else:  # parts chose different layouts for a field: re-encode into the union of their layouts

        def rows() -> Iterator[Row]:
            for part, count in zip(parts, counts, strict=True):
                if count:
                    yield from read_rows(str(part / DATA))

        write_rows(
            rows(),
            target,
            batch_size=opts.cache_write_batch_size,
            max_rows_per_file=opts.max_rows_per_fragment,
            encoder=RowEncoder.unify(schemas),
        )
    fragments = _check_rows(tmp / DATA, total)
    marker = {
        "rows": total,
        "parts": counts,
        "fragments": fragments,
        "fingerprint": fingerprint,
        "created": time.time(),
    }
    write_json_atomic(tmp / DATASET_MARKER, marker)
    publish(tmp, entry.dataset_dir)
    shutil.rmtree(entry.parts_dir(slots), ignore_errors=True)
    logger.info("cache %s merged: %d rows from %d parts, %d fragments", fingerprint, total, slots, fragments)
