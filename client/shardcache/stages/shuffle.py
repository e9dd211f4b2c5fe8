"""`.shuffle(buffer_size, initial=None)`: a bounded-memory shuffle, deterministic per slot and epoch."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from shardcache.context import RuntimeContext
from shardcache.stages.base import Node, ReplayNode


@dataclass(frozen=True)
class ShuffleStage:
    """Shuffle through a buffer of `buffer_size` samples; emitting starts once `initial` samples are in.

    The RNG is seeded from (seed, slot, epoch) unless `seed` is given; TP co-members share a slot, so they
    shuffle identically.
    """

    buffer_size: int
    initial: int | None = None
    seed: int | None = None
    kind: ClassVar[str] = "shuffle"

    def node(self, up: Node, ctx: RuntimeContext) -> Node:
        base = ctx.sample_shuffle_seed if self.seed is None else self.seed
        rng_seed = f"shuffle:{base}:{ctx.epoch}"
        return ShuffleNode(up, self.buffer_size, self.initial, rng_seed)

    def describe(self) -> str:
        return f"shuffle({self.buffer_size},{self.initial},{self.seed})"


class ShuffleNode(ReplayNode):
    def __init__(self, up: Node, buffer_size: int, initial: int | None, rng_seed: str) -> None:
        super().__init__(up)
        self.buffer_size = buffer_size
        self.initial = buffer_size if initial is None else max(1, min(initial, buffer_size))
        self.rng_seed = rng_seed

    def produce(self, items: Iterator[Any]) -> Iterator[Any]:
        rng = random.Random(self.rng_seed)
        randrange = rng.randrange
        buf: list[Any] = []
        size, initial = self.buffer_size, self.initial
        grow = False
        for item in items:
            buf.append(item)
            n = len(buf)
            if n < initial:
                continue
            if n < size:
                # Between `initial` and `buffer_size` the buffer grows by one every second input.
                grow = not grow
                if grow:
                    continue
            j = randrange(n)
            buf[j], buf[-1] = buf[-1], buf[j]
            yield buf.pop()
        while buf:
            j = randrange(len(buf))
            buf[j], buf[-1] = buf[-1], buf[j]
            yield buf.pop()
