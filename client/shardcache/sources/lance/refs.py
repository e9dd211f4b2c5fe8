"""Lance reference columns: the lance source's `ref_columns=` and `Dataset.resolve_ref()` (mvp-dataset 0.2.3).

```python
ds = Dataset.from_source("lance", "/data/train.lance", ref_columns={
    "image": {"uri": "/data/images.lance", "key_column": "id", "value_column": "bytes"},
}).resolve_ref(["image"])
```

A reference column holds a key (or a list of keys) of rows of other Lance datasets (`uri`: one URI or a
list, read as one table in the order given). `resolve_ref(names)` replaces each named column's key by the
`value_column` of the row whose `key_column` equals it: a list of keys gives a list of values, and a key
with no row gives None. When several rows have one key, the first in the reference table wins.

The resolver is a 1:1 stage over any samples (dicts, or lists of dicts after `.batch()`): it reads
`resolve_batch_size` samples ahead, fetches their values with one Lance `take` per reference dataset, and
emits them in order. Its resume state is its upstream's state at the start of the current read-ahead plus
how many of it were emitted, so a resume re-reads at most one read-ahead and skips what was emitted.
The key -> row map of a reference table (its pinned versions) is an on-disk index under the unified cache
root (`lance-ref-index-v1`, `sources.lance.index`), built by the first process that needs it and read by
the others; each process then holds it as a dict. `index=` is accepted and validated for compatibility:
its `build_strategy` and `bucket_count` choose nothing here (one builder, one file).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from shardcache.errors import ConfigError
from shardcache.sources.lance.access import lance_module, storage_options_for
from shardcache.sources.lance.index import ref_rows

if TYPE_CHECKING:
    from lance import LanceDataset

BUILD_STRATEGIES = ("auto", "in_memory", "bucketed")


@dataclass(frozen=True)
class RefColumn:
    """One `ref_columns` entry: the sample column, the reference URIs, the key and value columns."""

    column: str
    uris: tuple[str, ...]
    key_column: str
    value_column: str
    versions: tuple[int, ...] = ()  # pinned by resolve_ref(): later writes to the references are not read

    def describe(self) -> str:
        uris = "|".join(f"{uri}@{v}" for uri, v in itertools.zip_longest(self.uris, self.versions))
        return f"{self.column}<-{uris}[{self.key_column}->{self.value_column}]"

    def pinned(self, storage_options: Mapping[str, str] | None) -> RefColumn:
        """This reference with the current version of each dataset (read by every process alike)."""
        lance = lance_module()
        versions = tuple(
            int(lance.dataset(uri, storage_options=storage_options_for(uri, storage_options)).version)
            for uri in self.uris
        )
        return replace(self, versions=versions)


def parse_ref_columns(value: object) -> tuple[RefColumn, ...]:
    """`ref_columns=` as RefColumns (None: none); ConfigError naming the entry that is wrong."""
    if value is None:
        return ()
    shape = "{'image': {'uri': '/data/images.lance', 'key_column': 'id', 'value_column': 'bytes'}}"
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"ref_columns={value!r}: expected a dict of column -> reference config, e.g. {shape}"
        )
    refs = []
    for column, config in value.items():
        if not isinstance(column, str) or not column:
            raise ConfigError(f"ref_columns: column names must be non-empty strings, got {column!r}")
        if not isinstance(config, Mapping):
            raise ConfigError(f"ref_columns[{column!r}]={config!r}: expected a dict, e.g. {shape}")
        missing = [key for key in ("uri", "key_column", "value_column") if key not in config]
        unknown = sorted(str(key) for key in config if key not in ("uri", "key_column", "value_column"))
        if missing or unknown:
            raise ConfigError(
                f"ref_columns[{column!r}]: missing {missing or 'nothing'}, unknown {unknown or 'nothing'}; "
                "expected the keys uri, key_column, value_column"
            )
        uri = config["uri"]
        uris = (uri,) if isinstance(uri, str) else tuple(uri) if isinstance(uri, (list, tuple)) else ()
        if not uris or not all(isinstance(u, str) and u for u in uris):
            raise ConfigError(
                f"ref_columns[{column!r}] uri={uri!r}: expected a URI or a non-empty list of URIs"
            )
        for key in ("key_column", "value_column"):
            if not isinstance(config[key], str) or not config[key]:
                raise ConfigError(f"ref_columns[{column!r}] {key}={config[key]!r}: expected a column name")
        refs.append(RefColumn(column, uris, config["key_column"], config["value_column"]))
    return tuple(refs)


def check_index(index: object) -> None:
    """`resolve_ref(index=...)`: None or a dict of build_strategy and bucket_count, as mvp-dataset takes."""
    if index is None:
        return
    if not isinstance(index, Mapping):
        raise ConfigError(
            f"resolve_ref(index={index!r}): expected None or a dict of build_strategy, bucket_count",
            code="InvalidLanceRefIndexConfig",
        )
    unknown = sorted(str(key) for key in index if key not in ("build_strategy", "bucket_count"))
    if unknown:
        raise ConfigError(
            f"resolve_ref(index=...): unknown config key(s) {', '.join(unknown)}; accepted: build_strategy, "
            "bucket_count",
            code="InvalidLanceRefIndexConfig",
        )
    strategy = index.get("build_strategy")
    if strategy is not None and strategy not in BUILD_STRATEGIES:
        raise ConfigError(
            f"resolve_ref(index=...) build_strategy={strategy!r}: expected one of {BUILD_STRATEGIES}"
        )
    count = index.get("bucket_count")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        raise ConfigError(f"resolve_ref(index=...) bucket_count={count!r}: expected a positive integer")


class RefTable:
    """The rows of one reference column's datasets, looked up by key (the map built on first use)."""

    def __init__(self, ref: RefColumn, storage_options: Mapping[str, str] | None) -> None:
        self.ref = ref
        self.storage_options = storage_options
        self._datasets: list[LanceDataset] = []
        self._rows: Mapping[object, tuple[int, int]] | None = None

    def _load(self) -> Mapping[object, tuple[int, int]]:
        if self._rows is None:
            lance = lance_module()
            versions = self.ref.versions or (None,) * len(self.ref.uris)
            self._datasets = [
                lance.dataset(uri, version=v, storage_options=storage_options_for(uri, self.storage_options))
                for uri, v in zip(self.ref.uris, versions, strict=True)
            ]
            # The key -> row map of these versions is built once into the cache root and read back by
            # every later process (sources.lance.index), instead of scanning the key column in each.
            self._rows = ref_rows(self._datasets, self.ref.uris, self.ref.key_column)
        return self._rows

    def values(self, keys: Sequence[object]) -> list[object]:
        """The value of each key (None for a key with no row), one `take` per dataset."""
        rows = self._load()
        # One lookup per key (get): the index hashes a key to its bucket on each lookup.
        found = {key: row for key in set(keys) if key is not None and (row := rows.get(key)) is not None}
        value: dict[object, object] = {}
        for d, ds in enumerate(self._datasets):
            wanted = [(key, local) for key, (owner, local) in found.items() if owner == d]
            if wanted:
                table = ds.take([local for _, local in wanted], columns=[self.ref.value_column])
                for (key, _), got in zip(wanted, table.column(0).to_pylist(), strict=True):
                    value[key] = got
        return [value.get(key) for key in keys]


def _targets(batch: Sequence[object]) -> list[dict[str, object]]:
    """The sample dicts of a read-ahead (a list sample, e.g. after `.batch()`, contributes each item)."""
    out: list[dict[str, object]] = []
    for item in batch:
        items = item if isinstance(item, list) else [item]
        for sample in items:
            if not isinstance(sample, dict):
                raise ConfigError(
                    f"resolve_ref: expected dict samples (or lists of them), got {type(sample)}"
                )
            out.append(sample)
    return out


def resolve_batch(tables: Sequence[RefTable], batch: Sequence[object]) -> None:
    """Replace the reference columns of every sample of `batch` by their values, in place."""
    samples = _targets(batch)
    for table in tables:
        column = table.ref.column
        if any(column not in s for s in samples):
            raise ConfigError(f"resolve_ref: a sample has no column {column!r} (dropped by select()?)")
        keys: list[object] = []
        for s in samples:
            key = s[column]
            keys.extend(key if isinstance(key, (list, tuple)) else [key])
        values = iter(table.values(keys))
        for s in samples:
            key = s[column]
            s[column] = [next(values) for _ in key] if isinstance(key, (list, tuple)) else next(values)
