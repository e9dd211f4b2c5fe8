"""`.map(fn)`: a per-sample transform."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from shardcache.context import RuntimeContext
from shardcache.formatting import callable_name
from shardcache.node import Node, StatelessNode
from shardcache.stages.traits import StageTraits


@dataclass(frozen=True)
class MapStage(StageTraits):
    """Apply `fn` to every sample."""

    fn: Callable[[Any], object]  # the user's function: Any, so that it may take any sample type
    kind: ClassVar[str] = "map"
    described_args: ClassVar[tuple[str, ...]] = ("fn",)
    passes_position: ClassVar[bool] = True
    one_to_one: ClassVar[bool] = True
    keeps_count: ClassVar[bool] = True
    before_cache: ClassVar[bool] = True

    def cache_identity(self, frozen: str | None = None) -> tuple[object, ...]:
        return ("map", self.fn) if frozen is None else ("map", "frozen", frozen)

    @property
    def user_callable(self) -> Callable[[Any], object]:
        return self.fn

    def node(self, up: Node, ctx: RuntimeContext) -> Node:
        return MapNode(up, self.fn)

    def describe(self) -> str:
        return f"map({callable_name(self.fn)})"


class MapNode(StatelessNode[object]):
    def __init__(self, up: Node, fn: Callable[[Any], object]) -> None:
        super().__init__(up)
        self.fn = fn

    def gen(self) -> Iterator[object]:
        return map(self.fn, self.up.iterator())
