"""`.assemble(factory, drop_last=False)`: many-to-many stream assembly (packing), one assembler per slot."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from shardcache.context import RuntimeContext
from shardcache.stages.base import Node, ReplayNode


class Assembler(Protocol):
    """What `factory(context)` returns (mvp-dataset's protocol)."""

    def push(self, sample: Any) -> Iterable[Any]: ...
    def finish(self, *, drop_last: bool = False) -> Iterable[Any]: ...


@dataclass(frozen=True)
class AssembleStage:
    """Feed samples to `factory(context)`'s assembler; emit what `push` and `finish` return."""

    factory: Callable[[RuntimeContext], Assembler]
    drop_last: bool = False
    kind: ClassVar[str] = "assemble"

    def node(self, up: Node, ctx: RuntimeContext) -> Node:
        return AssembleNode(up, self.factory, self.drop_last, ctx)

    def describe(self) -> str:
        from shardcache.stages.map import callable_name

        return f"assemble({callable_name(self.factory)},{self.drop_last})"


class AssembleNode(ReplayNode):
    # TODO(resume, issue 6): assemblers with their own state_dict()/load_state_dict() could resume natively
    # (upstream position + assembler state + outputs already emitted from the last push) instead of by replay.
    def __init__(
        self, up: Node, factory: Callable[[RuntimeContext], Assembler], drop_last: bool, ctx: RuntimeContext
    ) -> None:
        super().__init__(up)
        self.factory = factory
        self.drop_last = drop_last
        self.ctx = ctx

    def produce(self, items: Iterator[Any]) -> Iterator[Any]:
        assembler = self.factory(self.ctx)
        push = assembler.push
        for item in items:
            yield from push(item)
        yield from assembler.finish(drop_last=self.drop_last)
