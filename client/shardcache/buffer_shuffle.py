"""The bounded-buffer shuffle's rule, written once: what `.shuffle()` draws, and what a resume replays.

A shuffle of `buffer_size` emits nothing until `initial` inputs are in; between `initial` and
`buffer_size` the buffer grows by one every second input; at `buffer_size` every input is followed by one
draw (a random buffered item is swapped to the end and emitted); after the upstream ends the buffer drains
with one draw per output. The RNG is seeded from the slot's sample-shuffle seed (or the stage's own `seed`)
and the epoch. `ShuffleNode.gen` (`shardcache.stages.shuffle`) runs this rule inline over samples (its hot
loop); `replay` runs it over input indices, with no samples, to learn what a checkpointed shuffle held —
for the shuffle's own resume and for an elastic resume that replays the old readers' shuffles
(`shardcache.sources.deal.pieces`). The tests of both resumes hold that the two agree.
"""

from __future__ import annotations

import random

from shardcache.context import RuntimeContext
from shardcache.errors import StateError


def rng_seed(ctx: RuntimeContext, seed: int | None) -> str:
    """The RNG seed of the shuffle a slot runs in its epoch (TP co-members share a slot, so they agree)."""
    base = ctx.sample_shuffle_seed if seed is None else seed
    return f"shuffle:{base}:{ctx.epoch}"


def effective_initial(buffer_size: int, initial: int | None) -> int:
    """How many inputs are in before the first output: `initial` within [1, buffer_size], default all."""
    return buffer_size if initial is None else max(1, min(initial, buffer_size))


def replay(
    seed: str, buffer_size: int, initial: int, taken: int, emitted: int
) -> tuple[random.Random, list[int], bool]:
    """The RNG, the buffer (as input indices, in buffer order) and the grow phase after `taken` inputs and
    `emitted` outputs.

    Raises:
        StateError: no shuffle reaches (taken, emitted) (the state was not taken by this shuffle).
    """
    rng = random.Random(seed)
    randrange = rng.randrange
    buf: list[int] = []
    grow = False
    out = 0
    for i in range(taken):
        buf.append(i)
        n = len(buf)
        if n < initial:
            continue
        if n < buffer_size:
            grow = not grow
            if grow:
                continue
        j = randrange(n)
        buf[j], buf[-1] = buf[-1], buf[j]
        buf.pop()
        out += 1
    if out > emitted:
        raise StateError(f"shuffle resume state is inconsistent ({emitted} outputs after {taken} inputs)")
    for _ in range(emitted - out):  # the state was taken while draining after the upstream ended
        if not buf:
            raise StateError(f"shuffle resume state emits {emitted} of only {taken} inputs")
        j = randrange(len(buf))
        buf[j], buf[-1] = buf[-1], buf[j]
        buf.pop()
    return rng, buf, grow


def buffered_inputs(
    ctx: RuntimeContext, buffer_size: int, initial: int | None, seed: int | None, taken: int, emitted: int
) -> list[int]:
    """The input indices the shuffle of slot `ctx` still buffered after `taken` inputs and `emitted`
    outputs: with every input before `taken` not among them, that is what it had emitted."""
    size = buffer_size
    return replay(rng_seed(ctx, seed), size, effective_initial(size, initial), taken, emitted)[1]
