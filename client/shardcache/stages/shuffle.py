"""`.shuffle(buffer_size, initial=None)`: a bounded-memory shuffle, deterministic per slot and epoch.

Resume state (small, no sample data): the number of inputs taken `t` and outputs emitted `e`, plus one
upstream state saved at a checkpoint at or before the oldest input still in the buffer. Because the
shuffle is a deterministic function of (seed, t, e), resuming first replays it over input *indices* only
(t list operations and e RNG draws, no I/O and no decoding) to learn which inputs the buffer holds and in
which order, then re-reads the upstream from the checkpoint to input t, keeping exactly those inputs.

Cost model of a resume: O(t) integer steps (about a second per million inputs in CPython), plus re-reading
the upstream from the checkpoint: the oldest buffered input is typically about `buffer_size · ln(buffer_size)`
inputs back (an input survives each draw with probability 1 - 1/buffer_size), plus at most `CHECKPOINT_EVERY`
more. Iteration keeps the upstream states of the checkpoints since the oldest buffered input (one small dict
per `CHECKPOINT_EVERY` inputs).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar, TypedDict

from shardcache.buffer_shuffle import effective_initial, replay, rng_seed
from shardcache.context import RuntimeContext
from shardcache.errors import StateError
from shardcache.node import Node, State, field, state_of
from shardcache.stages.traits import StageTraits

CHECKPOINT_EVERY = 64  # a power of two: the hot loop tests `taken & (CHECKPOINT_EVERY - 1)`


@dataclass(frozen=True)
class ShuffleStage(StageTraits):
    """Shuffle through a buffer of `buffer_size` samples; emitting starts once `initial` samples are in.

    The RNG is seeded from (seed, slot, epoch) unless `seed` is given; TP co-members share a slot, so they
    shuffle identically.
    """

    buffer_size: int
    initial: int | None = None
    seed: int | None = None
    kind: ClassVar[str] = "shuffle"
    described_args: ClassVar[tuple[str, ...]] = ("buffer_size", "initial", "seed")
    keeps_count: ClassVar[bool] = True
    before_cache: ClassVar[bool] = True  # reorders only: deliberately not part of the cache's identity

    def before_cache_warning(self) -> str:
        return (
            f"shuffle(buffer_size={self.buffer_size}) before .cache() is materialised once: every epoch "
            "reads the cached order, and the shuffle is not part of the cache fingerprint (changing it "
            "reuses the entry). Shuffle after .cache() to reshuffle every epoch"
        )

    def node(self, up: Node, ctx: RuntimeContext) -> Node:
        return ShuffleNode(up, self.buffer_size, self.initial, rng_seed(ctx, self.seed))

    def describe(self) -> str:
        return f"shuffle({self.buffer_size},{self.initial},{self.seed})"


class ShuffleState(TypedDict):
    """A shuffle's state: the upstream state at input `at` (the oldest checkpoint a resume can need), the
    inputs taken from upstream and the outputs emitted so far."""

    up: State
    at: int
    taken: int
    emitted: int


class ShuffleNode(Node):
    @staticmethod
    def progress(state: State) -> tuple[int, int]:
        """(taken, emitted) of a shuffle's state: inputs taken from upstream and outputs emitted so far
        (which inputs are still buffered is replayed from these, `buffered_inputs`)."""
        return field(state, "taken", int), field(state, "emitted", int)

    def __init__(self, up: Node, buffer_size: int, initial: int | None, rng_seed: str) -> None:
        super().__init__()
        self.up = up
        self.buffer_size = buffer_size
        self.initial = effective_initial(buffer_size, initial)
        self.rng_seed = rng_seed
        self._buf: list[object] = []
        self._emitted = 0
        self._pending: ShuffleState | None = None
        # (input index, upstream state before that input), oldest first; the first is at or before the
        # oldest input in the buffer.
        self._marks: deque[tuple[int, State]] = deque()

    def gen(self) -> Iterator[object]:
        up, marks = self.up, self._marks
        size, initial, mask = self.buffer_size, self.initial, CHECKPOINT_EVERY - 1
        buf: list[object] = []
        idx: list[int] = []  # the input index of each buffered item, swapped along with it
        if self._pending is None:
            rng, grow, taken, emitted = random.Random(self.rng_seed), False, 0, 0
            it = up.iterator()
        else:
            state, self._pending = self._pending, None
            taken, emitted, at = state["taken"], state["emitted"], state["at"]
            rng, idx, grow = replay(self.rng_seed, self.buffer_size, self.initial, taken, emitted)
            it = up.iterator()
            wanted = set(idx)
            found: dict[int, object] = {}
            for i in range(at, taken):
                if not i & mask:
                    marks.append((i, up.state_dict()))
                try:
                    item = next(it)
                except StopIteration:
                    raise StateError(
                        f"shuffle resume: the upstream ended after {i} inputs, the state says {taken}; "
                        "it was taken from other data"
                    ) from None
                if i in wanted:
                    found[i] = item
            buf = [found[i] for i in idx]
        # state_dict() reads these: inputs taken = emitted + len(buffer) at every yield.
        self._buf, self._emitted = buf, emitted
        oldest = min(idx) if idx else taken
        randrange = rng.randrange
        while True:
            if not taken & mask:
                marks.append((taken, up.state_dict()))
            try:
                item = next(it)
            except StopIteration:
                break
            buf.append(item)
            idx.append(taken)
            taken += 1
            n = len(buf)
            if n < initial:
                continue
            if n < size:
                # The rule of `shardcache.buffer_shuffle` (inline: this is the hot loop); between `initial`
                # and `buffer_size` the buffer grows by one every second input.
                grow = not grow
                if grow:
                    continue
            j = randrange(n)
            buf[j], buf[-1] = buf[-1], buf[j]
            idx[j], idx[-1] = idx[-1], idx[j]
            out = buf.pop()
            if idx.pop() == oldest:
                oldest = self._advance_oldest(idx, taken)
            emitted += 1
            self._emitted = emitted
            yield out
        while buf:
            j = randrange(len(buf))
            buf[j], buf[-1] = buf[-1], buf[j]
            idx[j], idx[-1] = idx[-1], idx[j]
            out = buf.pop()
            if idx.pop() == oldest:
                oldest = self._advance_oldest(idx, taken)
            emitted += 1
            self._emitted = emitted
            yield out

    def _advance_oldest(self, idx: list[int], taken: int) -> int:
        # The oldest input left the buffer (probability 1/n per draw, so O(1) amortised): drop the
        # checkpoints no resume can need any more.
        oldest = min(idx) if idx else taken
        marks = self._marks
        while len(marks) > 1 and marks[1][0] <= oldest:
            marks.popleft()
        return oldest

    def state_dict(self) -> ShuffleState:
        if self._pending is not None:
            return self._pending
        if not self._marks:
            return {"up": self.up.state_dict(), "at": 0, "taken": 0, "emitted": 0}
        at, up = self._marks[0]
        return {"up": up, "at": at, "taken": self._emitted + len(self._buf), "emitted": self._emitted}

    def load_state_dict(self, state: State) -> None:
        self._check_not_started()
        up = state_of(state, "up")
        at, taken, emitted = (field(state, name, int) for name in ("at", "taken", "emitted"))
        if min(at, taken, emitted) < 0 or at > taken:
            raise StateError(
                f"shuffle resume state has bad positions {[at, taken, emitted]}; it was not taken here"
            )
        self.up.load_state_dict(up)
        self._pending = {"up": up, "at": at, "taken": taken, "emitted": emitted}

    def close(self) -> None:
        super().close()
        self.up.close()
