"""`PipelineSpec`: what a `Dataset` is — a root source (one kind's shards, or a composition such as a mix),
the stages after it, and the facts the main process learned for it.

A spec is immutable: every feature (`Dataset.map`, `split`, `mix`, `mini_epochs`, `cache`) is a function
from specs to specs, and `shardcache.pipeline.build.build(spec, ctx)` turns one into the node chain of one
slot. The mutable side of a `Dataset` (its epoch, its latest iterator, a state to resume) is not here.

`facts` (`RunFacts`: sample counts, torch.distributed) is a memo, not identity: it is excluded from
equality and from the fingerprint, shared by specs derived with other stages (they read the same units),
and pickled with the spec so that DataLoader workers see the main process's counts.
"""

from __future__ import annotations

import hashlib
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from shardcache.context import RuntimeContext
from shardcache.memo import IdentityMemo
from shardcache.node import Node
from shardcache.sources import SourceNode, SourceSpec, node_class
from shardcache.sources.deal.counting import RunFacts, unit_counts
from shardcache.sources.deal.subset import select_units
from shardcache.stages import CacheStage, Stage

# How a pipeline becomes one slot's node chain (`shardcache.pipeline.build.build`), handed to the parts that
# build pipelines of their own below it (a mix's members, a `.cache()` boundary before another).
NodeBuilder = Callable[["PipelineSpec", RuntimeContext], Node]

_FINGERPRINTS: IdentityMemo[str] = IdentityMemo()


@dataclass(frozen=True)
class ComposedSource(SourceSpec):
    """A root whose samples come from other pipelines (a mix): it builds its own node for a slot."""

    @abstractmethod
    def node(self, ctx: RuntimeContext) -> Node:
        """The root node of one slot."""

    def description_parts(self) -> tuple[str, bytes | None]:
        # Its own description (a composition's arguments and members), not a shard list's.
        head, newline, rest = self.describe().partition("\n")
        return head, rest.encode() if newline else None


@dataclass(frozen=True)
class PipelineSpec:
    """A root source and the stages after it, in order."""

    source: SourceSpec
    stages: tuple[Stage, ...] = ()
    facts: RunFacts = field(default_factory=RunFacts, compare=False, repr=False)

    def describe(self) -> str:
        """The stable description the fingerprint hashes (no object ids)."""
        return "\n".join([self.source.describe(), *(stage.describe() for stage in self.stages)])

    def fingerprint(self) -> str:
        """A stable hash of the source and stage list (what a resume state must match); memoised per spec,
        since its description lists every shard URL."""
        return _FINGERPRINTS.get(self, None, self._fingerprint)

    def _fingerprint(self) -> str:
        # The SHA-256 of `describe()`'s UTF-8, fed in parts: the source's URLs as their buffer, never as
        # a description of 10^6 lines made (and kept) for it (`SourceSpec.description_parts`).
        digest = hashlib.sha256()
        head, rest = self.source.description_parts()
        digest.update(head.encode())
        if rest is not None:
            digest.update(b"\n")
            digest.update(rest)
        for stage in self.stages:
            digest.update(f"\n{stage.describe()}".encode())
        return digest.hexdigest()[:32]

    @property
    def composed(self) -> bool:
        """Whether the root is a composition of other pipelines (a mix) rather than one kind's shards."""
        return isinstance(self.source, ComposedSource)

    @property
    def cached(self) -> bool:
        """Whether a `.cache()` boundary is in the stages."""
        return any(isinstance(stage, CacheStage) for stage in self.stages)

    def with_stages(self, stages: Sequence[Stage]) -> PipelineSpec:
        """The same source (and facts) with another stage list."""
        return PipelineSpec(self.source, tuple(stages), self.facts)

    def then(self, stage: Stage) -> PipelineSpec:
        """This pipeline with `stage` appended."""
        return self.with_stages((*self.stages, stage))

    def with_source(self, source: SourceSpec) -> PipelineSpec:
        """Another source under the same stages; fresh facts, since the units differ."""
        return PipelineSpec(source, self.stages)

    def resolve_context(self, context: RuntimeContext | None, epoch: int | None) -> RuntimeContext:
        """The context an iteration uses: explicit (`context`, else the source's; `RuntimeContext.resolve`:
        as given when it names its reader, adjusted to the torch worker running it; a seed-only context takes
        its rank from the runtime) or inferred from torch and the environment; with `epoch` when set."""
        explicit = context if context is not None else self.source.context
        if explicit is not None:
            ctx = explicit.resolve()
        else:
            ctx = RuntimeContext.from_runtime(env=self.facts.worker_environment())
        return ctx if epoch is None else ctx.with_epoch(epoch)

    def source_node(self, ctx: RuntimeContext) -> SourceNode:
        """The root node of one slot, for a root of one kind's shards."""
        assert not self.composed, "a composed root builds its own node"
        node: SourceNode = node_class(self.source.kind)(self.source, ctx, self.facts)
        return node

    def partitioning_of(self, ctx: RuntimeContext) -> list[str | float | None] | None:
        """[placement, even, exchange] as the source resolves them in `ctx` (None for a composed root)."""
        if self.composed:
            return None
        return self.source_node(ctx).partitioning.as_list()

    def count_samples(self, ctx: RuntimeContext, *, always: bool = False) -> None:
        """Run the counting pass `even=` needs (or, with `always`, any elastic resume) into `facts`."""
        self.facts.capture()
        if self.composed or self.cached:
            return  # a mix's members count when they are read; a cached dataset's rows are lance's
        kind = node_class(self.source.kind)
        if not kind.partitionable or kind.counted_by_metadata:
            return
        if not always and kind.partitioning_for(self.source, ctx, self.facts).even is None:
            return  # nothing to count: no reader is built for it
        node = self.source_node(ctx)
        try:
            units = select_units(self.source.kind, node.units(), self.source.hints.subset)
            unit_counts(node, units)
        finally:
            node.close()
