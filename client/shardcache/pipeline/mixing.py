"""`Dataset.mix`: weighted mixing of several pipelines (seed 003), as a pipeline of its own.

Two modes:

- Proportional (default): one stream of samples whose per-source counts follow `shardcache.mix.plan.plan_mix`
  (temperature sampling, virtual size relative to the largest source, capped), interleaved in a seeded
  random order. Upsampled sources read further passes, each reshuffled (pass j > 0 uses a seed derived
  from (seed, j)); pass 0 of every source is exactly its own epoch order, so an un-upsampled source reads
  each of its samples once per epoch.
- Recipe: batches (lists) with exactly ``recipe[name]`` samples from each source; the epoch ends when the
  ``main`` source finishes one pass; the others restart (reshuffled) as often as needed.

Under several slots every source is sharded by slot as usual; each slot takes an even share of the
epoch's counts, so data-parallel ranks see the same number of samples. The result is a `PipelineSpec` whose
root is a `MixSource` (the `Dataset` facade wraps it): stages chain after it, TorchLoader takes it,
`set_epoch`/`state_dict`/`load_state_dict` work as for any pipeline.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardcache.context import RuntimeContext
from shardcache.errors import ConfigError, StateError
from shardcache.mix.plan import plan_mix, split_for_slot
from shardcache.mix.stream import (
    InterleaveIterator,
    OrderedMixIterator,
    PassStream,
    RecipeIterator,
)
from shardcache.node import Node, State
from shardcache.pipeline.build import build
from shardcache.pipeline.iteration import start
from shardcache.spec import ComposedSource, PipelineSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MixConfig:
    """Everything `mix` was given, validated; sizes are the members' real sample counts."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    weights: tuple[float, ...] | None
    temperature: float
    virtual_size: int | None
    max_scale_up: float
    seed: int | None
    recipe: tuple[int, ...] | None
    main: int | None
    strategy: str | None = None  # the "mixed" source kind's ordered strategies (`pipeline.mixed`)

    def describe(self) -> str:
        fields = dataclasses.asdict(self)
        if self.strategy is None:
            del fields["strategy"]  # so mixes without one keep their fingerprints
        return json.dumps(fields, sort_keys=True)


def pass_seed(seed: int, pass_index: int) -> int:
    """The seed of pass `pass_index` of a source: the job seed for pass 0, a stable derivation after."""
    if pass_index == 0:
        return seed
    digest = hashlib.sha256(f"shardcache.mix.pass:{seed}:{pass_index}".encode()).digest()
    return int.from_bytes(digest[:7], "big")


def member_size(spec: PipelineSpec) -> int:
    """A member's sample count: from manifests' `num_samples` when stages keep counts, else counted once."""
    counts = [ref.num_samples for ref in spec.source.shards]
    # Stages that keep one output per input leave a member the size its manifests tell.
    if all(s.keeps_count for s in spec.stages) and all(c is not None for c in counts):
        return sum(c for c in counts if c is not None)
    logger.info("mix: counting the samples of %r once (no manifest num_samples)", spec.source)
    single = RuntimeContext(seed=spec.resolve_context(None, None).seed)
    iterator = start(spec, single, None)
    try:
        return sum(1 for _ in iterator)
    finally:
        iterator.close()


class _MemberPasses:
    """One member of a mix seen by one slot: pass j is the member's pipeline at (pass seed j, epoch)."""

    def __init__(self, name: str, spec: PipelineSpec, ctx: RuntimeContext) -> None:
        self.name = name
        self.spec = spec
        self.ctx = ctx

    def open(self, pass_index: int, state: dict[str, object] | None) -> Iterator[Any]:
        node = build(self.spec, dataclasses.replace(self.ctx, seed=pass_seed(self.ctx.seed, pass_index)))
        if state is not None:
            node.load_state_dict(state)
        return node

    def state(self, iterator: Iterator[Any]) -> State:
        assert isinstance(iterator, Node)
        return iterator.state_dict()


class MixNode(Node):
    """The source node of a mixed dataset for one slot and epoch."""

    def __init__(self, members: Sequence[tuple[str, PipelineSpec]], config: MixConfig, ctx: RuntimeContext):
        super().__init__()
        self.members = members
        self.config = config
        self.ctx = ctx
        self.inner: InterleaveIterator | RecipeIterator | OrderedMixIterator | None = None
        self._pending: State | None = None

    def _make(self) -> InterleaveIterator | RecipeIterator | OrderedMixIterator:
        cfg, ctx = self.config, self.ctx
        sources = [_MemberPasses(name, ds, ctx) for name, ds in self.members]
        seed = ctx.seed if cfg.seed is None else cfg.seed
        if cfg.strategy is not None:
            once = [PassStream(s, max_passes=1, allow_empty=True) for s in sources]
            weights = [int(w) for w in cfg.weights or [1] * len(sources)]
            return OrderedMixIterator(once, cfg.names, cfg.strategy, weights, seed, ctx.epoch, ctx.slot)
        if cfg.recipe is not None and cfg.main is not None:
            streams = [PassStream(s, max_passes=1 if i == cfg.main else None) for i, s in enumerate(sources)]
            return RecipeIterator(streams, cfg.recipe, cfg.main)
        plan = plan_mix(
            cfg.names,
            cfg.sizes,
            weights=cfg.weights,
            temperature=cfg.temperature,
            virtual_size=cfg.virtual_size,
            max_scale_up=cfg.max_scale_up,
            seed=seed,
            epoch=ctx.epoch,
        )
        if ctx.slot == 0:
            plan.log()
        counts = [split_for_slot(c, ctx.slot, ctx.total_slots, ctx.epoch) for c in plan.counts]
        streams = [PassStream(s, limit=c) for s, c in zip(sources, counts, strict=True)]
        return InterleaveIterator(streams, counts, seed=seed, epoch=ctx.epoch, slot=ctx.slot)

    def gen(self) -> Iterator[Any]:
        inner = self.inner = self._make()
        if self._pending is not None:
            inner.load_state_dict(self._pending)
        try:
            yield from inner
        finally:
            for stream in inner.streams:
                stream.close()

    def state_dict(self) -> State:
        if self.inner is None:
            return self._pending if self._pending is not None else self._make().state_dict()
        return self.inner.state_dict()

    def load_state_dict(self, state: State) -> None:
        self._check_not_started()
        if not isinstance(state, dict) or not isinstance(state.get("streams"), list):
            raise StateError("resume state is not a mix state; it was not taken from this mixed pipeline")
        self._pending = state


@dataclass(frozen=True)
class MixSource(ComposedSource):
    """The root of a mixed pipeline: a source whose samples come from other pipelines (`build` asks it for
    its node). Its shards are the members' (telemetry and job ids see them); its description, and so the
    fingerprint, is the mixing arguments and each member's own fingerprint."""

    members: tuple[tuple[str, PipelineSpec], ...] = ()
    config: MixConfig | None = None

    def describe(self) -> str:
        assert self.config is not None
        parts = [self.config.describe(), *(f"{name}={ds.fingerprint()}" for name, ds in self.members)]
        return "\n".join(parts)

    def node(self, ctx: RuntimeContext) -> Node:
        """The mix's node for one slot (each member built for the same slot)."""
        assert self.config is not None
        return MixNode(self.members, self.config, ctx)

    def __repr__(self) -> str:
        names = ", ".join(name for name, _ in self.members)
        return f"MixSource([{names}])"


def mix_root(
    members: Sequence[tuple[str, PipelineSpec]], config: MixConfig, context: RuntimeContext | None
) -> PipelineSpec:
    """The pipeline whose root is the `MixSource` of `members` mixed by `config`."""
    shards = tuple(ref for _, spec in members for ref in spec.source.shards)
    return PipelineSpec(MixSource("mix", shards, {}, context, None, members=tuple(members), config=config))


Members = Mapping[str, PipelineSpec] | Sequence[PipelineSpec]


def named_members(datasets: Members) -> list[tuple[str, PipelineSpec]]:
    items = (
        list(datasets.items())
        if isinstance(datasets, Mapping)
        else [(str(i), d) for i, d in enumerate(datasets)]
    )
    if not items:
        raise ConfigError("mix(datasets=...): give at least one dataset")
    for name, ds in items:
        if not isinstance(ds, PipelineSpec):
            raise ConfigError(
                f"mix(datasets=...): {name!r} is {type(ds).__name__}, expected a shardcache Dataset"
            )
        if ds.source.resample:
            raise ConfigError(
                f"mix(datasets=...): {name!r} resamples (resample=True) and has no epoch; mixing upsamples "
                "by itself, so build it without resample"
            )
    return items


def _per_source(name: str, value: Any, names: list[str]) -> list[Any]:
    if isinstance(value, Mapping):
        if set(value) != set(names):
            raise ConfigError(f"{name}={dict(value)!r}: expected one entry per dataset, keys {names}")
        return [value[n] for n in names]
    values = list(value)
    if len(values) != len(names):
        raise ConfigError(f"{name} has {len(values)} entries for {len(names)} datasets; give one per dataset")
    return values


def mix(
    datasets: Members,
    weights: Mapping[str, float] | Sequence[float] | None = None,
    temperature: float = 1.0,
    virtual_size: int | None = None,
    max_scale_up: float = 1.5,
    seed: int | None = None,
    recipe: Mapping[str, int] | None = None,
    main: str | None = None,
    *,
    context: RuntimeContext | None = None,
) -> PipelineSpec:
    """Mix several pipelines into one (seed 003): temperature-weighted counts, or exact recipe batches.

    Args:
        datasets: Name -> Dataset, or a list (named "0", "1", ...). None may resample.
        weights: Sampling weights per dataset (mapping by name or a list); None means the dataset sizes
            (manifests' ``num_samples``, else counted once now).
        temperature: T in p_i ∝ w_i^(1/T); larger T flattens the mix towards uniform.
        virtual_size: Samples per mixed epoch; None keeps the largest dataset at its size and upsamples the
            others relative to it, capped at ``max_scale_up`` × the real total.
        max_scale_up: The cap of the default virtual size.
        seed: Seed of the mixing RNG (with the epoch); None uses the context's seed.
        recipe: Name -> samples per batch. The mix then yields lists with exactly those counts.
        main: With `recipe`: the dataset whose one pass is an epoch.
        context: An explicit RuntimeContext for the mix (else inferred at iteration, as for any Dataset).

    Returns:
        A pipeline whose root is a `MixSource`, to chain stages on, iterate, or hand to TorchLoader.

    Raises:
        ConfigError: a bad argument, named, with what is accepted.

    Example:
        >>> mixed = Dataset.mix({"web": web, "code": code}, temperature=2.0)  # doctest: +SKIP
        >>> recipe = {"main": 24, "aux": 8}
        >>> batches = Dataset.mix({"main": a, "aux": b}, recipe=recipe, main="main")  # doctest: +SKIP
    """
    members = named_members(datasets)
    names = [name for name, _ in members]
    if context is not None and not isinstance(context, RuntimeContext):
        raise ConfigError(f"context={context!r}: expected a RuntimeContext or None")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigError(f"seed={seed!r}: expected an int or None")
    recipe_counts: tuple[int, ...] | None = None
    main_index: int | None = None
    if recipe is not None or main is not None:
        if recipe is None or main is None:
            raise ConfigError("recipe= and main= go together: recipe={'main': 24, 'aux': 8}, main='main'")
        if weights is not None or virtual_size is not None or temperature != 1.0:
            raise ConfigError(
                "recipe= fixes the counts of every batch; drop weights=, temperature=, virtual_size="
            )
        counts = _per_source("recipe", recipe, names)
        for name, count in zip(names, counts, strict=True):
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ConfigError(f"recipe[{name!r}]={count!r}: expected a non-negative int")
        if main not in names:
            raise ConfigError(f"main={main!r}: expected one of the dataset names {names}")
        main_index = names.index(main)
        if counts[main_index] < 1:
            raise ConfigError(f"recipe[{main!r}] must be >= 1: the main dataset drives the epoch")
        recipe_counts = tuple(counts)
    weight_list = None if weights is None else tuple(float(w) for w in _per_source("weights", weights, names))
    sizes = tuple(member_size(spec) for _, spec in members) if recipe_counts is None else (0,) * len(members)
    config = MixConfig(
        tuple(names),
        sizes,
        weight_list,
        float(temperature),
        virtual_size,
        float(max_scale_up),
        seed,
        recipe_counts,
        main_index,
    )
    if recipe_counts is None:
        # Validate now (bad temperature, empty source...) rather than at the first iteration.
        plan = plan_mix(
            names,
            sizes,
            weights=weight_list,
            temperature=config.temperature,
            virtual_size=virtual_size,
            max_scale_up=config.max_scale_up,
            seed=seed or 0,
        )
        plan.log()
    return mix_root(members, config, context)
