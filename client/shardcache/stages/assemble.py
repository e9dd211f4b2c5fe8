"""`.assemble(factory, drop_last=False)`: many-to-many stream assembly (packing), one assembler per slot.

Resume state: a checkpoint (the upstream position, and the assembler's own state or None for a fresh
assembler) plus the number of outputs emitted since it; resuming restores the checkpoint, pushes the
upstream from there and drops that many outputs.

- An assembler without `state_dict()`/`load_state_dict()` is checkpointed only where the stage starts, so a
  resume re-reads the upstream since then (for an early stage, the epoch so far): exact, and the state holds
  no sample data.
- An assembler with them is checkpointed every `CHECKPOINT_EVERY` inputs, so a resume re-reads at most that
  many. The state then carries the assembler's state as it returns it, which for a packer is typically its
  pending inputs: sample data the assembler cannot do without, so keep it JSON-serialisable and small.
- An assembler with an `identity()` (mvp-dataset's protocol) has it recorded in the state once the stage
  started, when it is JSON; a resume whose assembler answers another identity is refused
  ([ResumeIdentityMismatch]): by `Dataset.load_state_dict`, which builds one assembler to ask
  (`check_assembler_identity`), and in any case when the stage starts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, NotRequired, Protocol, TypedDict

from shardcache.context import RuntimeContext
from shardcache.errors import StateError
from shardcache.formatting import callable_name
from shardcache.node import JSONValue, Node, State, field, state_of
from shardcache.stages.traits import StageTraits

CHECKPOINT_EVERY = 64


class Assembler(Protocol):
    """What `factory(context)` returns (mvp-dataset's protocol)."""

    # `sample` is Any: a user's assembler may take any sample type (object would refuse a narrower one).
    def push(self, sample: Any) -> Iterable[object]: ...
    def finish(self, *, drop_last: bool = False) -> Iterable[object]: ...


@dataclass(frozen=True)
class AssembleStage(StageTraits):
    """Feed samples to `factory(context)`'s assembler; emit what `push` and `finish` return."""

    factory: Callable[[RuntimeContext], Assembler]
    drop_last: bool = False
    kind: ClassVar[str] = "assemble"
    described_args: ClassVar[tuple[str, ...]] = ("factory", "drop_last")
    before_cache: ClassVar[bool] = True

    def cache_identity(self, frozen: str | None = None) -> tuple[object, ...]:
        factory = self.factory if frozen is None else ("frozen", frozen)
        return ("assemble", factory, bool(self.drop_last))

    @property
    def user_callable(self) -> Callable[[RuntimeContext], Assembler]:
        return self.factory

    def node(self, up: Node, ctx: RuntimeContext) -> Node:
        return AssembleNode(up, self.factory, self.drop_last, ctx)

    def describe(self) -> str:

        return f"assemble({callable_name(self.factory)},{self.drop_last})"


def _identity(assembler: object) -> object:
    """The assembler's `identity()` when it has one that is JSON (what a state can carry), else None."""
    method = getattr(assembler, "identity", None)
    if not callable(method):
        return None
    value: JSONValue = method()
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return None
    return value


def check_assembler_identity(saved: object, assembler: object) -> None:
    """Refuse an assembler whose identity is not the `saved` one (None: none was recorded)."""
    identity = _identity(assembler)
    if saved is not None and identity != saved:
        raise StateError(
            f"path=identity.assembler expected={saved!r} actual={identity!r}: the resume state was taken "
            "with another assembler",
            code="ResumeIdentityMismatch",
        )


def _stateful(assembler: object) -> bool:
    return callable(getattr(assembler, "state_dict", None)) and callable(
        getattr(assembler, "load_state_dict", None)
    )


class AssembleState(TypedDict):
    """An assemble stage's state: the upstream state and the assembler's own state at the last point both
    were consistent, the outputs emitted since, and the assembler's `identity()` (when it has one)."""

    up: State
    assembler: object  # the assembler's state_dict() (None before it started), JSON in its own format
    emitted: int
    identity: NotRequired[object]


class AssembleNode(Node):
    def __init__(
        self, up: Node, factory: Callable[[RuntimeContext], Assembler], drop_last: bool, ctx: RuntimeContext
    ) -> None:
        super().__init__()
        self.up = up
        self.factory = factory
        self.drop_last = drop_last
        self.ctx = ctx
        self._mark: tuple[State, object] | None = None  # (upstream state, assembler state or None)
        self._loaded: object = None  # the assembler's own state, JSON in its format
        self._emitted = 0
        self._identity: object = None  # the assembler's identity(): recorded, or loaded to compare

    def gen(self) -> Iterator[object]:
        up = self.up
        assembler: Any = self.factory(self.ctx)
        stateful = _stateful(assembler)
        check_assembler_identity(self._identity, assembler)
        self._identity = _identity(assembler)
        if self._loaded is not None:
            if not stateful:
                raise StateError(
                    "resume state holds an assembler state but this assembler has no load_state_dict(); "
                    "it was taken with another assembler"
                )
            assembler.load_state_dict(self._loaded)
        self._mark = (up.state_dict(), self._loaded)
        it = up.iterator()
        push = assembler.push
        skip, emitted, pushes = self._emitted, 0, 0
        while True:
            if stateful and pushes >= CHECKPOINT_EVERY and emitted >= skip:
                self._mark = (up.state_dict(), assembler.state_dict())
                skip = emitted = pushes = self._emitted = 0
            try:
                item = next(it)
            except StopIteration:
                break
            pushes += 1
            for out in push(item):
                emitted += 1
                if emitted > skip:
                    self._emitted = emitted
                    yield out
        for out in assembler.finish(drop_last=self.drop_last):
            emitted += 1
            if emitted > skip:
                self._emitted = emitted
                yield out

    def state_dict(self) -> AssembleState:
        if self._mark is None:
            state: AssembleState = {
                "up": self.up.state_dict(),
                "assembler": self._loaded,
                "emitted": self._emitted,
            }
        else:
            up, assembler = self._mark
            state = {"up": up, "assembler": assembler, "emitted": self._emitted}
        if self._identity is not None:
            state["identity"] = self._identity
        return state

    @staticmethod
    def recorded_identity(state: State) -> object:
        """The assembler identity a state of this node recorded (None: none)."""
        return state.get("identity")

    def load_state_dict(self, state: State) -> None:
        self._check_not_started()
        self.up.load_state_dict(state_of(state, "up"))
        self._emitted = field(state, "emitted", int)
        if "assembler" not in state:
            raise StateError("resume state is missing 'assembler'; it was not taken from this pipeline")
        self._loaded = state["assembler"]
        self._identity = state.get("identity")

    def close(self) -> None:
        super().close()
        self.up.close()
