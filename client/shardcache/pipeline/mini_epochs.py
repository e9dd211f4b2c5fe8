"""`Dataset.mini_epochs`: an epoch's shards cut into consecutive chunks, one pipeline per chunk (seed 001).

A training loop over chunks trains, checkpoints and validates at chunk boundaries while every chunk stays a
finite, ordinary Dataset (its own DataLoader, no infinite streaming). The chunks of epoch e are
consecutive slices of the shard order the source itself uses for (seed, e), so the union of the chunks is
exactly the epoch's shards, each once; the chunking changes with the epoch like any shard order.

Within a chunk the source spreads the chunk's shards over the slots as usual, which needs at least one
shard per slot (ranks × DataLoader workers): a chunk with fewer is refused here, with the numbers.

The daemon sees the whole epoch's order: every chunk carries the source options `job` (one id for all
chunks) and `plan_following` (the later chunks of this epoch and the chunks of the next), so each slot's
"next" plan is what it reads after this chunk and the next chunk is prefetched while this one trains.
"""

from __future__ import annotations

import dataclasses
import logging

from shardcache.context import RuntimeContext
from shardcache.errors import ConfigError, positive_int
from shardcache.sources.deal.order import permutation
from shardcache.sources.deal.partition import PLACEMENT_SEED, owners, weights_of
from shardcache.sources.deal.schedule import source_job
from shardcache.spec import PipelineSpec

logger = logging.getLogger(__name__)


def epoch_shard_order(spec: PipelineSpec, ctx: RuntimeContext) -> list[int]:
    """Indices into ``spec.source.shards`` in the order the source reads them in `ctx`'s epoch."""
    return permutation(len(spec.source.shards), ctx.seed, ctx.epoch)


def mini_epochs(
    spec: PipelineSpec, ctx: RuntimeContext, shards_per_chunk: int, *, num_workers: int | None = None
) -> list[PipelineSpec]:
    """Split the shard order of `ctx`'s epoch into consecutive chunks, each a pipeline with the same stages.

    Args:
        spec: A shard-backed pipeline (not resampling, no `.cache()` stage, not a mix).
        ctx: The context the chunks are read in (its epoch is the one chunked; `Dataset.mini_epochs`
            resolves it with the dataset's epoch).
        shards_per_chunk: Shards per chunk; the last chunk holds the rest.
        num_workers: DataLoader workers per rank that will read each chunk (for the one-shard-per-slot
            check; 0, main-process loading, counts as 1); None means the context's.

    Returns:
        The chunks in reading order. Iterating all of them reads every shard of the epoch exactly once.

    Raises:
        ConfigError: a bad `shards_per_chunk`, a chunk with fewer shards than slots, or a dataset that
            cannot be chunked.

    Example:
        >>> for epoch in range(2):  # doctest: +SKIP
        ...     dataset.set_epoch(epoch)
        ...     for chunk_index, chunk in enumerate(dataset.mini_epochs(20)):
        ...         train(chunk); save_checkpoint(epoch, chunk_index); validate()
    """
    positive_int("shards_per_chunk", shards_per_chunk)
    if spec.composed:
        raise ConfigError("mini_epochs() of a mix is not supported: chunk each dataset, then mix the chunks")
    if spec.source.resample:
        raise ConfigError("mini_epochs() needs a finite epoch: build the dataset without resample=True")
    if spec.cached:
        raise ConfigError(
            "mini_epochs() of a pipeline with .cache() would build one cache per chunk and epoch; "
            "call mini_epochs() on the pipeline without .cache(), or iterate the cached dataset whole"
        )
    if num_workers is not None:
        # DataLoader(num_workers=0) loads in the main process: one slot per rank.
        ctx = dataclasses.replace(ctx, worker_id=0, num_workers=max(1, num_workers))
    shards = spec.source.shards
    owner = _node_owner(spec, ctx)

    def chunked(epoch: int) -> list[list[int]]:
        if owner is not None:
            return _node_chunks(owner, ctx, epoch, shards_per_chunk)
        order = permutation(len(shards), ctx.seed, epoch)
        return [order[i : i + shards_per_chunk] for i in range(0, len(order), shards_per_chunk)]

    chunks = chunked(ctx.epoch)
    if owner is None:
        _check_slots(chunks, shards_per_chunk, ctx)
    order = [i for chunk in chunks for i in chunk]
    groups = [(ctx.epoch, tuple(shards[i].url for i in c)) for c in chunks]
    groups += [(ctx.epoch + 1, tuple(shards[i].url for i in c)) for c in chunked(ctx.epoch + 1)]
    job = source_job(spec.source.hints.job, shards, ctx.seed)
    urls = [ref.url for ref in shards]
    logger.info(
        "epoch %d: %d shards in %d mini epochs of up to %d shards",
        ctx.epoch,
        len(order),
        len(chunks),
        shards_per_chunk,
    )
    return [
        spec.with_source(
            dataclasses.replace(
                spec.source,
                shards=tuple(shards[i] for i in chunk),
                hints=dataclasses.replace(
                    spec.source.hints,
                    job=job,
                    plan_following=tuple(groups[k + 1 :]),
                    node_owners=None if owner is None else tuple(zip(urls, owner, strict=True)),
                ),
            )
        )
        for k, chunk in enumerate(chunks)
    ]


def _node_owner(spec: PipelineSpec, ctx: RuntimeContext) -> list[int] | None:
    """Each shard's node group when the pipeline uses node placement (None: global placement)."""
    node = spec.source_node(ctx)
    if node.partitioning.placement != "node" or ctx.node_groups < 2:
        return None
    shards = spec.source.shards
    weights = weights_of([ref.num_samples for ref in shards], [ref.size for ref in shards])
    return owners(weights, ctx.node_groups, PLACEMENT_SEED)


def _node_chunks(owner: list[int], ctx: RuntimeContext, epoch: int, shards_per_chunk: int) -> list[list[int]]:
    """Chunks of an epoch under node placement: chunk k holds the k-th part of every node's own order, so
    each node keeps reading its own shards and every chunk spreads over all nodes."""
    count = -(-len(owner) // shards_per_chunk)
    chunks: list[list[int]] = [[] for _ in range(count)]
    for g in range(ctx.node_groups):
        mine = [i for i, o in enumerate(owner) if o == g]
        order = [mine[i] for i in permutation(len(mine), ctx.seed, epoch, 0, f":chunks{g}")]
        for k in range(count):
            chunks[k].extend(order[k * len(order) // count : (k + 1) * len(order) // count])
    return chunks


def _check_slots(chunks: list[list[int]], shards_per_chunk: int, ctx: RuntimeContext) -> None:
    slots = ctx.total_slots
    for index, chunk in enumerate(chunks):
        if len(chunk) < slots:
            total = sum(len(c) for c in chunks)
            raise ConfigError(
                f"mini epoch chunk {index} has {len(chunk)} shards but {slots} slots read it "
                f"({ctx.dp_size} data-parallel ranks × {ctx.num_workers} workers): every slot needs a shard. "
                f"With {total} shards, choose shards_per_chunk >= {slots} (now {shards_per_chunk}) such that "
                f"the last chunk ({total} % shards_per_chunk) is 0 or >= {slots}, or use fewer workers"
            )
