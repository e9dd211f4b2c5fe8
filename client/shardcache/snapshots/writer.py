"""Write a stream of sample dicts into one Lance dataset, widening the column layout when it must."""

from __future__ import annotations

import itertools
import logging
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType

import pyarrow as pa

from shardcache.errors import ConfigError
from shardcache.sources.lance.codec import LayoutChange, RowEncoder, decode_batches
from shardcache.sources.lance.rows import Row

logger = logging.getLogger(__name__)

# Lance needs at least one column; an empty cache still says which key column it would have had.
_EMPTY_SCHEMA_ROWS: list[Row] = [{"__key__": ""}]


@dataclass(frozen=True)
class WriteResult:
    """What `write_rows` wrote: the row count and the final Arrow schema."""

    rows: int
    schema: pa.Schema


def _lance() -> ModuleType:
    try:
        import lance
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ConfigError("Dataset.cache() needs Lance: pip install 'shardcache[lance]'") from exc
    return lance


def _batched(rows: Iterable[Row], size: int) -> Iterator[list[Row]]:
    iterator = iter(rows)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def read_rows(uri: str) -> Iterator[Row]:
    """Every row of a Lance dataset in write order, decoded (all fragments, whatever their sizes)."""
    dataset = _lance().dataset(uri)
    yield from decode_batches(dataset.to_batches(scan_in_order=True))


def _stream(
    encoder: RowEncoder,
    first: list[Row],
    batches: Iterator[list[Row]],
    earlier: str | None,
    batch_size: int,
    written: list[int],
    overflow: list[list[Row]],
) -> Iterator[pa.RecordBatch]:
    """Batches of the rows of `earlier` (re-encoded), then of `first` and `batches` until one does not fit.

    The batch that does not fit goes to `overflow` and the stream ends, so Lance commits what came before.
    """
    if earlier is not None:
        for old in _batched(read_rows(earlier), batch_size):
            written[0] += len(old)
            yield encoder.encode(old)
    for chunk in itertools.chain([first], batches):
        try:
            batch = encoder.encode(chunk)
        except LayoutChange:
            overflow.append(chunk)
            return
        written[0] += len(chunk)
        yield batch


def write_rows(
    rows: Iterable[Row],
    uri: str,
    *,
    batch_size: int,
    max_rows_per_file: int,
    encoder: RowEncoder | None = None,
) -> WriteResult:
    """Write `rows` in order into a new Lance dataset at `uri` (which must not exist).

    The layout comes from the first batch. When a later batch does not fit it (a new field, a value of
    another type), the dataset written so far is re-encoded into a fresh one with the wider layout and the
    stream goes on there: rare, and cheaper than recomputing the expensive stages that feed the stream.

    Args:
        rows: The samples, consumed once.
        uri: Where to create the dataset.
        batch_size: Rows per record batch handed to Lance.
        max_rows_per_file: Rows per Lance fragment.
        encoder: Start from this layout (the merge passes the union of its parts' layouts).
    """
    lance = _lance()
    encoder = encoder if encoder is not None else RowEncoder()
    batches = _batched(rows, batch_size)
    pending: list[Row] | None = next(batches, None)
    if pending is None:
        if not len(encoder.schema):
            encoder.fit(_EMPTY_SCHEMA_ROWS)
        lance.write_dataset(encoder.schema.empty_table(), uri, mode="create")
        return WriteResult(0, encoder.schema)
    encoder.fit(pending)
    previous: str | None = None
    generation = 0
    while True:
        written = [0]
        overflow: list[list[Row]] = []

        target = uri if generation == 0 else f"{uri}.widen{generation}"
        stream = _stream(encoder, pending, batches, previous, batch_size, written, overflow)
        reader = pa.RecordBatchReader.from_batches(encoder.schema, stream)
        lance.write_dataset(reader, target, mode="create", max_rows_per_file=max_rows_per_file)
        if previous is not None:
            shutil.rmtree(previous)
        if not overflow:
            if target != uri:
                os.rename(target, uri)
            return WriteResult(written[0], encoder.schema)
        pending = overflow[0]
        encoder.fit(pending)
        logger.debug("cache layout widened after %d rows of %s", written[0], uri)
        if target == uri:
            # Move the first generation aside so the final dataset still lands at `uri`.
            os.rename(uri, f"{uri}.widen0")
            target = f"{uri}.widen0"
        previous = target
        generation += 1
