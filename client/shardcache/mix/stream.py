"""The iterators behind `Dataset.mix`: per-source pass streams, the proportional interleave, recipe batches.

Every iterator here follows the pipeline's contract: iterate, `state_dict()` (the position before the next
item, small and JSON-serialisable) and `load_state_dict(state)` (before iterating). They know nothing of
shards or datasets: a `PassSource` opens one pass over one source for this slot, so the same code serves
tars, jsonl, parquet, lance and cached pipelines.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypedDict

import numpy as np

from shardcache.errors import ConfigError, StateError
from shardcache.mix.plan import epoch_rng
from shardcache.node import State, field

if TYPE_CHECKING:
    from typing_extensions import TypeVar

    T = TypeVar("T", default=Any)  # the mixed sources' samples, passed on as they come; bare: Any
else:
    from typing import TypeVar

    T = TypeVar("T")

logger = logging.getLogger(__name__)

# Interleave positions are drawn block by block so an epoch of 10^8 samples needs no 10^8-entry
# permutation in memory, and a resume recomputes only per-block counts (one small draw per block).
BLOCK = 4096


class PassSource(Protocol[T]):
    """One source of a mix, as seen by one slot: pass `j` is one full pass over this slot's share."""

    name: str

    def open(self, pass_index: int, state: dict[str, object] | None) -> Iterator[T]:
        """An iterator over pass `pass_index`, resumed from `state` (the iterator's own state) if given."""
        ...

    def state(self, iterator: Iterator[T]) -> State:
        """The state of an iterator returned by `open`, before its next item."""
        ...


# A `PassStream`'s state: its pass, the samples taken in it and in all, the pass iterator's state (the
# functional form: "pass" is a keyword).
PassState = TypedDict("PassState", {"pass": int, "taken_in_pass": int, "taken": int, "inner": "State | None"})


class InterleaveState(TypedDict):
    """An `InterleaveIterator`'s state: samples drawn in the epoch, each stream's state."""

    position: int
    streams: list[PassState]


class RecipeState(TypedDict):
    """A `RecipeIterator`'s state: batches yielded, each stream's state."""

    batches: int
    streams: list[PassState]


class OrderedMixState(TypedDict):
    """An `OrderedMixIterator`'s state: picks drawn, the round-robin cursor, the credits, which sources
    are exhausted, each stream's state."""

    position: int
    cursor: int
    credit: list[int]
    exhausted: list[bool]
    streams: list[PassState]


def stream_states(state: State, count: int) -> list[State]:
    """The ``streams`` of a mix state, one per source (StateError when it does not hold `count`)."""
    streams = field(state, "streams", list)
    if len(streams) != count:
        raise StateError(f"mix state has {len(streams)} sources but this mix has {count}")
    if not all(isinstance(sub, dict) for sub in streams):
        raise StateError("mix state field 'streams' holds a stream state that is not an object")
    return streams


class PassStream(Generic[T]):
    """Samples of one source over consecutive passes, stopping after `limit` samples or `max_passes`.

    A source is upsampled by reading further passes (each reshuffled: the `PassSource` derives a new
    seed per pass) and cut in the middle of the last one, so counts are exact without random access.
    """

    def __init__(
        self,
        source: PassSource[T],
        limit: int | None = None,
        max_passes: int | None = None,
        allow_empty: bool = False,
    ) -> None:
        self.source = source
        self.limit = limit
        self.max_passes = max_passes
        self.allow_empty = allow_empty
        self.pass_index = 0
        self.taken_in_pass = 0
        self.taken = 0
        self._inner_state: dict[str, object] | None = None
        self._it: Iterator[T] | None = None

    def __iter__(self) -> PassStream[T]:
        return self

    def __next__(self) -> T:
        if self.limit is not None and self.taken >= self.limit:
            raise StopIteration
        while True:
            if self.max_passes is not None and self.pass_index >= self.max_passes:
                raise StopIteration
            if self._it is None:
                self._it = self.source.open(self.pass_index, self._inner_state)
                self._inner_state = None
            try:
                item = next(self._it)
            except StopIteration:
                if self.taken_in_pass == 0 and not self.allow_empty:
                    raise ConfigError(
                        f"mix source {self.source.name!r} yields no samples in this slot; give it at least "
                        f"one shard per slot (fewer slots, or more shards)"
                    ) from None
                self.pass_index += 1
                self.taken_in_pass = 0
                self.close()
                continue
            self.taken_in_pass += 1
            self.taken += 1
            return item

    def close(self) -> None:
        """Close the current pass's iterator (open shards, daemon plans), if it can be closed."""
        it, self._it = self._it, None
        close = getattr(it, "close", None)
        if close is not None:
            close()

    def state_dict(self) -> PassState:
        """Pass, counts and the inner iterator's state."""
        inner = self.source.state(self._it) if self._it is not None else self._inner_state
        return {
            "pass": self.pass_index,
            "taken_in_pass": self.taken_in_pass,
            "taken": self.taken,
            "inner": inner,
        }

    def load_state_dict(self, state: State) -> None:
        """Resume at `state` (from `state_dict`)."""
        self.pass_index = field(state, "pass", int)
        self.taken_in_pass = field(state, "taken_in_pass", int)
        self.taken = field(state, "taken", int)
        inner = state.get("inner")
        if inner is not None and not isinstance(inner, dict):
            raise StateError(f"mix state field 'inner'={inner!r} must be an object")
        self._inner_state = inner
        self._it = None


class InterleaveIterator(Generic[T]):
    """Samples of several pass streams in a seeded random order with exact per-source counts.

    The order of the `sum(counts)` positions is a uniformly random arrangement of the counts, drawn per
    block of `BLOCK` positions: the block's counts by a multivariate hypergeometric draw from what remains,
    then a permutation within the block. Deterministic from (seed, epoch, slot).
    """

    def __init__(
        self, streams: Sequence[PassStream[T]], counts: Sequence[int], seed: int, epoch: int, slot: int
    ):
        self.streams = list(streams)
        self.counts = np.asarray(counts, dtype=np.int64)
        self.total = int(self.counts.sum())
        self._key = (seed, epoch, slot)
        self._restart_counts()
        self._block: np.ndarray | None = None
        self._block_index = -1
        self.position = 0

    def _restart_counts(self) -> None:
        self._count_rng = epoch_rng(*self._key, 1)
        self._remaining = self.counts.copy()
        self._blocks_drawn = 0

    def _ensure_block(self, index: int) -> np.ndarray:
        """The source order of block `index`; block counts are drawn in sequence from the counts RNG."""
        if self._block is not None and self._block_index == index:
            return self._block
        if self._blocks_drawn > index:
            self._restart_counts()
        drawn = self._remaining
        while self._blocks_drawn <= index:
            size = min(BLOCK, int(self._remaining.sum()))
            drawn = self._count_rng.multivariate_hypergeometric(self._remaining, size)
            self._remaining = self._remaining - drawn
            self._blocks_drawn += 1
        order = np.repeat(np.arange(len(self.streams), dtype=np.int32), drawn)
        epoch_rng(*self._key, 2, index).shuffle(order)
        self._block, self._block_index = order, index
        return order

    def __iter__(self) -> InterleaveIterator[T]:
        return self

    def __next__(self) -> T:
        if self.position >= self.total:
            raise StopIteration
        index, offset = divmod(self.position, BLOCK)
        source = int(self._ensure_block(index)[offset])
        self.position += 1
        return next(self.streams[source])

    def state_dict(self) -> InterleaveState:
        """The position in the epoch and each stream's state."""
        return {"position": self.position, "streams": [s.state_dict() for s in self.streams]}

    def load_state_dict(self, state: State) -> None:
        """Resume at `state`: block counts up to the position are redrawn from the seeded RNG."""
        streams = stream_states(state, len(self.streams))
        self.position = field(state, "position", int)
        for stream, sub in zip(self.streams, streams, strict=True):
            stream.load_state_dict(sub)


class RecipeIterator(Generic[T]):
    """Batches with exactly `recipe[name]` samples from each source, until the main source's pass ends.

    Each batch lists the sources' samples in the recipe's order. A last batch the main source cannot fill
    is dropped (its samples are counted in the log), so every batch has the exact recipe.
    """

    def __init__(self, streams: Sequence[PassStream[T]], recipe: Sequence[int], main: int) -> None:
        self.streams = list(streams)
        self.recipe = list(recipe)
        self.main = main
        self.batches = 0
        self._done = False

    def __iter__(self) -> RecipeIterator[T]:
        return self

    def __next__(self) -> list[T]:
        if self._done:
            raise StopIteration
        parts: list[list[T]] = [[] for _ in self.streams]
        main_stream = self.streams[self.main]
        for _ in range(self.recipe[self.main]):
            try:
                parts[self.main].append(next(main_stream))
            except StopIteration:
                self._done = True
                if parts[self.main]:
                    logger.debug(
                        "recipe mix: dropped %d trailing samples of main source %r (short of a batch)",
                        len(parts[self.main]),
                        main_stream.source.name,
                    )
                raise StopIteration from None
        for i, stream in enumerate(self.streams):
            if i != self.main:
                parts[i] = [next(stream) for _ in range(self.recipe[i])]
        self.batches += 1
        return [sample for part in parts for sample in part]

    def state_dict(self) -> RecipeState:
        """Batches yielded and each stream's state (states are taken between batches)."""
        return {"batches": self.batches, "streams": [s.state_dict() for s in self.streams]}

    def load_state_dict(self, state: State) -> None:
        """Resume at `state` (from `state_dict`)."""
        streams = stream_states(state, len(self.streams))
        self.batches = field(state, "batches", int)
        for stream, sub in zip(self.streams, streams, strict=True):
            stream.load_state_dict(sub)


# -- the "mixed" source kind's ordered strategies (mvp-dataset's `Dataset.from_source("mixed", ...)`) --------

STRATEGIES = ("concat", "round_robin", "weighted_round_robin", "random", "weighted_random")
_MASK = (1 << 64) - 1


def _uniform(seed: int, epoch: int, slot: int, position: int) -> float:
    """A uniform number in [0, 1) for one position: a splitmix64 finaliser over the key (no RNG state)."""
    x = (
        seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + slot * 0x94D049BB133111EB + position
    ) & _MASK
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        x = ((x ^ (x >> shift)) * mult) & _MASK
    x ^= x >> 31
    return (x >> 11) / float(1 << 53)


class OrderedMixIterator:
    """Samples of several streams, each read once, in the order a strategy picks the next source.

    - "concat": every sample of the first source, then the second, ...
    - "round_robin": one sample of each source in turn, skipping exhausted ones.
    - "weighted_round_robin": smooth weighted round robin (each pick adds every active source's weight to
      its credit, takes the source with the most credit and charges it the active total), so weights 2:1
      read a, b, a, a, b, a, ...
    - "random" / "weighted_random": an active source drawn uniformly / in proportion to its weight, from
      (seed, epoch, slot, position): the same on every machine, with no RNG state to save.

    The mix ends when every source is exhausted. Samples that are dicts carry ``__source__`` (the source's
    name). The state is the pick position, the round-robin cursor, the credits, which sources are
    exhausted, and each stream's state.
    """

    def __init__(
        self,
        streams: Sequence[PassStream[object]],
        names: Sequence[str],
        strategy: str,
        weights: Sequence[int],
        seed: int,
        epoch: int,
        slot: int,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ConfigError(f"strategy={strategy!r}: expected one of {', '.join(map(repr, STRATEGIES))}")
        self.streams = list(streams)
        self.names = list(names)
        self.strategy = strategy
        self.weights = [int(w) for w in weights]
        self._key = (seed, epoch, slot)
        self.position = 0
        self.cursor = 0
        self.credit = [0] * len(self.streams)
        self.exhausted = [False] * len(self.streams)

    def __iter__(self) -> OrderedMixIterator:
        return self

    def __next__(self) -> object:
        while True:
            source = self._pick()
            if source is None:
                raise StopIteration
            try:
                item = next(self.streams[source])
            except StopIteration:
                self.exhausted[source] = True
                continue
            if isinstance(item, dict):
                item = {**item, "__source__": self.names[source]}
            return item

    def _pick(self) -> int | None:
        active = [i for i, done in enumerate(self.exhausted) if not done]
        if not active:
            return None
        if self.strategy == "concat":
            return active[0]
        if self.strategy == "round_robin":
            n = len(self.streams)
            while self.exhausted[self.cursor % n]:
                self.cursor += 1
            pick = self.cursor % n
            self.cursor = pick + 1
            return pick
        if self.strategy == "weighted_round_robin":
            for i in active:
                self.credit[i] += self.weights[i]
            pick = max(active, key=lambda i: (self.credit[i], -i))
            self.credit[pick] -= sum(self.weights[i] for i in active)
            return pick
        u = _uniform(*self._key, self.position)
        self.position += 1
        weights = [self.weights[i] if self.strategy == "weighted_random" else 1 for i in active]
        target, acc = u * sum(weights), 0.0
        for i, w in zip(active, weights, strict=True):
            acc += w
            if target < acc:
                return i
        return active[-1]

    def state_dict(self) -> OrderedMixState:
        """Picks drawn, cursor, credits, exhausted sources and each stream's state."""
        return {
            "position": self.position,
            "cursor": self.cursor,
            "credit": list(self.credit),
            "exhausted": list(self.exhausted),
            "streams": [s.state_dict() for s in self.streams],
        }

    def load_state_dict(self, state: State) -> None:
        """Resume at `state` (from `state_dict`)."""
        n = len(self.streams)
        lists = [state.get(k) for k in ("credit", "exhausted", "streams")]
        if not all(isinstance(v, list) and len(v) == n for v in lists):
            raise StateError(f"mixed state does not hold {n} sources; it was not taken from this mix")
        self.position, self.cursor = field(state, "position", int), field(state, "cursor", int)
        credit, exhausted = field(state, "credit", list), field(state, "exhausted", list)
        if not all(isinstance(c, int) for c in credit):
            raise StateError(f"mix state field 'credit'={credit!r} must list integers")
        self.credit = [int(c) for c in credit]
        self.exhausted = [bool(e) for e in exhausted]
        for stream, sub in zip(self.streams, stream_states(state, n), strict=True):
            stream.load_state_dict(sub)
