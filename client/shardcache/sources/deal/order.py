"""Epoch orders: which unit sits at position i of the order for (seed, epoch, round), in O(1) per position.

Every rank and worker derives the same order from (seed, epoch, round, salt) without talking to the others.
Position i of the order of range(n) is `sources.deal.feistel`'s seeded bijection of [0, n) at i, keyed by a
hash of those inputs: a slot that reads positions s, s + T, s + 2T, ... computes n / T images, never a
permutation of all n (`order_at`). `shuffled` still gives the whole order to the callers that need all of it.

The order is versioned (`ORDER_VERSION`): a resume state records the version its position was taken in, and
a state of another version is refused (`check_order_version`) rather than resumed at the same
position of a different order.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping

import numpy as np

from shardcache.errors import StateError
from shardcache.sources.deal.feistel import permute_positions

# The version of the orders made here and with them (the deal, node shares, exchanges), recorded in every
# source state (`SourceNode.state_dict`): a saved position means something only in the order it was taken
# in. 1: `random.Random(...).shuffle` of all n units (shardcache before the Feistel order; states without
# the key); 2: `sources.deal.feistel`, position by position, so a reader computes its own share only.
ORDER_VERSION = 2
LEGACY_ORDER_VERSION = 1
# A source state's key for the order its position was taken in (`sources.deal.order.ORDER_VERSION`).
ORDER_KEY = "order"


def order_key(seed: int, epoch: int, round_index: int = 0, salt: str = "") -> int:
    """The 64-bit key of the order for (seed, epoch, round, salt): the same in every process."""
    text = f"shardcache:{seed}:{epoch}:{round_index}{salt}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def order_at(
    positions: np.ndarray, n: int, seed: int, epoch: int, round_index: int = 0, salt: str = ""
) -> np.ndarray:
    """The units at `positions` of the order of range(n) for (seed, epoch, round, salt), an int64 array:
    O(len(positions)), whatever n (`sources.deal.feistel`). A slot asks for its stride of positions only."""
    key = order_key(seed, epoch, round_index, salt)
    return permute_positions(np.asarray(positions, dtype=np.int64), n, key)


def permutation(n: int, seed: int, epoch: int, round_index: int = 0, salt: str = "") -> list[int]:
    """The permutation of range(n) for (seed, epoch, round); the same in every process (a new list)."""
    return shuffled(n, seed, epoch, round_index, salt).tolist()  # type: ignore[no-any-return]


@functools.lru_cache(maxsize=4)
def shuffled(n: int, seed: int, epoch: int, round_index: int = 0, salt: str = "") -> np.ndarray:
    """The whole order of range(n) (`order_at` of every position) as a read-only array, kept for the last
    few (n, seed, epoch, round, salt) of this process: for the callers that need all of it (a mini-epoch's
    chunks, a jsonl source's file order, lance's global rows). A reader's own share never needs it."""
    array = order_at(np.arange(n, dtype=np.int64), n, seed, epoch, round_index, salt)
    array.setflags(write=False)
    return array


def check_order_version(state: object, what: str = "resume state") -> None:
    """Refuse a source state taken in another version of the epoch order: its position would point into a
    different order, and resuming it would read some units twice and skip others. States without the key
    were written before the order was versioned (version 1).

    Raises:
        StateError: [ResumeOrderVersionMismatch] naming both versions and what to do.
    """
    if not isinstance(state, Mapping):
        check_order(None, None, what)
        return
    check_order(state.get(ORDER_KEY, LEGACY_ORDER_VERSION), state.get("epoch"), what)


def check_order(saved: object, epoch: object, what: str = "resume state") -> None:
    """Refuse a position taken in epoch order version `saved` (of `epoch`) unless it is this version's.

    Raises:
        StateError: [ResumeOrderVersionMismatch] naming both versions and what to do.
    """
    if saved == ORDER_VERSION:
        return
    raise StateError(
        f"{what} was taken in epoch order version {saved!r} (epoch {epoch!r}); this shardcache "
        f"deals epochs in order version {ORDER_VERSION} (a Feistel permutation instead of a full shuffle), "
        "so its position would point into another order. Start the epoch anew (call set_epoch(epoch) and "
        "iterate without loading this state, or load a state taken at an epoch boundary), or finish the "
        "epoch with the shardcache version that wrote the state",
        code="ResumeOrderVersionMismatch",
    )
