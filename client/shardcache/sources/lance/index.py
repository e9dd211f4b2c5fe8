"""The persistent Lance indexes: a filter's matching rows, and a reference table's key -> row map.

Both are entries of `sources.lance.store` (mvp-dataset 0.2.3's cache layout under the unified cache root),
keyed by the datasets' pinned versions, so a new version (an append, an overwrite) or another predicate
makes a new entry and an entry is never stale:

- `lance-filter-index-v1`: the positions (`take` rows) of one dataset's version that match the filter's
  predicate groups (ANDed groups of ORed predicates). The dataset's fragments are cut into up to 64 parts of
  about equal rows, one file of sorted little-endian int64 positions each (`part-000.i64`, ...): a damaged
  part is rebuilt alone, by scanning only its fragments. On a dataset with deleted rows (which mvp-dataset
  refuses to filter) the positions need the whole dataset's row addresses, so it is one part.
- `lance-ref-index-v1`: for the reference datasets of one `ref_columns` entry and its key column, the first
  row (dataset, row) holding each key, as an Arrow IPC file whose keys are grouped in hash buckets (the
  bucket offsets are in the manifest). Reading it replaces a scan of the key column, and a reader makes a
  bucket's dict only when a sample asks for a key of it (`RefRows`).

The index is read whole into memory when the source plans its rows (a filter's matches, 8 bytes a row).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

import numpy as np
import numpy.typing as npt

from shardcache.errors import CacheError, InvalidPredicate
from shardcache.sources.lance.rows import ROW_ADDRESS, positions
from shardcache.sources.lance.store import IndexEntry, Manifest, Reusable, dataset_identity

if TYPE_CHECKING:
    import pyarrow as pa
    from lance import LanceDataset
    from lance.fragment import LanceFragment

logger = logging.getLogger(__name__)

FILTER_KIND = "lance-filter-index"
REF_KIND = "lance-ref-index"
FORMAT_VERSION = 1
MAX_PARTS = 64  # parts of one filter index: enough to rebuild a damaged one cheaply, few enough to list
_OFFSET_MASK = np.uint64(0xFFFFFFFF)
_KEYS_FILE = "keys.arrow"
_BUCKET_KEYS = 4096  # keys per bucket of a reference index, on average
_ROW_BITS = 40  # a reference row is stored as dataset << 40 | row

Positions = npt.NDArray[np.int64]  # sorted `take` positions of one dataset


class _PartMeta(TypedDict):
    count: int
    fragments: list[int]


class _Part(TypedDict):
    name: str
    files: list[str]
    metadata: _PartMeta


class FilterMetadata(TypedDict):
    """A filter entry's manifest metadata."""

    parts: list[_Part]
    deleted_rows: bool


class RefMetadata(TypedDict):
    """A reference entry's manifest metadata."""

    count: int
    key_column: str
    bucket_offsets: list[int]


# --- filter index ------------------------------------------------------------------------------------


def _plan_parts(ds: LanceDataset) -> tuple[list[list[LanceFragment]], dict[int, int], bool]:
    """The fragments of each part, the first position of every fragment, and whether rows were deleted."""
    fragments = list(ds.get_fragments())
    deleted = any(f.metadata.deletion_file is not None for f in fragments)
    if deleted or not fragments:
        return ([fragments] if fragments else []), {}, deleted
    bases: dict[int, int] = {}
    start = 0
    sizes = []
    for f in fragments:
        bases[int(f.fragment_id)] = start
        sizes.append(int(f.metadata.physical_rows))
        start += sizes[-1]
    count = min(MAX_PARTS, len(fragments))
    # Cut where the running row count passes k/count of the total: parts of about equal rows.
    cuts = np.searchsorted(np.cumsum(sizes), [start * k / count for k in range(1, count)], side="left")
    edges = [0, *sorted({min(int(c) + 1, len(fragments)) for c in cuts}), len(fragments)]
    parts = [fragments[a:b] for a, b in zip(edges, edges[1:], strict=False) if b > a]
    return parts, bases, False


def _matches(
    ds: LanceDataset, uri: str, predicate: str, fragments: list[LanceFragment] | None
) -> npt.NDArray[np.uint64]:
    """The row addresses of `fragments` (None: the whole dataset) matching `predicate`."""
    try:
        scanner = ds.scanner(
            filter=predicate,
            columns=[],
            with_row_address=True,
            use_scalar_index=True,  # an OR of indexed predicates stays indexed when each is scanned alone
            fragments=fragments,  # None: every fragment
        )
        return np.asarray(scanner.to_table()[ROW_ADDRESS].to_numpy(), dtype=np.uint64)
    except (ValueError, OSError) as exc:  # lance's error for a bad predicate (type varies)
        raise InvalidPredicate(
            f"filter({predicate!r}) on {uri}: Lance cannot evaluate it: {exc}", code="InvalidLanceFilter"
        ) from exc


def _part_rows(
    ds: LanceDataset,
    uri: str,
    groups: Sequence[Sequence[str]],
    fragments: list[LanceFragment] | None,
    bases: dict[int, int],
) -> Positions:
    """The sorted positions of `fragments` (None: every fragment) matching every group (one scan per
    predicate)."""
    kept = None
    for group in groups:
        found = []
        for predicate in group:
            addresses = _matches(ds, uri, predicate, fragments)
            if not bases:  # deleted rows: positions are counted over the whole dataset's live rows
                found.append(positions(ds, addresses) if len(addresses) else np.zeros(0, dtype=np.int64))
                continue
            ids = (addresses >> np.uint64(32)).astype(np.int64)
            base = np.fromiter((bases[int(i)] for i in ids), dtype=np.int64, count=len(ids))
            found.append(base + (addresses & _OFFSET_MASK).astype(np.int64))
        matched = np.unique(np.concatenate(found))
        kept = matched if kept is None else np.intersect1d(kept, matched, assume_unique=True)
    return np.zeros(0, dtype=np.int64) if kept is None else kept


def _build_filter(
    ds: LanceDataset, uri: str, groups: Sequence[Sequence[str]], tmp: Path, old: Reusable | None
) -> FilterMetadata:
    parts, bases, deleted = _plan_parts(ds)
    if not parts:
        # No fragment, no row; the predicates are still checked against the schema (as mvp-dataset does).
        for group in groups:
            for predicate in group:
                _matches(ds, uri, predicate, None)
        parts = [[]]
    files = [f"part-{k:03d}.i64" for k in range(len(parts))]
    kept = [old is not None and old.take(file, tmp) for file in files]  # parts of a broken entry that check
    whole = None
    if not any(kept) and parts[0]:
        # A fresh build scans each predicate once over the whole dataset (fewer, larger scans) and cuts the
        # result at the parts' first rows; a repair below scans only the fragments of the parts it lost.
        whole = _part_rows(ds, uri, groups, None, bases)
    listed: list[_Part] = []
    for k, fragments in enumerate(parts):
        file = files[k]
        if not kept[k]:
            if not fragments:
                rows = np.zeros(0, dtype=np.int64)
            elif whole is not None and bases:
                first = bases[int(fragments[0].fragment_id)]
                last = bases[int(fragments[-1].fragment_id)] + int(fragments[-1].metadata.physical_rows)
                rows = whole[np.searchsorted(whole, first) : np.searchsorted(whole, last)]
            elif whole is not None:
                rows = whole  # deleted rows: one part
            else:
                rows = _part_rows(ds, uri, groups, fragments, bases)
            rows.astype("<i8").tofile(tmp / file)
        count = (tmp / file).stat().st_size // 8
        fragment_ids = [int(f.fragment_id) for f in fragments]
        meta: _PartMeta = {"count": count, "fragments": fragment_ids}
        listed.append({"name": file.removesuffix(".i64"), "files": [file], "metadata": meta})
    return {"parts": listed, "deleted_rows": deleted}


def _read_filter(entry: IndexEntry, manifest: Manifest, num_rows: int) -> Positions | None:
    """The positions an entry holds, or None when any part fails its checks (then it is rebuilt)."""
    pieces = []
    try:
        for part in cast(FilterMetadata, manifest["metadata"])["parts"]:
            data = entry.read_checked(manifest, part["files"][0])
            if data is None or len(data) != 8 * part["metadata"]["count"]:
                return None
            pieces.append(np.frombuffer(data, dtype="<i8").astype(np.int64))
    except (KeyError, TypeError, IndexError):
        return None
    rows = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    # Sorted, unique and in range, or the entry was damaged in a way its sizes did not show.
    if len(rows) and (rows[0] < 0 or rows[-1] >= num_rows or np.any(np.diff(rows) <= 0)):
        return None
    return rows


def filter_positions(ds: LanceDataset, uri: str, groups: Sequence[Sequence[str]], num_rows: int) -> Positions:
    """The sorted positions of dataset `ds` (opened at its pinned version) matching the filter `groups`:
    read from the persistent filter index, built first if no valid one exists."""
    source = [dataset_identity(uri, int(ds.version), num_rows)]
    entry = IndexEntry.under_cache(
        source, FILTER_KIND, FORMAT_VERSION, {"predicate_groups": [list(g) for g in groups]}
    )

    def build(tmp: Path, old: Reusable | None) -> FilterMetadata:
        return _build_filter(ds, uri, groups, tmp, old)

    rows = _read_filter(entry, entry.ensure(build), num_rows)
    if rows is None:
        rows = _read_filter(entry, entry.ensure(build, broken=True), num_rows)
    if rows is None:
        raise CacheError(f"the filter index {entry.path} was rebuilt but does not read back; remove it")
    return rows


# --- reference index ---------------------------------------------------------------------------------


def _scan_keys(
    datasets: Sequence[LanceDataset], key_column: str
) -> tuple[list[object], list[int], list[int], pa.DataType]:
    """Each key's first (dataset, row), in the datasets' order, and the key column's Arrow type."""
    seen: dict[object, None] = {}
    keys: list[object] = []
    owners: list[int] = []
    rows: list[int] = []
    key_type = None
    for d, ds in enumerate(datasets):
        key_type = key_type or ds.schema.field(key_column).type
        local = 0
        for rb in ds.to_batches(columns=[key_column], scan_in_order=True):
            for key in rb.column(0).to_pylist():
                if key not in seen:  # the first row of a key wins
                    seen[key] = None
                    keys.append(key)
                    owners.append(d)
                    rows.append(local)
                local += 1
    return keys, owners, rows, key_type


def _bucket_of(key: object, buckets: int) -> int:
    # A hash stable across processes (Python's hash() of a str is salted). str() makes an int key and a
    # numpy integer key of a sample land in one bucket, as they were equal keys of a dict.
    data = key if isinstance(key, bytes) else str(key).encode()
    return zlib.crc32(data) % buckets


def _build_refs(datasets: Sequence[LanceDataset], key_column: str, tmp: Path) -> RefMetadata:
    import pyarrow as pa

    keys, owners, rows, key_type = _scan_keys(datasets, key_column)
    buckets = max(1, len(keys) // _BUCKET_KEYS)
    ids = np.fromiter((_bucket_of(k, buckets) for k in keys), dtype=np.int64, count=len(keys))
    order = np.argsort(ids, kind="stable")
    codes = (np.asarray(owners, dtype=np.int64) << _ROW_BITS) | np.asarray(rows, dtype=np.int64)
    table = pa.table({"key": pa.array(keys, type=key_type).take(order), "where": codes[order]})
    with pa.OSFile(str(tmp / _KEYS_FILE), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    offsets = np.searchsorted(ids[order], np.arange(buckets + 1)).tolist()
    return {"count": len(keys), "key_column": key_column, "bucket_offsets": offsets}


class RefRows(Mapping[object, tuple[int, int]]):
    """key -> (dataset, row) over a read reference index: the keys are hashed into buckets of about 4096,
    and a bucket's dict is made on its first lookup, so a reader pays for the keys its samples use (a
    dict of every key costs about as much as scanning a local key column again)."""

    def __init__(self, table: pa.Table, offsets: Sequence[int]) -> None:
        self._table = table
        self._offsets = list(offsets)
        self._buckets: dict[int, dict[object, int]] = {}

    def _bucket(self, key: object) -> dict[object, int]:
        b = _bucket_of(key, len(self._offsets) - 1)
        found = self._buckets.get(b)
        if found is None:
            first, last = self._offsets[b], self._offsets[b + 1]
            part = self._table.slice(first, last - first)
            found = dict(zip(part.column("key").to_pylist(), part.column("where").to_pylist(), strict=True))
            self._buckets[b] = found
        return found

    def __getitem__(self, key: object) -> tuple[int, int]:
        where = self._bucket(key)[key]
        return where >> _ROW_BITS, where & ((1 << _ROW_BITS) - 1)

    def __contains__(self, key: object) -> bool:
        return key in self._bucket(key)

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def __iter__(self) -> Iterator[object]:
        return iter(self._table.column("key").to_pylist())


def _read_refs(entry: IndexEntry, manifest: Manifest) -> RefRows | None:
    import pyarrow as pa

    data = entry.read_checked(manifest, _KEYS_FILE)
    if data is None:
        return None
    try:
        table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
        offsets = cast(RefMetadata, manifest["metadata"])["bucket_offsets"]
    except (pa.ArrowInvalid, OSError, KeyError, TypeError):
        return None
    if len(offsets) < 2 or offsets[-1] != table.num_rows:
        return None
    return RefRows(table, offsets)


def ref_rows(datasets: Sequence[LanceDataset], uris: Sequence[str], key_column: str) -> RefRows:
    """key -> (dataset, row) of the reference `datasets` (opened at their pinned versions), from the
    persistent reference index, built first if no valid one exists."""
    source = [
        dataset_identity(u, int(ds.version), ds.count_rows()) for u, ds in zip(uris, datasets, strict=True)
    ]
    entry = IndexEntry.under_cache(source, REF_KIND, FORMAT_VERSION, {"key_column": key_column})

    def build(tmp: Path, old: Reusable | None) -> RefMetadata:
        return _build_refs(datasets, key_column, tmp)  # one file: nothing of a broken entry to reuse

    found = _read_refs(entry, entry.ensure(build))
    if found is None:
        found = _read_refs(entry, entry.ensure(build, broken=True))
    if found is None:
        raise CacheError(f"the reference index {entry.path} was rebuilt but does not read back; remove it")
    return found
