"""The one contract every source and stage iterator follows (torchdata.nodes style).

A node is an iterator with `state_dict()` (small, JSON-serialisable, the position BEFORE the next item) and
`load_state_dict(state)` (called before the first item). Nodes pull from their upstream's generator
directly (`upstream.iterator()`), so a pipeline costs one generator frame per stage per sample and no
per-sample method dispatch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeAlias

from shardcache.errors import StateError

if TYPE_CHECKING:
    from typing_extensions import TypeVar

    T = TypeVar("T", default=Any)  # a bare `Node` is `Node[Any]`
else:
    from typing import TypeVar

    T = TypeVar("T")

State = dict[str, Any]

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
        below: State = _field(state, "up", dict)
        return below

    def close(self) -> None:
        """Release resources (open shards, daemon plans)."""
        if self._it is not None and hasattr(self._it, "close"):
            self._it.close()


class StatelessNode(Node[T]):
    """A 1:1 or filtering stage whose position is its upstream's (map, select)."""

    def __init__(self, up: Node) -> None:
        super().__init__()
        self.up = up

    def state_dict(self) -> State:
        return {"up": self.up.state_dict()}

    def load_state_dict(self, state: State) -> None:
        self._check_not_started()
        self.up.load_state_dict(_field(state, "up", dict))

    def close(self) -> None:
        super().close()
        self.up.close()


def _field(state: State, name: str, kind: type) -> Any:
    if not isinstance(state, dict) or not isinstance(state.get(name), kind):
        raise StateError(
            f"resume state is missing {name!r} ({kind.__name__}); it was not taken from this pipeline"
        )
    return state[name]


field = _field
