"""`.select(fields)`: keep some user fields, and always the `__x__` metadata."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from shardcache.context import RuntimeContext
from shardcache.node import Node, StatelessNode
from shardcache.stages.traits import StageTraits


@dataclass(frozen=True)
class SelectStage(StageTraits):
    """Project each sample onto `fields` plus its metadata (`__key__`, `__shard__`, ...)."""

    fields: tuple[str, ...]
    kind: ClassVar[str] = "select"
    described_args: ClassVar[tuple[str, ...]] = ("fields",)
    passes_position: ClassVar[bool] = True
    one_to_one: ClassVar[bool] = True
    keeps_count: ClassVar[bool] = True
    before_cache: ClassVar[bool] = True

    def cache_identity(self, frozen: str | None = None) -> tuple[object, ...]:
        return ("select", tuple(self.fields))

    def node(self, up: Node, ctx: RuntimeContext) -> Node:
        return SelectNode(up, self.fields)

    def describe(self) -> str:
        return f"select({','.join(self.fields)})"


class SelectNode(StatelessNode):
    def __init__(self, up: Node, fields: tuple[str, ...]) -> None:
        super().__init__(up)
        self.fields = fields

    def gen(self) -> Iterator[object]:
        fields = self.fields
        for sample in self.up.iterator():
            out = {k: v for k, v in sample.items() if k[:2] == "__" and k[-2:] == "__"}
            for name in fields:
                try:
                    out[name] = sample[name]
                except KeyError:
                    where = sample.get("__key__", "?")
                    raise KeyError(
                        f"select: sample {where!r} has no field {name!r} (fields: {sorted(sample)})"
                    ) from None
            yield out
