"""`.unbatch()`: flatten batches (lists, tuples, or dicts of equal-length columns) back into samples."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar, TypedDict

from shardcache.context import RuntimeContext
from shardcache.node import Node, State, field, state_of
from shardcache.stages.traits import Count, StageTraits


@dataclass(frozen=True)
class UnbatchStage(StageTraits):
    """Yield the items of each batch."""

    kind: ClassVar[str] = "unbatch"
    batches: ClassVar[bool | None] = False

    def count_after(self, count: Count) -> Count | None:
        return None if count.samples is None else Count.of_samples(count.samples)

    def node(self, up: Node, ctx: RuntimeContext) -> Node:
        return UnbatchNode(up)

    def describe(self) -> str:
        return "unbatch()"


def items_of(batch: Iterable[object]) -> list[object]:
    """The samples of one batch."""
    if isinstance(batch, Mapping):
        keys = list(batch)
        columns = [batch[k] for k in keys]
        return [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)]
    return list(batch)


class UnbatchState(TypedDict):
    """An unbatch stage's state: the upstream state before the current batch, and its items emitted."""

    up: State
    done: int


class UnbatchNode(Node):
    """State: the upstream position before the current batch, and how many of its items were emitted."""

    def __init__(self, up: Node) -> None:
        super().__init__()
        self.up = up
        self._before: State | None = None
        self._done = 0

    def gen(self) -> Iterator[object]:
        up = self.up
        it = up.iterator()
        skip = self._done
        while True:
            before = up.state_dict()
            try:
                batch = next(it)
            except StopIteration:
                return
            self._before = before
            items = items_of(batch)
            for done in range(skip, len(items)):
                self._done = done + 1
                yield items[done]
            skip = 0
            self._done = 0
            self._before = None

    def state_dict(self) -> UnbatchState:
        if self._before is None:
            return {"up": self.up.state_dict(), "done": 0 if self._it is not None else self._done}
        return {"up": self._before, "done": self._done}

    def load_state_dict(self, state: State) -> None:
        self._check_not_started()
        self.up.load_state_dict(state_of(state, "up"))
        self._done = field(state, "done", int)

    def close(self) -> None:
        super().close()
        self.up.close()
