"""How many items one pass yields, known before it starts: `len()` of a Dataset and of a TorchLoader.

A pass's length is known before its first sample when:

1. every unit's sample count is known without reading the unit: a manifest's `num_samples`, parquet
   footers, Lance, or a counting pass that already ran (`Dataset.count_samples`). `len()` never starts a
   counting pass itself: under torch.distributed that is a collective, and `len()` is asked by progress
   bars and frameworks on one rank as often as on all;
2. the deal gives each reader a number of samples that every epoch repeats. Under `even="drop"|"pad"` every
   data-parallel rank reads P samples, split among its DataLoader workers the same way in every epoch.
   Without `even` a rank reads whole shards, a different number every epoch, unless one rank reads
   everything: then its total is fixed, but not how it falls to its workers, so the length is known only
   where nothing batches per worker;
3. every stage says what it does to a count (`StageTraits.count_after`): map, select and shuffle keep it,
   batch divides it, unbatch gives back the samples the batches held; what assemble, balance and the rest
   yield depends on the data.

So every known length is the same in every epoch (what a framework that asks once, as Lightning does,
relies on). Otherwise `LengthUnknown`, a TypeError (Python's "no length", which torch, Lightning and the
Hugging Face Trainer catch), says which condition is missing and how to meet it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from shardcache.context import RuntimeContext
from shardcache.errors import LengthUnknown
from shardcache.memo import IdentityMemo
from shardcache.spec import PipelineSpec
from shardcache.stages import Stage
from shardcache.stages.traits import Count

_EVEN_HINT = (
    "from_source(..., even='drop') (the default under torch.distributed; with one rank it drops nothing) or "
    "even='pad' splits every epoch the same way"
)


@dataclass(frozen=True)
class Batching:
    """Each DataLoader worker groups its own items into batches: a TorchLoader's `batch_size`, a plain
    DataLoader's automatic batching."""

    size: int
    drop_last: bool


@dataclass(frozen=True)
class Reader:
    """Who reads the pass: a rank's context and its DataLoader workers (0: the process itself; None: the
    context's own slot alone, as a pass inside one worker reads), how each worker batches, and the stages
    after the workers' streams are merged (a TorchLoader's own)."""

    ctx: RuntimeContext
    workers: int | None = 0
    batching: Batching | None = None
    merged_stages: tuple[Stage, ...] = ()

    def key(self) -> tuple[object, ...]:
        """What the length depends on besides the pipeline: the rank's place, never the epoch (see the
        module: a known length is the same in every epoch)."""
        ctx = self.ctx
        layout = (ctx.dp_rank, ctx.dp_size, ctx.node_groups, ctx.seed)
        return (*layout, self.workers, self.batching, self.merged_stages)


def pass_length(spec: PipelineSpec, reader: Reader) -> int:
    """Items one pass of `spec` yields to `reader` (see the module); memoised per pipeline and reader.

    Raises:
        LengthUnknown: the length depends on the data or on the epoch; the message says how to fix that.
    """
    return _LENGTHS.get(spec, reader.key(), lambda: _length(spec, reader))


_LENGTHS: IdentityMemo[int] = IdentityMemo()


def _length(spec: PipelineSpec, reader: Reader) -> int:
    if spec.composed:
        raise LengthUnknown(
            "a mix has no length: its members are drawn by weight, and a pass ends with its main member "
            "(count steps yourself, or give the framework max_steps)"
        )
    for stage in (*spec.stages, *reader.merged_stages):
        if stage.count_after(Count.of_samples(0)) is None:
            raise LengthUnknown(
                f"what .{stage.describe()} yields depends on the data: a pipeline with it has no length "
                "(give the framework max_steps instead)"
            )
    if reader.workers is None:
        contexts = [reader.ctx]
    else:
        slots = max(1, reader.workers)
        contexts = [replace(reader.ctx, worker_id=w, num_workers=slots) for w in range(slots)]
    parts: list[Count] = []
    for ctx in contexts:
        node = spec.source_node(ctx)
        try:
            if node.partitioning.even is None:
                _check_fixed_without_even(spec, reader, ctx, whole_rank=len(contexts) == ctx.num_workers)
            samples = node.slot_samples()
        finally:
            node.close()
        parts.append(_through(spec.stages, Count.of_samples(samples), reader.batching))
    total = sum(parts[1:], parts[0])
    count = _through(reader.merged_stages, total, None)
    return count.items


def _check_fixed_without_even(
    spec: PipelineSpec, reader: Reader, ctx: RuntimeContext, *, whole_rank: bool
) -> None:
    """Refuse a length that changes with the epoch: without `even=`, ranks and workers read whole shards
    (`whole_rank`: the pass is every worker's of the rank, not one worker's alone)."""
    if ctx.dp_size > 1:
        raise LengthUnknown(
            f"without even=, the {ctx.dp_size} ranks' shares are not cut to a fixed number of samples (whole "
            f"shards: a different number every epoch). {_EVEN_HINT}"
        )
    additive = reader.batching is None and all(s.one_to_one or s.keeps_count for s in spec.stages)
    if ctx.num_workers > 1 and not (whole_rank and additive):
        raise LengthUnknown(
            f"without even=, the {ctx.num_workers} DataLoader workers read whole shards, a different share "
            f"every epoch, and each batches its own: the steps change from epoch to epoch. {_EVEN_HINT}"
        )


def _through(stages: Sequence[Stage], count: Count, batching: Batching | None) -> Count:
    """`count` after `stages`, then after the worker-side `batching` (if any)."""
    for stage in stages:
        after = stage.count_after(count)
        if after is None:
            raise LengthUnknown(
                f"the items before .{stage.describe()} are batches whose samples are not known (a map over "
                "batches may change them): unbatch before mapping, or give the framework max_steps"
            )
        count = after
    return count if batching is None else count.batched(batching.size, batching.drop_last)
