"""The "parquet" source: one sample per row, scheduled by chunks of row groups across slots.

A unit is a chunk of `min_row_groups_per_chunk` consecutive row groups of one file (default 1; a file's last
chunk holds what is left), as mvp-dataset 0.2.3 schedules them. When that gives fewer chunks than slots, every
row group is its own chunk again, so no slot is left without work. `use_threads` is passed to pyarrow's
reader; `shuffle_mode` ("chunk_aware", the default, or "none") is `sources.deal.schedule`'s.

Damaged data raises `CorruptShardError` naming the file and its footer or row groups. Under
`on_error="skip"`, a file whose footer cannot be read is skipped whole; a chunk whose pages cannot be decoded
(a damaged page header, compressed bytes or levels; strings that are not UTF-8) is skipped from the failing
batch on, and the file's other chunks are still read: row groups are independent (each one's pages are
found from the footer), so one damaged page says nothing about the rest of the file. Each skip is logged and
counted once.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardcache.errors import ConfigError, CorruptShardError, positive_int
from shardcache.shards import ShardRef
from shardcache.sources.base import SKIPPABLE, Sample, SourceNode
from shardcache.sources.corrupt import report_corrupt
from shardcache.sources.deal.partition import Unit
from shardcache.sources.deal.schedule import slot_order
from shardcache.sources.kinds import SourceKind
from shardcache.sources.options import SourceOptions
from shardcache.sources.spec import DEFAULT_BATCH_ROWS, check_columns_and_batch_size

logger = logging.getLogger(__name__)


def check_options(options: Mapping[str, object]) -> None:
    """Validate the parquet keyword arguments."""
    check_columns_and_batch_size(options)
    per_chunk = options.get("min_row_groups_per_chunk", 1)
    positive_int("min_row_groups_per_chunk", per_chunk, " (consecutive row groups scheduled as one unit)")
    use_threads = options.get("use_threads", True)
    if not isinstance(use_threads, bool):
        raise ConfigError(f"use_threads={use_threads!r}: expected True or False (pyarrow's threaded reads)")


def _pq() -> Any:  # pyarrow.parquet: pyarrow ships no type hints
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ConfigError("the parquet source needs pyarrow: pip install 'shardcache[parquet]'") from exc
    return pq


@contextlib.contextmanager
def arrow_errors(url: str, member: str) -> Iterator[None]:
    """pyarrow's errors reading `member` of the parquet file at `url` as CorruptShardError (naming both).

    Strings that are not UTF-8 (`to_pylist` raises UnicodeDecodeError) are corrupt data too.
    """
    import pyarrow as pa  # imported by `_pq()` already

    try:
        yield
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        if isinstance(exc, OSError) and not _from_pyarrow(exc):
            raise
        detail = " ".join(str(exc).split())  # pyarrow's messages span lines; a log line should not
        raise CorruptShardError(url, f"{type(exc).__name__}: {detail}", member) from exc


def _from_pyarrow(exc: OSError) -> bool:
    # A damaged page (its header, compressed data, levels) is a plain OSError without errno from pyarrow
    # ("Couldn't deserialize thrift", "Corrupt snappy compressed data"). What the file object raised comes
    # back as itself: an OS error with its errno, or OutOfFileDescriptors (a subclass), which stay theirs.
    return type(exc) is OSError and exc.errno is None


@dataclass(frozen=True)
class Chunk(Unit):
    """Row groups `part` .. `part + row_groups - 1` of one file; `offset` is the first row's index in it."""

    row_groups: int = 1


def chunk_row_groups(rows: Sequence[int], per_chunk: int) -> list[tuple[int, int, int]]:
    """(first row group, row groups, rows) of each chunk of one file's row groups (`rows`: rows per group)."""
    return [
        (first, len(rows[first : first + per_chunk]), sum(rows[first : first + per_chunk]))
        for first in range(0, len(rows), per_chunk)
    ]


@dataclass(frozen=True)
class ParquetOptions(SourceOptions):
    """The parquet source's options (`check_options` checks the keywords)."""

    columns: Sequence[str] | None = None
    batch_size: int = DEFAULT_BATCH_ROWS
    use_threads: bool = True
    shuffle_mode: str = "chunk_aware"
    min_row_groups_per_chunk: int = 1


class ParquetSource(SourceNode):
    counted_by_metadata = True  # row groups carry their row counts
    options_class = ParquetOptions
    options: ParquetOptions

    def plan_urls(self, urls: Sequence[str], epoch: int) -> list[str]:
        # Listing the row groups of shards read later would open (fetch) them now; a shard-level order is
        # a close enough hint for the daemon, and the real plan replaces it when those shards are read.
        order = slot_order(len(urls), self.ctx, epoch, shuffle=self.spec.shuffles_units)
        return [urls[i] for i in order]

    def units(self) -> list[Unit]:
        pq = _pq()
        files: list[tuple[ShardRef, list[int]]] = []  # each file's row group sizes
        for n, ref in enumerate(self.spec.shards):
            try:
                with self.opener.open(ref) as f, arrow_errors(ref.url, "its footer"):
                    meta = pq.ParquetFile(f).metadata
            except SKIPPABLE as exc:
                # A file whose footer cannot be read has no units; under on_error="skip" it is skipped,
                # logged and counted once, by the slot that `n` falls to (every slot lists the units).
                error = report_corrupt(self.opener.client, exc)
                if not self.skips(exc):
                    if error is exc:
                        raise
                    raise error from exc
                if n % self.ctx.total_slots == self.ctx.slot:
                    self._skipped(Unit(ref), error)
                continue
            files.append((ref, [meta.row_group(rg).num_rows for rg in range(meta.num_row_groups)]))
        per_chunk = self.options.min_row_groups_per_chunk
        chunks = [(ref, chunk_row_groups(rows, per_chunk)) for ref, rows in files]
        if per_chunk > 1 and sum(len(c) for _, c in chunks) < self.ctx.total_slots:
            # As mvp-dataset does: too few chunks for the slots, so schedule row group by row group.
            chunks = [(ref, chunk_row_groups(rows, 1)) for ref, rows in files]
        units: list[Unit] = []
        for ref, file_chunks in chunks:
            offset = 0
            for first, groups, rows in file_chunks:
                units.append(Chunk(ref, first, offset, rows, groups))
                offset += rows
        if len(units) < self.ctx.total_slots and not self.spec.resample:
            logger.warning(
                "parquet: %d row groups for %d slots; some slots read nothing (write smaller row groups)",
                len(units),
                self.ctx.total_slots,
            )
        return units

    def part_of(self, unit: Unit) -> str:
        if not isinstance(unit, Chunk):
            return ""  # a whole file: its footer could not be read (`units`)
        last = unit.part + unit.row_groups - 1
        return f"row groups {unit.part}-{last}" if last > unit.part else f"row group {unit.part}"

    def read(self, unit: Unit, plan: str | None, start: int) -> Iterator[Sample]:
        pq = _pq()
        columns = self.options.columns
        url = unit.ref.url
        stem = os.path.basename(url)
        index = unit.offset
        groups = unit.row_groups if isinstance(unit, Chunk) else 1
        with self.opener.open(unit.ref, plan) as f, arrow_errors(url, self.part_of(unit)):
            reader = pq.ParquetFile(f)
            batches = reader.iter_batches(
                batch_size=self.options.batch_size,
                row_groups=list(range(unit.part, unit.part + groups)),
                columns=list(columns) if columns is not None else None,
                use_threads=self.options.use_threads,
            )
            for batch in batches:
                rows = batch.to_pylist()
                n = len(rows)
                for j in range(start, n):
                    row = rows[j]
                    row["__file__"] = url
                    row["__index_in_file__"] = index + j
                    row.setdefault("__key__", f"{stem}:{index + j}")
                    yield row
                start = max(0, start - n)
                index += n


def _order_neutral(name: str, value: object) -> bool:
    # pyarrow decodes the same rows with or without threads; one row group per chunk is the default.
    return name == "use_threads" or (name == "min_row_groups_per_chunk" and value == 1)


KIND = SourceKind(
    "parquet",
    options=(
        "resample",
        "columns",
        "batch_size",
        "use_threads",
        "on_error",
        "shuffle_mode",
        "min_row_groups_per_chunk",
    ),
    check_options=check_options,
    data_suffix=".parquet",
    unit_shuffle_modes=("chunk_aware", "none"),
    shuffle_mode_code="UnsupportedParquetShuffleMode",
    subset_level="unit",
    order_neutral=_order_neutral,
)
