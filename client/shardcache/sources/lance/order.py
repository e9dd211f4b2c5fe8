"""Row orders of the lance source and the validation of its ordering options (mvp-dataset 0.2.3).

`shuffle_mode="chunk"` (mvp-dataset's bounded-window shuffle): the row space (every row, or the rows a
filter/subset keeps) is cut into consecutive chunks of `chunk_size` rows, the chunks are permuted per
(seed, epoch, round), and every `k` consecutive chunks of that order form a window. With
`row_order="permuted"` the rows of a window are shuffled together; with "sequential" each chunk is read in
source order (runs of up to `chunk_size` consecutive rows). Reads stay local to `k` chunks at a time, which
is the point of the mode: a near-global shuffle whose reads touch a bounded part of the dataset.
As with "global", slot s of T reads positions s, s+T, s+2T, ... of that order.

`read_batch_size` is how many rows one Lance read call fetches. It never changes which rows come or their
order (rows are planned, then read in groups), so it stays out of fingerprints and resume states.

numpy is imported inside the functions: `import shardcache` must not need it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from shardcache.errors import ConfigError, positive_int
from shardcache.sources.deal.order import permutation

SHUFFLE_MODES = ("none", "global", "chunk", "random_scan")
ROW_ORDERS = ("permuted", "sequential")


@dataclass(frozen=True)
class ChunkShuffle:
    """`chunk_shuffle=` resolved: chunk size in rows, chunks per window, order of rows in a window."""

    chunk_size: int = 250_000
    k: int = 8
    row_order: str = "permuted"

    def describe(self) -> str:
        """A key-order independent rendering for fingerprints."""
        return f"chunk_size={self.chunk_size},k={self.k},row_order={self.row_order}"


DEFAULT_CHUNK_SHUFFLE = ChunkShuffle()

# Positions 0..n-1 in a reading order: as they come (range), permuted (list), chunk-shuffled (numpy).
RowOrder: TypeAlias = "range | list[int] | npt.NDArray[np.int64]"


def check_read_batch_size(options: Mapping[str, object]) -> None:
    """`read_batch_size`: rows per Lance read call, a positive integer (mvp-dataset's default is 1024)."""
    if "read_batch_size" in options:
        positive_int("read_batch_size", options["read_batch_size"])


def resolve_chunk_shuffle(value: object) -> ChunkShuffle:
    """`chunk_shuffle=` (None or a dict of chunk_size, k, row_order) as a ChunkShuffle; ConfigError if bad."""
    if value is None:
        return DEFAULT_CHUNK_SHUFFLE
    if isinstance(value, ChunkShuffle):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"chunk_shuffle={value!r}: expected a dict with keys chunk_size, k, row_order "
            "(e.g. {'chunk_size': 65536, 'k': 4, 'row_order': 'sequential'})"
        )
    unknown = sorted(str(key) for key in value if key not in ("chunk_size", "k", "row_order"))
    if unknown:
        raise ConfigError(
            f"chunk_shuffle: unknown config key(s) {', '.join(unknown)}; accepted: chunk_size, k, row_order"
        )
    row_order = value.get("row_order", DEFAULT_CHUNK_SHUFFLE.row_order)
    if row_order not in ROW_ORDERS:
        raise ConfigError(f"chunk_shuffle row_order={row_order!r}: expected one of {ROW_ORDERS}")
    return ChunkShuffle(
        chunk_size=positive_int(
            "chunk_shuffle chunk_size", value.get("chunk_size", DEFAULT_CHUNK_SHUFFLE.chunk_size)
        ),
        k=positive_int("chunk_shuffle k", value.get("k", DEFAULT_CHUNK_SHUFFLE.k)),
        row_order=str(row_order),
    )


def check_chunk_shuffle(options: Mapping[str, object]) -> None:
    """`chunk_shuffle` is valid and, unless None, only given with shuffle_mode="chunk" (as in mvp-dataset)."""
    value = options.get("chunk_shuffle")
    if value is None:
        return
    mode = options.get("shuffle_mode", "none")
    if mode != "chunk":
        raise ConfigError(
            f"chunk_shuffle={value!r} requires shuffle_mode='chunk' (got shuffle_mode={mode!r}); "
            "pass chunk_shuffle=None with the other modes"
        )
    resolve_chunk_shuffle(value)


def _rng(seed: int, epoch: int, round_index: int, salt: str) -> np.random.Generator:
    # A stable 128-bit seed from the inputs (Python's hash() is salted per process).
    text = f"shardcache:lance-chunk:{seed}:{epoch}:{round_index}:{salt}".encode()
    return np.random.default_rng(int.from_bytes(hashlib.sha256(text).digest()[:16], "little"))


def chunk_order(
    n: int, config: ChunkShuffle, seed: int, epoch: int, round_index: int
) -> npt.NDArray[np.int64]:
    """Positions 0..n-1 in chunk-shuffle order for (seed, epoch, round): an int64 numpy array."""
    size = config.chunk_size
    chunks = -(-n // size)
    order = _rng(seed, epoch, round_index, "chunks").permutation(chunks)
    pieces = []
    for first in range(0, chunks, config.k):
        window = np.concatenate(
            [
                np.arange(c * size, min((c + 1) * size, n), dtype=np.int64)
                for c in order[first : first + config.k]
            ]
        )
        if config.row_order == "permuted":
            # Each window draws from its own stream so that a window's rows do not depend on earlier ones.
            window = _rng(seed, epoch, round_index, f"window:{first // config.k}").permutation(window)
        pieces.append(window)
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def row_sequence(
    mode: str, n: int, chunk_shuffle: object, seed: int, epoch: int, round_index: int = 0
) -> RowOrder:
    """Positions 0..n-1 in the order `mode` reads them in (seed, epoch, round) before slots are dealt
    (`chunk_shuffle`: the option's value, for mode "chunk")."""
    if mode == "none":
        return range(n)
    if mode == "chunk":
        config = resolve_chunk_shuffle(chunk_shuffle)
        return chunk_order(n, config, seed, epoch, round_index)
    return permutation(n, seed, epoch, round_index)


def fingerprint_neutral(name: str, value: object) -> bool:
    """Lance options that never change which rows come or their order (kept out of fingerprints)."""
    if name == "read_batch_size":
        return True
    if name == "chunk_shuffle":
        return value is None or resolve_chunk_shuffle(value) == DEFAULT_CHUNK_SHUFFLE
    return False


def shown(name: str, value: object) -> str | None:
    """How a fingerprint spells a lance option whose value has several spellings, else None."""
    if name == "chunk_shuffle" and value is not None:
        return resolve_chunk_shuffle(value).describe()
    return None
