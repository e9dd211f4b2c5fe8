"""`.batch(batch_size, drop_last=False, collate_fn=None)`: group consecutive samples."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from shardcache.context import RuntimeContext
from shardcache.formatting import callable_name
from shardcache.node import Node, StatelessNode
from shardcache.stages.traits import Count, StageTraits


@dataclass(frozen=True)
class BatchStage(StageTraits):
    """Emit lists of `batch_size` samples (passed through `collate_fn` when given)."""

    batch_size: int
    drop_last: bool = False
    collate_fn: Callable[[list[Any]], object] | None = None  # the user's: takes any sample type
    kind: ClassVar[str] = "batch"
    described_args: ClassVar[tuple[str, ...]] = ("batch_size", "drop_last", "collate_fn")
    passes_position: ClassVar[bool] = True
    batches: ClassVar[bool | None] = True

    def count_after(self, count: Count) -> Count:
        return count.batched(self.batch_size, self.drop_last)

    def node(self, up: Node, ctx: RuntimeContext) -> Node:
        return BatchNode(up, self.batch_size, self.drop_last, self.collate_fn)

    def describe(self) -> str:

        collate = None if self.collate_fn is None else callable_name(self.collate_fn)
        return f"batch({self.batch_size},{self.drop_last},{collate})"


class BatchNode(StatelessNode):
    """Between two batches this node holds no samples, so its position is exactly its upstream's."""

    def __init__(
        self, up: Node, size: int, drop_last: bool, collate: Callable[[list[Any]], object] | None
    ) -> None:
        super().__init__(up)
        self.size = size
        self.drop_last = drop_last
        self.collate = collate

    def gen(self) -> Iterator[object]:
        size, collate = self.size, self.collate
        buf: list[object] = []
        for item in self.up.iterator():
            buf.append(item)
            if len(buf) == size:
                yield buf if collate is None else collate(buf)
                buf = []
        if buf and not self.drop_last:
            yield buf if collate is None else collate(buf)
