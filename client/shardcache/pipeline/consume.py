"""`Dataset.consume(factory)`: run a pipeline to its end into a consumer, and return what it finishes with.

The consumer is `factory(context)`, built with the same resolved `RuntimeContext` the iteration uses (the
slot's rank, worker and epoch). It receives every output with `push(item)`: returning False stops early,
True or None goes on. `finish()` is called once the pipeline ends (or was stopped) and its value is
returned. An exception from the pipeline or from `push` propagates, and `finish()` is then not called.

Example:
    >>> class Count:
    ...     def __init__(self, context): self.n = 0
    ...     def push(self, item): self.n += 1
    ...     def finish(self): return self.n
    >>> dataset.consume(Count)  # doctest: +SKIP
    1000
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from shardcache.context import RuntimeContext
from shardcache.errors import ConfigError
from shardcache.pipeline.iteration import PipelineIterator


class Consumer(Protocol):
    """What `factory(context)` returns."""

    def push(self, item: Any) -> bool | None:
        """Take one output; False stops the run."""
        ...

    def finish(self) -> Any:
        """The result of the run."""
        ...


def consume(begin: Callable[[], PipelineIterator], factory: Callable[[RuntimeContext], Consumer]) -> Any:
    """Push every output of the pass `begin()` starts into `factory(context)`; return its `finish()`.

    Raises:
        ConfigError: `factory` is not callable, or what it returns lacks `push` or `finish`.
    """
    if not callable(factory):
        raise ConfigError(f"consume(factory={factory!r}): expected a callable taking a RuntimeContext")
    iterator = begin()
    try:
        consumer = factory(iterator.context)
        push = getattr(consumer, "push", None)
        if not callable(push) or not callable(getattr(consumer, "finish", None)):
            raise ConfigError(
                f"consume(): factory returned {type(consumer).__name__}, which lacks push(item) or finish()"
            )
        for item in iterator:
            if push(item) is False:
                break
        return consumer.finish()
    finally:
        iterator.close()
