"""Row codec of cached samples: Python sample dicts to Arrow record batches (stored in Lance) and back.

Arrow holds `str`, `bytes`, `int` (int64), `float`, `bool` and non-empty homogeneous lists of those
natively; those columns stay readable by any Arrow tool. Every other value (numpy arrays, torch tensors,
tuples, dicts, numpy scalars, `None`, big ints) goes into a binary column as tagged bytes so that it
round-trips exactly: `b"N"` + `.npy` bytes for numpy arrays of a plain dtype, `b"P"` + a pickle otherwise.
A null means "the sample had no such field", so samples with differing field sets round-trip too.

The column layout is decided from the first batch and widened when a later value does not fit (a field
seen for the first time, or a value of another type in a native column): the caller then re-encodes what it
wrote so far (see `shardcache.snapshots.writer`). The cache directory is private to the node and written by
this
library, which is why unpickling its values is acceptable.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

SCHEMA_TAG = b"shardcache.codec"
CODEC_VERSION = b"1"
_NAME = b"shardcache.name"
_ENCODING = b"shardcache.encoding"
_NATIVE = b"native"
_TAGGED = b"tagged"

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_SCALARS: dict[type, pa.DataType] = {
    str: pa.large_string(),
    bytes: pa.large_binary(),
    int: pa.int64(),
    float: pa.float64(),
    bool: pa.bool_(),
}


class LayoutChange(Exception):
    """A batch does not fit the current column layout; widen the encoder and re-encode."""


def _scalar_type(value: object) -> pa.DataType | None:
    if type(value) is int and not _INT64_MIN <= value <= _INT64_MAX:
        return None
    return _SCALARS.get(type(value))


def native_type(value: object) -> pa.DataType | None:
    """The Arrow type that holds `value` exactly, or None when it needs tagged bytes."""
    if type(value) is not list:
        return _scalar_type(value)
    if not value:
        return None  # an empty list says nothing about its element type
    first = _scalar_type(value[0])
    if first is None or any(_scalar_type(v) != first for v in value):
        return None
    return pa.large_list(first)


def _fits(value: object, arrow_type: pa.DataType) -> bool:
    if type(value) is list and not value:
        return bool(pa.types.is_large_list(arrow_type))
    return bool(native_type(value) == arrow_type)


def encode_value(value: object) -> bytes:
    """Tagged bytes of any picklable value (numpy arrays of a plain dtype as `.npy`)."""
    if type(value) is np.ndarray and not value.dtype.hasobject:
        buffer = io.BytesIO()
        buffer.write(b"N")
        np.save(buffer, value, allow_pickle=False)
        return buffer.getvalue()
    return b"P" + pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def decode_value(data: bytes) -> object:
    """Inverse of `encode_value`."""
    tag, body = data[:1], memoryview(data)[1:]
    if tag == b"N":
        return np.load(io.BytesIO(body), allow_pickle=False)
    if tag == b"P":
        return pickle.loads(body)
    raise ValueError(f"unknown value tag {tag!r} in a shardcache cache column")


def column_name(field: str) -> str:
    """Lance forbids '.' in top-level column names (tar fields such as 'seg.png' have one): escape it."""
    return field.replace("%", "%25").replace(".", "%2E")


@dataclass(frozen=True)
class FieldLayout:
    """How one sample field is stored: natively as `arrow_type`, or as tagged bytes."""

    name: str
    arrow_type: pa.DataType
    tagged: bool

    def arrow_field(self) -> pa.Field:
        meta = {_NAME: self.name.encode(), _ENCODING: _TAGGED if self.tagged else _NATIVE}
        return pa.field(column_name(self.name), self.arrow_type, nullable=True, metadata=meta)


def _tagged(name: str) -> FieldLayout:
    return FieldLayout(name, pa.large_binary(), True)


def is_cache_schema(schema: pa.Schema) -> bool:
    """Whether a Lance/Arrow schema was written by this codec."""
    return bool(schema.metadata) and SCHEMA_TAG in schema.metadata


def layout_of(schema: pa.Schema) -> dict[str, FieldLayout]:
    """The field layouts of a schema written by this codec."""
    layouts: dict[str, FieldLayout] = {}
    for field in schema:
        meta = field.metadata or {}
        name = meta.get(_NAME, field.name.encode()).decode()
        layouts[name] = FieldLayout(name, field.type, meta.get(_ENCODING) == _TAGGED)
    return layouts


class RowEncoder:
    """Encodes sample dicts into record batches with a layout that only ever widens."""

    def __init__(self, layouts: dict[str, FieldLayout] | None = None) -> None:
        self._layouts: dict[str, FieldLayout] = dict(layouts or {})

    @classmethod
    def unify(cls, schemas: Sequence[pa.Schema]) -> RowEncoder:
        """One layout that holds every value of datasets written with `schemas` (native only if all agree)."""
        merged: dict[str, FieldLayout] = {}
        for schema in schemas:
            for name, layout in layout_of(schema).items():
                known = merged.get(name)
                if known is None:
                    merged[name] = layout
                elif known != layout:
                    merged[name] = _tagged(name)
        return cls(merged)

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema of the batches `encode` makes now."""
        return pa.schema(
            [layout.arrow_field() for layout in self._layouts.values()],
            metadata={SCHEMA_TAG: CODEC_VERSION},
        )

    def fit(self, rows: Sequence[Mapping[str, object]]) -> bool:
        """Widen the layout so that `rows` fit; return whether it changed."""
        changed = False
        seen: dict[str, list[object]] = {}
        for row in rows:
            for name, value in row.items():
                seen.setdefault(name, []).append(value)
        for name, values in seen.items():
            known = self._layouts.get(name)
            if known is None:
                types = {native_type(v) for v in values if not (type(v) is list and not v)}
                only = types.pop() if len(types) == 1 else None
                if only is not None and all(_fits(v, only) for v in values):
                    self._layouts[name] = FieldLayout(name, only, False)
                else:
                    self._layouts[name] = _tagged(name)
                changed = True
            elif not known.tagged and not all(_fits(v, known.arrow_type) for v in values):
                self._layouts[name] = _tagged(name)
                changed = True
        return changed

    def encode(self, rows: Sequence[Mapping[str, object]]) -> pa.RecordBatch:
        """One record batch of `rows`; raises `LayoutChange` when a row does not fit the layout."""
        columns: dict[str, list[object]] = {name: [_ABSENT] * len(rows) for name in self._layouts}
        for index, row in enumerate(rows):
            for name, value in row.items():
                column = columns.get(name)
                if column is None:
                    raise LayoutChange(name)
                column[index] = value
        arrays = []
        for name, layout in self._layouts.items():
            values = columns[name]
            if layout.tagged:
                encoded = [None if v is _ABSENT else encode_value(v) for v in values]
                arrays.append(pa.array(encoded, type=layout.arrow_type))
                continue
            for value in values:
                if value is not _ABSENT and not _fits(value, layout.arrow_type):
                    raise LayoutChange(name)
            arrays.append(pa.array([None if v is _ABSENT else v for v in values], type=layout.arrow_type))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


_ABSENT = object()


def decode_batch(batch: pa.RecordBatch | pa.Table) -> list[dict[str, object]]:
    """Sample dicts of a batch read from a cache dataset (or plain rows of any other Arrow batch).

    Works on any projection of the columns, since each column carries its own layout.
    """
    if not is_cache_schema(batch.schema):
        return list(batch.to_pylist())
    layouts = layout_of(batch.schema)
    names = list(layouts)
    columns: list[list[object]] = []
    has_nulls = False
    for position, name in enumerate(names):
        array = batch.column(position)
        values = array.to_pylist()
        has_nulls = has_nulls or array.null_count > 0
        if layouts[name].tagged:
            values = [None if v is None else decode_value(v) for v in values]
        columns.append(values)
    if not has_nulls:
        return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]
    # A null is an absent field; a stored None is tagged bytes, so it is not confused with one.
    raw_nulls = [batch.column(i).is_null().to_pylist() for i in range(len(names))]
    rows: list[dict[str, object]] = []
    for index in range(batch.num_rows):
        rows.append({name: columns[c][index] for c, name in enumerate(names) if not raw_nulls[c][index]})
    return rows


def decode_batches(batches: Iterable[pa.RecordBatch]) -> Iterable[dict[str, object]]:
    """Sample dicts of a stream of batches, in order."""
    for batch in batches:
        yield from decode_batch(batch)
