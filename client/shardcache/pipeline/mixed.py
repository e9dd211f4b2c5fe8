"""`Dataset.from_source("mixed", sources=..., strategy=..., weights=...)`: mvp-dataset 0.2.3's mixed source,
a mix (`shardcache.pipeline.mixing`) whose members are each read once per epoch in a strategy's order.
"""

from __future__ import annotations

from collections.abc import Mapping

from shardcache.context import RuntimeContext
from shardcache.errors import ConfigError, positive_int
from shardcache.mix.stream import STRATEGIES
from shardcache.pipeline.mixing import MixConfig, mix_root, named_members
from shardcache.spec import PipelineSpec


def mixed_source(
    sources: Mapping[str, PipelineSpec],
    *,
    strategy: str = "weighted_round_robin",
    weights: Mapping[str, int] | None = None,
    context: RuntimeContext | None = None,
    seed: int | None = None,
) -> PipelineSpec:
    """`Dataset.from_source("mixed", sources=..., strategy=..., weights=...)`: mvp-dataset's mixed source.

    Each source is read once per epoch (every slot its own share, as for any dataset), in the order the
    strategy picks (`shardcache.mix.stream.OrderedMixIterator`): "concat", "round_robin",
    "weighted_round_robin" (the default), "random", "weighted_random". Dict samples carry ``__source__``.

    Args:
        sources: Name -> Dataset (at least one; none may resample).
        strategy: How the next source is picked.
        weights: Positive integer weights by name (missing names weigh 1); used by the weighted strategies.
        context: The mix's RuntimeContext; by default the sources' (they must not differ).
        seed: Seed of the random strategies (with the epoch and slot); None uses the context's seed.

    Raises:
        ConfigError: a bad strategy, name or weight, or sources with different explicit contexts.
    """
    if not isinstance(sources, Mapping):
        raise ConfigError(
            f"from_source('mixed', sources={sources!r}): expected a mapping of names to datasets"
        )
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy={strategy!r}: expected one of {', '.join(map(repr, STRATEGIES))}")
    members = named_members(sources)
    names = [name for name, _ in members]
    for name in names:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"from_source('mixed', sources=...): name {name!r} must be a non-empty string")
    given = dict(weights or {})
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ConfigError(f"weights={given!r}: {unknown} are not source names ({names})")
    for name, weight in given.items():
        positive_int(f"weights[{name!r}]", weight)
    if context is not None and not isinstance(context, RuntimeContext):
        raise ConfigError(f"context={context!r}: expected a RuntimeContext or None")
    explicit = {ds.source.context for _, ds in members if ds.source.context is not None}
    if context is None and len(explicit) > 1:
        raise ConfigError(
            "from_source('mixed', ...): the sources were built with different contexts; build them with "
            "the same context, or pass context= to the mix",
            code="MixedSourceContextMismatch",
        )
    if context is not None and explicit - {context}:
        raise ConfigError(
            "from_source('mixed', context=...): a source was built with another context; build the "
            "sources with this context (or none)",
            code="MixedSourceContextMismatch",
        )
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigError(f"seed={seed!r}: expected an int or None")
    config = MixConfig(
        names=tuple(names),
        sizes=(0,) * len(names),
        weights=tuple(float(given.get(n, 1)) for n in names),
        temperature=1.0,
        virtual_size=None,
        max_scale_up=1.0,
        seed=seed,
        recipe=None,
        main=None,
        strategy=strategy,
    )
    chosen = context if context is not None else next(iter(explicit), None)
    return mix_root(members, config, chosen)
