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
"""

from __future__ import annotations

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


def _feistel(values: np.ndarray, bits: int, seed: int) -> np.ndarray:
    # A balanced-as-possible Feistel network over `bits`-bit integers: a bijection of [0, 2**bits).
    low_bits = bits - bits // 2
    high_mask = np.uint64((1 << (bits // 2)) - 1)
    low_mask = np.uint64((1 << low_bits) - 1)
    high = values >> np.uint64(low_bits)
    low = values & low_mask
    for round_index in range(_ROUNDS):
        key = np.uint64((seed ^ ((round_index + 1) * _GOLDEN)) & _MASK64)
        if round_index % 2 == 0:
            low = (low ^ _mix64(high ^ key)) & low_mask
        else:
            high = (high ^ _mix64(low ^ key)) & high_mask
    return (high << np.uint64(low_bits)) | low


def permute_positions(positions: np.ndarray, total: int, seed: int) -> np.ndarray:
    """Where a seeded permutation of ``[0, total)`` sends each position (mvp-dataset's Lance permutation).

    A Feistel network over the smallest power of two holding `total` (at least 4), walked again from any
    value at or past `total` until it lands inside (cycle walking), so the map is a bijection of
    ``[0, total)``. Same `total` and `seed`, same image, on every machine.

    Example:
        >>> sorted(permute_positions(np.arange(10), 10, seed=3).tolist()) == list(range(10))
        True
    """
    result = np.asarray(positions, dtype=np.uint64).copy()
    if total <= 1 or not len(result):
        return np.zeros(len(result), dtype=np.int64)
    bits = max(2, (total - 1).bit_length())
    pending = np.arange(len(result))
    for _ in range(_MAX_WALKS):
        result[pending] = _feistel(result[pending], bits, seed)
        pending = pending[result[pending] >= np.uint64(total)]
        if not len(pending):
            return result.astype(np.int64)
    raise RuntimeError(f"permute_positions: no value under {total} after {_MAX_WALKS} walks (seed={seed})")
