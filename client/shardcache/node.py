"""The one contract every source and stage iterator follows (torchdata.nodes style).

A node is an iterator with `state_dict()` (small, JSON-serialisable, the position BEFORE the next item) and
`load_state_dict(state)` (called before the first item). Nodes pull from their upstream's generator
directly (`upstream.iterator()`), so a pipeline costs one generator frame per stage per sample and no
per-sample method dispatch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypedDict

from shardcache.errors import StateError

if TYPE_CHECKING:
    from typing_extensions import TypeVar

    T = TypeVar("T", default=Any)  # a bare `Node` is `Node[Any]`
else:
    from typing import TypeVar

    T = TypeVar("T")

# A node's state as its readers see it: a JSON object whose values each node checks when it loads it
# (`field`, `state_below`). Each node kind returns its own TypedDict (a `Mapping[str, object]`), which
# says what it writes; a loaded state is untrusted JSON until its node has read it.
State = Mapping[str, object]

V = TypeVar("V")

# A JSON document as `json.loads` returns it: what descriptions, identities and wire payloads are when
# no narrower type (a TypedDict) says more.
JSONValue: TypeAlias = "str | int | float | bool | None | list[JSONValue] | dict[str, JSONValue]"
JSONObject: TypeAlias = "dict[str, JSONValue]"


class Node(Generic[T]):
    """Base of every source and stage iterator; `Node[T]` yields items of type T (`Node` alone: Any)."""

    def __init__(self) -> None:
        self._it: Iterator[T] | None = None

    def gen(self) -> Iterator[T]:
        """The generator of this node's items; subclasses implement it."""
        raise NotImplementedError

    def iterator(self) -> Iterator[T]:
        """This node's running generator (created on first use, after any `load_state_dict`)."""
        if self._it is None:
            self._it = self.gen()
        return self._it

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        return next(self._it if self._it is not None else self.iterator())

    def state_dict(self) -> State:
        """The position before the next item."""
        raise NotImplementedError

    def load_state_dict(self, state: State) -> None:
        """Resume from `state`; only before the first item."""
        raise NotImplementedError

    def _check_not_started(self) -> None:
        if self._it is not None:
            raise StateError("load_state_dict must be called before iteration starts; build a new iterator")

    @staticmethod
    def state_below(state: State) -> State:
        """The state of the node a stage reads from, as the stage's own state holds it (under "up").

        How code outside a node walks a chain of states: through this and each node's own readers
        (`ShuffleNode.progress`, `sources.base.unit_position`), never by the keys themselves.
        """
        return state_of(state, "up")

    def close(self) -> None:
        """Release resources (open shards, daemon plans)."""
        if self._it is not None and hasattr(self._it, "close"):
            self._it.close()


class UpState(TypedDict):
    """The state of a stage whose position is its upstream's (`StatelessNode`)."""

    up: State


class StatelessNode(Node[T]):
    """A 1:1 or filtering stage whose position is its upstream's (map, select)."""

    def __init__(self, up: Node) -> None:
        super().__init__()
        self.up = up

    def state_dict(self) -> UpState:
        return {"up": self.up.state_dict()}

    def load_state_dict(self, state: State) -> None:
        self._check_not_started()
        self.up.load_state_dict(state_of(state, "up"))

    def close(self) -> None:
        super().close()
        self.up.close()


def field(state: object, name: str, kind: type[V]) -> V:
    """`state[name]`, checked to be a `kind` (StateError naming the field when it is not): how a node reads
    a loaded state's values once, at the boundary."""
    value = state.get(name) if isinstance(state, Mapping) else None
    if not isinstance(value, kind):
        raise StateError(
            f"resume state is missing {name!r} ({kind.__name__}); it was not taken from this pipeline"
        )
    return value


def state_of(state: object, name: str) -> State:
    """The node state `state[name]` holds (a JSON object; StateError naming the field when it is not)."""
    value: State = field(state, name, dict)
    return value
