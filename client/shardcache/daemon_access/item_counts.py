"""How many samples one item of a trainer's iterator holds, for the telemetry's sample counts.

A batch's samples are read from its shape, whatever its collation (a list, columns, an array, a table, a
dict of columns); the iterators that do not batch count each item as one.
"""

from __future__ import annotations

from collections.abc import Mapping


def count_items(item: object) -> int:
    """Samples in one batch: its length, or its leading dimension for arrays and columns.

    A batch is a list of samples (its length), a tuple of columns such as `(images, labels)` (the leading
    dimension of the first), an array or tensor (its leading dimension), a table (`num_rows`), or a dict of
    columns (the first column that has a length, looking into nested dicts: `{"meta": {"id": tensor},
    ...}`). Anything else counts as one. Apply it to batches only: a single sample holding an image array
    would count as the image's height.
    """
    if isinstance(item, Mapping):
        count = _column_length(item)
        return 1 if count is None else count
    rows = getattr(item, "num_rows", None)
    if isinstance(rows, int):
        return rows
    if isinstance(item, (list, tuple)):
        if not item:
            return 0
        leading = _leading_dimension(item[0]) if isinstance(item, tuple) else None
        return len(item) if leading is None else leading
    leading = _leading_dimension(item)
    return 1 if leading is None else leading


def _leading_dimension(value: object) -> int | None:
    shape = getattr(value, "shape", None)
    return int(shape[0]) if shape else None


def _column_length(columns: Mapping[object, object]) -> int | None:
    """The length of the first column of a dict batch that has one (nested dicts searched in order)."""
    for value in columns.values():
        if isinstance(value, Mapping):
            count = _column_length(value)
        elif isinstance(value, (list, tuple)):
            count = len(value)
        else:
            count = _leading_dimension(value)
        if count is not None:
            return count
    return None


def one_per_item(item: object) -> int:
    """Each item is one sample (iterators that do not batch)."""
    return 1
