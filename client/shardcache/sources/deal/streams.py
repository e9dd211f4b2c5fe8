"""Piece streams as arrays, cut as `partition.cut` cuts them, for one slice at a time (`slot_share`).

A stream is pieces in reading order: unit, start, stop, pad. `_EvenDeal` (`sources.deal.share`) needs one
slice of a stream of about n pieces: the slice's edges are sample positions, so finding them needs the
cumulative sample count of every piece before them, but nothing else of the other pieces. So a stream here
is `Pieces`: its `edges` (cumulative samples, one int64 array) and `pick` (the pieces of one range of
positions, as arrays). A stream read in an epoch's order (`Ordered`) gathers each piece's size in that
order, as the smallest integers that hold it (a random gather over 10^6 int64 is cache misses; over uint8
it stays in cache), and the other fields only for the pieces a slice keeps.

Every stream given to `cut_slice` holds pieces of at least one sample (`nonempty`): the edges then find
each piece by binary search.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import numpy as np

from shardcache.sources.deal.partition import Piece

_INT = np.int64


def compact(values: np.ndarray) -> np.ndarray:
    """`values` (non-negative integers) as the smallest unsigned integers that hold them all."""
    top = int(values.max()) if len(values) else 0
    for kind in (np.uint8, np.uint16, np.uint32):
        if top <= np.iinfo(kind).max:
            return values.astype(kind)
    return values


def _edges(sizes: np.ndarray) -> np.ndarray:
    edges = np.zeros(len(sizes) + 1, dtype=_INT)
    np.cumsum(sizes, out=edges[1:])
    return edges


class Pieces(Protocol):
    """A stream as `cut_slice` reads it."""

    @property
    def edges(self) -> np.ndarray:
        """Piece i holds the stream's samples [edges[i], edges[i + 1]): len(self) + 1 int64 values."""
        ...

    def __len__(self) -> int: ...

    def pick(self, first: int, last: int) -> Stream:
        """The pieces at positions [first, last), in order."""
        ...


@dataclass(frozen=True)
class Stream:
    """Pieces in reading order, as arrays: unit, start, stop, pad."""

    unit: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    pad: np.ndarray

    @staticmethod
    def whole(units: np.ndarray, sizes: np.ndarray) -> Stream:
        """Whole units, `sizes` their samples (in the same order)."""
        zeros = np.zeros(len(units), dtype=_INT)
        return Stream(units, zeros, sizes, np.zeros(len(units), dtype=bool))

    @staticmethod
    def empty() -> Stream:
        return Stream.whole(np.zeros(0, dtype=_INT), np.zeros(0, dtype=_INT))

    def __len__(self) -> int:
        return len(self.unit)

    @property
    def sizes(self) -> np.ndarray:
        sizes: np.ndarray = self.stop - self.start
        return sizes

    @cached_property
    def edges(self) -> np.ndarray:
        return _edges(self.sizes)

    def pick(self, first: int, last: int) -> Stream:
        return Stream(
            self.unit[first:last], self.start[first:last], self.stop[first:last], self.pad[first:last]
        )

    def take(self, index: np.ndarray) -> Stream:
        return Stream(self.unit[index], self.start[index], self.stop[index], self.pad[index])

    def nonempty(self) -> Stream:
        keep = self.stop > self.start
        return self if keep.all() else self.take(np.flatnonzero(keep))

    @staticmethod
    def join(parts: Sequence[Stream]) -> Stream:
        return Stream(
            np.concatenate([p.unit for p in parts]),
            np.concatenate([p.start for p in parts]),
            np.concatenate([p.stop for p in parts]),
            np.concatenate([p.pad for p in parts]),
        )

    def pieces(self) -> list[Piece]:
        fields = (self.unit.tolist(), self.start.tolist(), self.stop.tolist(), self.pad.tolist())
        return [Piece(u, a, b, p) for u, a, b, p in zip(*fields, strict=True)]


@dataclass(frozen=True)
class Ordered:
    """`base` (pieces of at least one sample) read in `order` (positions of `base`), gathered lazily."""

    base: Stream
    order: np.ndarray
    edges: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        sizes = compact(self.base.sizes)[self.order].astype(_INT)
        object.__setattr__(self, "edges", _edges(sizes))

    def __len__(self) -> int:
        return len(self.order)

    def pick(self, first: int, last: int) -> Stream:
        return self.base.take(self.order[first:last])


@dataclass(frozen=True)
class Padded:
    """`head`, then the pieces of `tail` (a short, materialised stream)."""

    head: Pieces
    tail: Stream
    edges: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        head = self.head.edges
        object.__setattr__(self, "edges", np.concatenate([head, head[-1] + self.tail.edges[1:]]))

    def __len__(self) -> int:
        return len(self.head) + len(self.tail)

    def pick(self, first: int, last: int) -> Stream:
        split = len(self.head)
        parts = []
        if first < split:
            parts.append(self.head.pick(first, min(last, split)))
        if last > split:
            parts.append(self.tail.pick(max(first, split) - split, last - split))
        return parts[0] if len(parts) == 1 else Stream.join(parts)


def padded(stream: Pieces, want: int, source: Pieces) -> Pieces:
    """`partition._padded`: `stream`, then `source`'s pieces again from the start (marked pad) until the
    stream holds `want` samples, the last one cut to fit. Only the repeated pieces are gathered."""
    need = want - int(stream.edges[-1])
    if need <= 0 or not len(source):
        return stream
    cycle = int(source.edges[-1])
    rounds, rest = divmod(need, cycle)
    parts = [source.pick(0, len(source))] * rounds if rounds else []  # whole cycles: a group under half full
    if rest:
        keep = int(np.searchsorted(source.edges[1:], rest, side="left")) + 1
        last = source.pick(0, keep)
        over = int(source.edges[keep]) - rest  # the last piece's samples past `want`
        stop = last.stop.copy()
        stop[-1] -= over
        parts.append(Stream(last.unit, last.start, stop, last.pad))
    extra = Stream.join(parts)
    return Padded(stream, Stream(extra.unit, extra.start, extra.stop, np.ones(len(extra), dtype=bool)))


def lengths_bounds(lengths: Sequence[int]) -> np.ndarray:
    """The slices' edges in samples: slice k is [bounds[k], bounds[k + 1])."""
    return _edges(np.asarray(lengths, dtype=_INT))


def cut_slice(stream: Pieces, bounds: np.ndarray, k: int) -> Stream:
    """`partition.cut(stream, lengths)[k]` for the lengths whose edges are `bounds`.

    Pieces inside the slice are whole; a piece across an edge is split as `cut` splits it, which depends on
    every edge inside that piece, so those are replayed for it (`_part_of`).
    """
    lo, hi = int(bounds[k]), int(bounds[k + 1])
    if lo >= hi or not len(stream):
        return Stream.empty()
    edges = stream.edges
    first = int(np.searchsorted(edges[1:], lo, side="right"))  # the first piece ending after lo
    last = int(np.searchsorted(edges[:-1], hi, side="left"))  # one past the last piece beginning before hi
    if first >= last:
        return Stream.empty()
    part = stream.pick(first, last)
    start, stop = part.start, part.stop
    for at in {0, last - first - 1}:
        begin, end = int(edges[first + at]), int(edges[first + at + 1])
        if begin < lo or end > hi:
            if start is part.start:  # `pick` may give views of the stream's own arrays
                start, stop = start.copy(), stop.copy()
            a, b = _part_of(begin, end, bounds, k)
            start[at], stop[at] = int(part.start[at]) + a, int(part.start[at]) + b
    return Stream(part.unit, start, stop, part.pad).nonempty()


def _part_of(begin: int, end: int, bounds: np.ndarray, k: int) -> tuple[int, int]:
    """The samples [a, b) (relative to the piece) that slice k takes of the piece at [begin, end) of the
    stream, replaying `cut` over every slice that takes from the piece, in order."""
    lo, hi = 0, end - begin
    first = int(np.searchsorted(bounds, begin, side="right")) - 1  # the slice the piece starts in
    last = min(int(np.searchsorted(bounds, end, side="left")), len(bounds) - 1)  # one past its last slice
    for slice_index in range(first, last):
        need = int(bounds[slice_index + 1]) - max(begin, int(bounds[slice_index]))
        size = hi - lo
        if need <= 0:
            taken = (lo, lo)
        elif size <= need:
            taken, lo = (lo, hi), hi
        elif need <= size // 2:
            taken, lo = (lo, lo + need), lo + need
        else:
            taken, hi = (hi - need, hi), hi - need
        if slice_index == k:
            return taken
    return (0, 0)
