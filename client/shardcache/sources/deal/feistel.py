"""A seeded bijection of [0, n) that maps one position in O(1): a Feistel network with cycle walking.

An epoch's order over n units is position -> unit, `permute_positions(positions, n, key)`. A reader that
needs positions s, s + T, s + 2T, ... (its stride of the deal) computes those n / T images and nothing else:
no permutation of all n is ever materialised unless a caller asks for all of it.

Hand-written because neither numpy (`Generator.permutation` and `shuffle` are O(n) and yield the whole
permutation) nor another maintained library installed here gives a keyed permutation evaluated at a single
index; the construction is the textbook one (a balanced Feistel network is a bijection of [0, 2**bits) for
any round function; cycle walking, re-applying it until the value is below n, restricts it to a bijection of
[0, n), Black & Rogaway 2002), and small enough to read here. The round function is splitmix64's finaliser,
vectorised over uint64 arrays. Its images are pinned by tests (mvp-dataset's Lance `sample` uses the same
map, `shardcache.sources.deal.subset`), so changing anything here changes orders and subsets: do not.

Many positions at once (a group's whole order, which `even=` needs) are mapped through each round's table
of images of every half-value (`_TableFeistel`: 2**(bits / 2) mixes per round instead of one per position,
then a gather per round: ~25 ms for 10^6 positions against ~0.3 s); a few (a slot's stride) are mixed one
by one. Both are the same map (`tests/client/sources/deal/test_feistel.py`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_ROUNDS = 8
_MAX_WALKS = 1024


def _mix64(values: np.ndarray) -> np.ndarray:
    # splitmix64's finaliser on uint64 arrays (their arithmetic wraps modulo 2**64).
    values = values + np.uint64(_GOLDEN)
    values = (values ^ (values >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    values = (values ^ (values >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    mixed: np.ndarray = values ^ (values >> np.uint64(31))
    return mixed


def _round_keys(seed: int) -> list[np.uint64]:
    return [np.uint64((seed ^ ((r + 1) * _GOLDEN)) & _MASK64) for r in range(_ROUNDS)]


def _feistel(values: np.ndarray, bits: int, seed: int) -> np.ndarray:
    # A balanced-as-possible Feistel network over `bits`-bit integers: a bijection of [0, 2**bits).
    low_bits = bits - bits // 2
    high_mask = np.uint64((1 << (bits // 2)) - 1)
    low_mask = np.uint64((1 << low_bits) - 1)
    high = values >> np.uint64(low_bits)
    low = values & low_mask
    for round_index, key in enumerate(_round_keys(seed)):
        if round_index % 2 == 0:
            low = (low ^ _mix64(high ^ key)) & low_mask
        else:
            high = (high ^ _mix64(low ^ key)) & high_mask
    return (high << np.uint64(low_bits)) | low


class _TableFeistel:
    """`_feistel` for many values at once, the same map: a round's input is one half of the value (at most
    32 bits), so each round's function is looked up in a table of its images of every half, computed
    once per call, instead of mixing every value (8 splitmix64 passes over uint64 arrays become 8 gathers
    from tables small enough to stay in cache, on int64 halves, which numpy indexes without converting)."""

    def __init__(self, bits: int, seed: int) -> None:
        self.low_bits = bits - bits // 2
        low_mask, high_mask = np.uint64((1 << self.low_bits) - 1), np.uint64((1 << (bits // 2)) - 1)
        # An even round changes the low half by a function of the high half; an odd round the reverse.
        halves = (
            np.arange(1 << (bits // 2), dtype=np.uint64),
            np.arange(1 << self.low_bits, dtype=np.uint64),
        )
        self.tables = [
            (_mix64(halves[r % 2] ^ key) & (low_mask, high_mask)[r % 2]).astype(np.int64)
            for r, key in enumerate(_round_keys(seed))
        ]

    def __call__(self, values: np.ndarray) -> np.ndarray:
        """The images of `values` (int64, in [0, 2**bits)), an int64 array."""
        high = values >> self.low_bits
        low = values & ((1 << self.low_bits) - 1)
        for round_index, table in enumerate(self.tables):
            if round_index % 2 == 0:
                low ^= table[high]
            else:
                high ^= table[low]
        high <<= self.low_bits
        high |= low
        return high


def permute_positions(positions: np.ndarray, total: int, seed: int) -> np.ndarray:
    """Where a seeded permutation of ``[0, total)`` sends each position (mvp-dataset's Lance permutation).

    A Feistel network over the smallest power of two holding `total` (at least 4), walked again from any
    value at or past `total` until it lands inside (cycle walking), so the map is a bijection of
    ``[0, total)``. Same `total` and `seed`, same image, on every machine.

    Example:
        >>> sorted(permute_positions(np.arange(10), 10, seed=3).tolist()) == list(range(10))
        True
    """
    values = np.asarray(positions, dtype=np.int64)
    if total <= 1 or not len(values):
        return np.zeros(len(values), dtype=np.int64)
    bits = max(2, (total - 1).bit_length())
    if bits > 62 or (1 << (bits - bits // 2)) > len(values):
        # Few values (a slot's stride) or a range past int64's: mix each value (tables would cost more).
        return _walked(values.astype(np.uint64), total, lambda v: _feistel(v, bits, seed), seed).astype(
            np.int64
        )
    return _walked(values, total, _TableFeistel(bits, seed), seed)


def _walked(
    values: np.ndarray, total: int, feistel: Callable[[np.ndarray], np.ndarray], seed: int
) -> np.ndarray:
    # Cycle walking: the network's images, then only those at or past `total` go round again.
    result = feistel(values)
    pending = np.flatnonzero(result >= total)
    for _ in range(_MAX_WALKS):
        if not len(pending):
            return result
        walked = feistel(result[pending])
        result[pending] = walked
        pending = pending[walked >= total]
    raise RuntimeError(f"permute_positions: no value under {total} after {_MAX_WALKS} walks (seed={seed})")
