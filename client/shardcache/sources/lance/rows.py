"""Reading rows of the lance source's datasets, and the row metadata every lance sample carries.

The datasets of one source form one global row space: dataset d's row i is global row `starts[d] + i`
(rows as `take` counts them, i.e. after deletions). Each sample carries, as in mvp-dataset 0.2.3:

- `__file__`: the dataset's URI as given;
- `__local_index__`: the row's index in its dataset;
- `__global_index__`: the row's index in the global row space. Filters and subsets keep the original
  index (they choose rows; they do not renumber them);
- `__key__`: `"<uri>:<local index>"`, unless the data has a `__key__` column of its own, which wins (as a
  parquet or jsonl row's own `__key__` does in this project).

`.cache()` reads its own Lance datasets back with metadata off: those rows carry the metadata of the
samples that were written.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from lance import LanceDataset

ROW_ADDRESS = "_rowaddr"

# A sample as a Lance row holds it: field name -> value (user data, passed on as read, never inspected).
Row = dict[str, object]


def positions(ds: LanceDataset, addresses: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Row addresses (fragment id << 32 | offset) as the positions `take` uses (rows after deletions)."""
    addresses = np.asarray(addresses, dtype=np.uint64)
    fragments = ds.get_fragments()
    if all(f.metadata.deletion_file is None for f in fragments):
        base = {}
        start = 0
        for f in fragments:
            base[f.fragment_id] = start
            start += f.count_rows()
        ids = (addresses >> np.uint64(32)).astype(np.int64)
        offsets = (addresses & np.uint64(0xFFFFFFFF)).astype(np.int64)
        lookup = np.array([base[int(i)] for i in np.unique(ids)], dtype=np.int64)
        return lookup[np.searchsorted(np.unique(ids), ids)] + offsets
    every = ds.scanner(columns=[], with_row_address=True, scan_in_order=True).to_table()[ROW_ADDRESS]
    return np.searchsorted(np.asarray(every.to_numpy(), dtype=np.uint64), addresses).astype(np.int64)


class LanceRows:
    """Reads rows of a source's datasets by global index, range or fragment, with their metadata."""

    def __init__(self, datasets: Sequence[LanceDataset], uris: Sequence[str], metadata: bool = True) -> None:
        self.datasets = list(datasets)
        self.uris = list(uris)
        self.sizes = [int(ds.count_rows()) for ds in self.datasets]
        self.starts = [sum(self.sizes[:d]) for d in range(len(self.sizes))]
        self.metadata = metadata

    def _tag(self, rows: list[Row], d: int, locals_: Sequence[int] | npt.NDArray[np.int64]) -> list[Row]:
        if not self.metadata:
            return rows
        uri, start = self.uris[d], self.starts[d]
        for row, local in zip(rows, locals_, strict=True):
            local = int(local)
            row["__file__"] = uri
            row["__local_index__"] = local
            row["__global_index__"] = start + local
            row.setdefault("__key__", f"{uri}:{local}")
        return rows

    def take(self, rows: Sequence[int], cols: list[str] | None, read_batch: int) -> Iterator[Row]:
        """The rows at global indexes `rows`, in that order, `read_batch` rows per Lance read call."""
        from shardcache.sources.lance.codec import decode_batch

        starts = np.asarray(self.starts, dtype=np.int64)
        for first in range(0, len(rows), read_batch):
            group = np.asarray(rows[first : first + read_batch], dtype=np.int64)
            owner = np.searchsorted(starts, group, side="right") - 1
            out: list[Row | None] = [None] * len(group)
            # One take per dataset in the group, then the rows are put back in the planned order.
            for d in np.unique(owner):
                where = np.flatnonzero(owner == d)
                locals_ = group[where] - starts[d]
                table = self.datasets[int(d)].take(locals_.tolist(), columns=cols)
                for i, row in zip(where, self._tag(decode_batch(table), int(d), locals_), strict=True):
                    out[int(i)] = row
            for taken in out:
                assert taken is not None
                yield taken

    def scan(self, d: int, offset: int, count: int, cols: list[str] | None, read_batch: int) -> Iterator[Row]:
        """`count` rows of dataset d from `offset` on, in order."""
        from shardcache.sources.lance.codec import decode_batch

        if count <= 0:
            return
        scanner = self.datasets[d].scanner(columns=cols, offset=offset, limit=count, batch_size=read_batch)
        local = offset
        for rb in scanner.to_batches():
            yield from self._tag(decode_batch(rb), d, range(local, local + rb.num_rows))
            local += rb.num_rows

    def scan_fragment(self, d: int, fragment: int, cols: list[str] | None, read_batch: int) -> Iterator[Row]:
        """Every row of one fragment of dataset d, in the order Lance scans it (not deterministic)."""
        from shardcache.sources.lance.codec import decode_batch

        ds = self.datasets[d]
        scanner = ds.scanner(
            columns=cols,
            fragments=[ds.get_fragment(fragment)],  # type: ignore[list-item]  # planned ids exist
            scan_in_order=False,
            batch_size=read_batch,
            with_row_address=self.metadata,  # the rows' indexes come from their addresses
        )
        base = self._fragment_base(ds, fragment) if self.metadata else None
        for rb in scanner.to_batches():
            if not self.metadata:
                yield from decode_batch(rb)
                continue
            addresses = rb.column(ROW_ADDRESS).to_numpy()
            if base is not None:  # no deletions: the offset in the fragment counts from its first row
                locals_ = base + (addresses & 0xFFFFFFFF).astype("int64")
            else:
                locals_ = positions(ds, addresses)
            yield from self._tag(decode_batch(rb.drop_columns([ROW_ADDRESS])), d, locals_)

    @staticmethod
    def _fragment_base(ds: LanceDataset, fragment: int) -> int | None:
        """The index of the fragment's first row when no fragment has deletions (else None: see positions)."""
        base = 0
        for f in ds.get_fragments():
            if f.metadata.deletion_file is not None:
                return None
            if f.fragment_id == fragment:
                return base
            base += f.count_rows()
        return None
