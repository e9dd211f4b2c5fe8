"""The "parquet" source: one sample per row, scheduled by row group across slots."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

from shardcache.errors import ConfigError
from shardcache.sources.base import SourceNode, Unit, check_columns_and_batch_size
from shardcache.sources.schedule import slot_order

logger = logging.getLogger(__name__)


def check_options(options: dict[str, Any]) -> None:
    """Validate the parquet keyword arguments."""
    check_columns_and_batch_size(options)


def _pq() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ConfigError("the parquet source needs pyarrow: pip install 'shardcache[parquet]'") from exc
    return pq


class ParquetSource(SourceNode):
    counted_by_metadata = True  # row groups carry their row counts

    def plan_urls(self, urls: Sequence[str], epoch: int) -> list[str]:
        # Listing the row groups of shards read later would open (fetch) them now; a shard-level order is
        # a close enough hint for the daemon, and the real plan replaces it when those shards are read.
        return [urls[i] for i in slot_order(len(urls), self.ctx, epoch)]

    def units(self) -> list[Unit]:
        pq = _pq()
        units: list[Unit] = []
        for ref in self.spec.shards:
            with self.opener.open(ref) as f:
                meta = pq.ParquetFile(f).metadata
            offset = 0
            for rg in range(meta.num_row_groups):
                rows = meta.row_group(rg).num_rows
                units.append(Unit(ref, rg, offset, rows))
                offset += rows
        if len(units) < self.ctx.total_slots and not self.spec.resample:
            logger.warning(
                "parquet: %d row groups for %d slots; some slots read nothing (write smaller row groups)",
                len(units),
                self.ctx.total_slots,
            )
        return units

    def read(self, unit: Unit, plan: str | None, start: int) -> Iterator[dict[str, Any]]:
        pq = _pq()
        options = self.spec.options
        columns = options.get("columns")
        url = unit.ref.url
        stem = os.path.basename(url)
        index = unit.offset
        with self.opener.open(unit.ref, plan) as f:
            reader = pq.ParquetFile(f)
            batches = reader.iter_batches(
                batch_size=options.get("batch_size", 65536),
                row_groups=[unit.part],
                columns=list(columns) if columns is not None else None,
                use_threads=options.get("use_threads", True),
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
