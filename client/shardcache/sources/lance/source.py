"""The "lance" source: Lance datasets (local paths or URIs read by Lance's own object-store support).

shuffle_mode:
- "none": each slot reads a contiguous range of rows in order (the mode `.cache()` reads back with).
- "global": an exact permutation of all rows from (seed, epoch); slot s reads positions s, s+T, ... (take).
- "chunk": mvp-dataset's bounded-window shuffle (`chunk_shuffle=`, see `sources.lance.order`); slots are
  dealt positions of that order as under "global".
- "random_scan": fragments are dealt to slots and scanned out of order (approximate shuffle, higher
  throughput); falls back to "global" when there are fewer fragments than slots. Its order inside a fragment
  is not deterministic, so a resume state restores the fragment and the count read, not the exact rows.

Remote datasets are read by Lance's own object store, not through the node daemon (so `daemon="required"`
is refused). `storage_options=` is passed to Lance; for `s3://` URIs the endpoint, region and keys of the
AWS environment the rest of the client uses are filled in (`aws_storage_options`), given options winning.

Row subsets (`Dataset.filter`, `split`, `sample`; `sources.deal.subset`) are row-exact: the source first
fixes
its row space (the rows matching `filter`, then those the subset keeps, in source order) and every mode reads
only those rows; "random_scan" reads whole fragments, so over a row subset it falls back to "global".

Each dataset is read at the version `from_source` discovered (`PlanHints.versions`; unpinned when it did
not open then): rows written after the pipeline was built are not read. A filter's matching rows come from
a persistent index under the unified cache root, built once per dataset version and predicate groups and
read back by every later reader (`sources.lance.index`).

Every sample carries `__file__`, `__local_index__`, `__global_index__` and `__key__` (`sources.lance.rows`).
`read_batch_size` is the rows per Lance read call (default: `batch_size`, the rows per unit); it changes
neither the rows nor their order.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from shardcache.errors import ConfigError
from shardcache.sources.base import SourceNode
from shardcache.sources.deal.partition import Unit
from shardcache.sources.deal.schedule import slot_order
from shardcache.sources.deal.subset import SplitOrder, select_rows
from shardcache.sources.kinds import SourceKind
from shardcache.sources.lance.access import lance_module, storage_options_for
from shardcache.sources.lance.index import Positions, filter_positions
from shardcache.sources.lance.order import (
    SHUFFLE_MODES,
    check_chunk_shuffle,
    check_read_batch_size,
    fingerprint_neutral,
    row_sequence,
    shown,
)
from shardcache.sources.lance.refs import parse_ref_columns
from shardcache.sources.lance.rows import LanceRows, Row
from shardcache.sources.options import SourceOptions
from shardcache.sources.spec import DEFAULT_BATCH_ROWS, SourceSpec, check_columns_and_batch_size

if TYPE_CHECKING:
    from lance import LanceDataset

    from shardcache.context import RuntimeContext
    from shardcache.sources.deal.counting import RunFacts

logger = logging.getLogger(__name__)


def check_options(options: Mapping[str, object]) -> None:
    """Validate the lance keyword arguments."""
    mode = options.get("shuffle_mode", "none")
    if mode not in SHUFFLE_MODES:
        raise ConfigError(
            f"shuffle_mode={mode!r}: expected one of {SHUFFLE_MODES}", code="InvalidLanceShuffleMode"
        )
    check_columns_and_batch_size(options)
    check_read_batch_size(options)
    check_chunk_shuffle(options)
    if "filter" in options:
        check_filter(options["filter"])
    check_storage_options(options.get("storage_options"))
    parse_ref_columns(options.get("ref_columns"))  # resolved by Dataset.resolve_ref (sources.lance.refs)


def check_storage_options(value: object) -> None:
    """`storage_options`: Lance's object-store settings, a dict of strings (None: from the environment)."""
    if value is None:
        return
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError(
            f"storage_options={value!r}: expected a dict of strings, e.g. "
            "{'aws_endpoint': 'http://127.0.0.1:9000', 'allow_http': 'true'}"
        )


def check_daemon(daemon: object) -> None:
    """Refuse `daemon="required"`: Lance reads its own data files, not through the node daemon."""
    if daemon == "required" or getattr(daemon, "required", False) is True:
        raise ConfigError(
            'daemon="required" cannot be honoured by the lance source: Lance reads its data files itself '
            "(configure remote access with storage_options=), not through the node daemon. Pass "
            'daemon="auto" or daemon=None for Lance datasets.'
        )


# AWS environment variables (as the daemon, s3fs and boto read them) -> Lance's storage option names.


def check_filter(value: object) -> None:
    """`hints.filter`: groups (ANDed, one per `filter()` call) of Lance SQL predicates (ORed)."""
    ok = (
        isinstance(value, tuple)
        and bool(value)
        and all(
            isinstance(alt, tuple) and alt and all(isinstance(p, str) and p.strip() for p in alt)
            for alt in value
        )
    )
    if not ok:
        raise ConfigError(
            f"filter={value!r}: expected a tuple of tuples of Lance SQL predicates; use Dataset.filter(...)"
        )


@dataclass(frozen=True)
class LanceChunk(Unit):
    """Rows of one dataset: a contiguous range (offset, count), explicit `rows`, or one `fragment`."""

    dataset: int = 0
    rows: tuple[int, ...] | None = None
    fragment: int | None = None
    real: int | None = None  # under even="pad": rows before the first repeated one (None: all real)


@dataclass(frozen=True)
class LanceOptions(SourceOptions):
    """The lance source's options (`check_options` checks the keywords)."""

    columns: Sequence[str] | None = None
    batch_size: int = DEFAULT_BATCH_ROWS
    read_batch_size: int | None = None  # None: batch_size
    shuffle_mode: str = "none"
    chunk_shuffle: Mapping[str, object] | None = None
    storage_options: Mapping[str, str] | None = None
    ref_columns: object = None  # parsed by sources.lance.refs for Dataset.resolve_ref


class LanceSource(SourceNode):
    uses_daemon = False
    partitionable = False  # rows are planned here (shuffle_mode), not by shardcache.sources.deal.partition
    options_class = LanceOptions
    options: LanceOptions

    def __init__(self, spec: SourceSpec, ctx: RuntimeContext, facts: RunFacts | None = None) -> None:
        super().__init__(spec, ctx, facts)
        self._datasets: list[LanceDataset] = []
        self._chunks: list[Unit] = []

    def units(self) -> list[Unit]:
        lance = lance_module()
        given = self.options.storage_options
        # The versions from_source discovered: rows written after the pipeline was built are not read.
        pinned = dict(self.spec.hints.versions or ())
        self._datasets = [
            lance.dataset(
                ref.url, version=pinned.get(ref.url), storage_options=storage_options_for(ref.url, given)
            )
            for ref in self.spec.shards
        ]
        self._rows = LanceRows(
            self._datasets, [ref.url for ref in self.spec.shards], self.spec.hints.row_metadata
        )
        self._sizes = self._rows.sizes
        # Only random_scan reads by fragment: listing fragments costs a manifest walk per dataset.
        random_scan = self.options.shuffle_mode == "random_scan"
        self._fragments = [
            (d, f.fragment_id)
            for d, ds in enumerate(self._datasets)
            if random_scan
            for f in ds.get_fragments()
        ]
        self.mode = self.options.shuffle_mode
        self._starts = self._rows.starts
        self._space = self._row_space()
        if self._space is not None and self.mode == "random_scan":
            logger.info("lance: shuffle_mode='random_scan' over a filter or subset reads as 'global'")
            self.mode = "global"
        if self.mode == "random_scan" and len(self._fragments) < self.ctx.total_slots:
            logger.info(
                "lance: %d fragments for %d slots; shuffle_mode='random_scan' falls back to 'global'",
                len(self._fragments),
                self.ctx.total_slots,
            )
            self.mode = "global"
        return self._chunks

    def order(self, units: Sequence[Unit], round_index: int) -> list[int]:
        assert isinstance(units, list), "lance refills its own copy of the unit list (see select_units)"
        units.clear()
        batch = self.options.batch_size
        refs = self.spec.shards
        total, slot = self.ctx.total_slots, self.ctx.slot
        even = self.partitioning.even  # rows are cut here, not by shardcache.sources.deal.partition
        if even is not None:
            self._even_rows(units, even, batch)
        elif self.mode == "random_scan":
            for f in slot_order(len(self._fragments), self.ctx, self.epoch, round_index):
                d, frag = self._fragments[f]
                units.append(LanceChunk(refs[d], dataset=d, fragment=frag))
        elif self.mode in ("global", "chunk"):
            space = self._space
            n = sum(self._sizes) if space is None else len(space)
            chunking = self.options.chunk_shuffle
            order = row_sequence(self.mode, n, chunking, self.ctx.seed, self.epoch, round_index)
            mine = order[(slot + round_index) % total :: total]
            for i in range(0, len(mine), batch):
                rows = mine[i : i + batch]
                rows = [int(r) for r in (rows if space is None else space[rows])]
                # One chunk per batch; rows of several datasets are looked up per dataset below.
                units.append(LanceChunk(refs[0], rows=tuple(rows), count=len(rows), offset=-1))
        elif self._space is not None:
            space = self._space
            part = (slot + round_index) % total
            mine = space[part * len(space) // total : (part + 1) * len(space) // total]
            for i in range(0, len(mine), batch):
                picked = tuple(int(r) for r in mine[i : i + batch])
                units.append(LanceChunk(refs[0], rows=picked, count=len(picked), offset=-1))
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

    def _even_rows(self, units: list[Unit], even: str, batch: int) -> None:
        """This slot's rows when every rank must get the same number (see partition's module docstring):
        P rows per rank (n // ranks under "drop", ceil(n / ranks) under "pad", repeated rows marked), cut
        into the same per-worker split on every rank, from the row order of the shuffle mode."""
        space = self._space
        n = sum(self._sizes) if space is None else len(space)
        # "random_scan" reads as "global" here: its fragment-sized units cannot be cut evenly.
        mode = "global" if self.mode == "random_scan" else self.mode
        sequence = row_sequence(mode, n, self.options.chunk_shuffle, self.ctx.seed, self.epoch)
        ranks, workers = self.ctx.dp_size, self.ctx.num_workers
        per_rank = n // ranks if even == "drop" else -(-n // ranks)
        rank, worker = self.ctx.dp_rank, self.ctx.worker_id
        first = rank * per_rank + worker * per_rank // workers
        last = rank * per_rank + (worker + 1) * per_rank // workers
        for i in range(first, last, batch):
            picked = [sequence[j % n] for j in range(i, min(last, i + batch))] if n else []
            rows = tuple(int(space[r]) for r in picked) if space is not None else tuple(picked)
            # Positions past n wrap around to the start: those rows are repeats, marked in read().
            real = None if i + len(rows) <= n else max(0, n - i)
            units.append(LanceChunk(self.spec.shards[0], rows=rows, count=len(rows), offset=-1, real=real))

    def read(self, unit: Unit, plan: str | None, start: int) -> Iterator[Row]:
        if self.partitioning.even == "pad":
            assert isinstance(unit, LanceChunk)
            real = unit.count or 0 if unit.real is None else unit.real
            for i, row in enumerate(self._read(unit, start), start):
                row["__pad__"] = i >= real
                yield row
            return
        yield from self._read(unit, start)

    def _read(self, unit: Unit, start: int) -> Iterator[Row]:
        assert isinstance(unit, LanceChunk)
        columns = self.options.columns
        cols = list(columns) if columns is not None else None
        read_batch = self.options.read_batch_size or self.options.batch_size
        if unit.fragment is not None:
            # Lance's order inside a fragment is not deterministic: a resume skips the count already read.
            rows = self._rows.scan_fragment(unit.dataset, unit.fragment, cols, read_batch)
            yield from itertools.islice(rows, start, None)
            return
        if unit.rows is not None:
            yield from self._rows.take(unit.rows[start:], cols, read_batch)
            return
        count = (unit.count or 0) - start
        yield from self._rows.scan(unit.dataset, unit.offset + start, count, cols, read_batch)

    def _row_space(self) -> Positions | None:
        """The global row positions this source reads (filter, then subset), or None for every row."""
        groups = self.spec.hints.filter
        subset = self.spec.hints.subset
        if groups is None and subset is None:
            return None
        if groups is None:
            space = np.arange(sum(self._sizes), dtype=np.int64)
        else:
            # Read from (or built once into) the persistent filter index of each dataset's pinned version.
            uris = [ref.url for ref in self.spec.shards]
            found = [
                filter_positions(ds, uris[d], groups, self._sizes[d]) + self._starts[d]
                for d, ds in enumerate(self._datasets)
            ]
            space = np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
        return space[select_rows(len(space), subset, self._split_order())] if subset else space

    def _split_order(self) -> SplitOrder | None:
        """The order a split cuts its windows from: None (source order) unless the source shuffles.

        As in mvp-dataset, a split of a shuffled source follows the source's seed ("source-level shuffle
        can randomize the physical membership"). The order is the seed's first one (epoch 0, round 0), in
        every epoch and round: the parts stay disjoint across epochs and resample rounds.
        """
        mode = self.options.shuffle_mode
        if mode == "none":
            return None
        # random_scan reads a subset as "global" (see __init__), so its split follows the global order.
        order_mode = "chunk" if mode == "chunk" else "global"
        chunking = self.options.chunk_shuffle
        seed = self.ctx.seed
        return lambda n: np.asarray(row_sequence(order_mode, n, chunking, seed, 0, 0), dtype=np.int64)


def _order_neutral(name: str, value: object) -> bool:
    # ref_columns say how resolve_ref() resolves, not what the source reads: the resolve_ref stage's own
    # description carries the references it resolves.
    return name == "ref_columns" or fingerprint_neutral(name, value)


KIND = SourceKind(
    "lance",
    options=(
        "resample",
        "columns",
        "batch_size",
        "read_batch_size",
        "shuffle_mode",
        "chunk_shuffle",
        "filter",
        "storage_options",
        "ref_columns",
    ),
    check_options=check_options,
    data_suffix=None,
    subset_level="row",
    order_neutral=_order_neutral,
    shown=shown,
    own_object_store=True,
    filters_rows=True,
    resolves_refs=True,
)
