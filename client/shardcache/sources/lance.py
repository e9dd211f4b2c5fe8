"""The "lance" source: Lance datasets (local paths or URIs read by Lance's own object-store support).

shuffle_mode:
- "none": each slot reads a contiguous range of rows in order (the mode `.cache()` reads back with).
- "global": an exact permutation of all rows from (seed, epoch); slot s reads positions s, s+T, ... (take).
- "random_scan": fragments are dealt to slots and scanned out of order (approximate shuffle, higher
  throughput); falls back to "global" when there are fewer fragments than slots. Its order inside a fragment
  is not deterministic, so a resume state restores the fragment and the count read, not the exact rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from shardcache.errors import ConfigError
from shardcache.sources.base import SourceNode, Unit, check_columns_and_batch_size
from shardcache.sources.schedule import permutation, slot_order

logger = logging.getLogger(__name__)

SHUFFLE_MODES = ("none", "global", "random_scan")


def check_options(options: dict[str, Any]) -> None:
    """Validate the lance keyword arguments."""
    mode = options.get("shuffle_mode", "none")
    if mode not in SHUFFLE_MODES:
        raise ConfigError(f"shuffle_mode={mode!r}: expected one of {SHUFFLE_MODES}")
    check_columns_and_batch_size(options)


def _lance() -> Any:
    try:
        import lance
    except ImportError as exc:
        raise ConfigError("the lance source needs pylance: pip install 'shardcache[lance]'") from exc
    return lance


@dataclass(frozen=True)
class LanceChunk(Unit):
    """Rows of one dataset: a contiguous range (offset, count), explicit `rows`, or one `fragment`."""

    dataset: int = 0
    rows: tuple[int, ...] | None = None
    fragment: int | None = None


class LanceSource(SourceNode):
    uses_daemon = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._datasets: list[Any] = []
        self._chunks: list[Unit] = []

    def units(self) -> list[Unit]:
        lance = _lance()
        self._datasets = [lance.dataset(ref.url) for ref in self.spec.shards]
        self._sizes = [int(ds.count_rows()) for ds in self._datasets]
        self._fragments = [
            (d, f.fragment_id) for d, ds in enumerate(self._datasets) for f in ds.get_fragments()
        ]
        self.mode = self.spec.options.get("shuffle_mode", "none")
        if self.mode == "random_scan" and len(self._fragments) < self.ctx.total_slots:
            logger.info(
                "lance: %d fragments for %d slots; shuffle_mode='random_scan' falls back to 'global'",
                len(self._fragments),
                self.ctx.total_slots,
            )
            self.mode = "global"
        return self._chunks

    def order(self, units: list[Unit], round_index: int) -> list[int]:
        units.clear()
        batch = int(self.spec.options.get("batch_size", 65536))
        refs = self.spec.shards
        total, slot = self.ctx.total_slots, self.ctx.slot
        if self.mode == "random_scan":
            for f in slot_order(len(self._fragments), self.ctx, self.epoch, round_index):
                d, frag = self._fragments[f]
                units.append(LanceChunk(refs[d], dataset=d, fragment=frag))
        elif self.mode == "global":
            n = sum(self._sizes)
            perm = permutation(n, self.ctx.seed, self.epoch, round_index)
            mine = perm[(slot + round_index) % total :: total]
            starts = [sum(self._sizes[:d]) for d in range(len(self._sizes))]
            for i in range(0, len(mine), batch):
                rows = mine[i : i + batch]
                # One chunk per batch; rows of several datasets are looked up per dataset below.
                units.append(LanceChunk(refs[0], rows=tuple(rows), count=len(rows), offset=-1))
            self._starts = starts
        else:
            n = sum(self._sizes)
            part = (slot + round_index) % total
            first, last = part * n // total, (part + 1) * n // total
            start = 0
            for d, size in enumerate(self._sizes):
                lo, hi = max(first, start), min(last, start + size)
                for off in range(lo, hi, batch):
                    units.append(
                        LanceChunk(refs[d], offset=off - start, count=min(batch, hi - off), dataset=d)
                    )
                start += size
        return list(range(len(units)))

    def read(self, unit: Unit, plan: str | None, start: int) -> Iterator[dict[str, Any]]:
        # decode_batch is to_pylist() on ordinary data and decodes `.cache()` datasets' tagged columns;
        # imported here because it needs pyarrow, which `import shardcache` must not.
        from shardcache.cache.codec import decode_batch

        assert isinstance(unit, LanceChunk)
        columns = self.spec.options.get("columns")
        cols = list(columns) if columns is not None else None
        batch = int(self.spec.options.get("batch_size", 65536))
        if unit.fragment is not None:
            ds = self._datasets[unit.dataset]
            fragment = ds.get_fragment(unit.fragment)
            scanner = ds.scanner(columns=cols, fragments=[fragment], scan_in_order=False, batch_size=batch)
            seen = 0
            for rb in scanner.to_batches():
                for row in decode_batch(rb):
                    seen += 1
                    if seen > start:
                        yield row
            return
        if unit.rows is not None:
            rows = unit.rows[start:]
            yield from self._take(rows, cols)
            return
        ds = self._datasets[unit.dataset]
        count = (unit.count or 0) - start
        if count <= 0:
            return
        table = ds.scanner(columns=cols, offset=unit.offset + start, limit=count, batch_size=batch).to_table()
        yield from decode_batch(table)

    def _take(self, rows: Sequence[int], cols: list[str] | None) -> Iterator[dict[str, Any]]:
        from shardcache.cache.codec import decode_batch

        starts = self._starts
        if len(self._datasets) == 1:
            yield from decode_batch(self._datasets[0].take(list(rows), columns=cols))
            return
        for row in rows:
            d = max(i for i, s in enumerate(starts) if s <= row)
            yield from decode_batch(self._datasets[d].take([row - starts[d]], columns=cols))
