"""mvp-dataset 0.2.3's Lance filter behaviours (issue 19, gap 9): how predicates are scanned and combined,
errors for bad predicates and placements, and no fragment listing without a filter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

lance = pytest.importorskip("lance")
pa = pytest.importorskip("pyarrow")

from shardcache import Dataset  # noqa: E402
from shardcache.errors import ConfigError, InvalidPredicate  # noqa: E402


def lance_source(tmp_path: Path, rows: int, name: str = "source.lance") -> str:
    uri = str(tmp_path / name)
    lance.write_dataset(
        pa.table({"value": pa.array(list(range(rows)), type=pa.int64())}), uri, max_rows_per_file=3
    )
    return uri


def values(ds: Dataset) -> list[int]:
    return [int(s["value"]) for s in ds]


@pytest.fixture
def scanned(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """The filters passed to Lance's scanner, with their use_scalar_index."""
    seen: list[tuple[str, Any]] = []
    original = lance.LanceDataset.scanner

    def tracked(self: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("filter") is not None:
            seen.append((kwargs["filter"], kwargs.get("use_scalar_index")))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(lance.LanceDataset, "scanner", tracked)
    return seen


def test_a_predicate_list_is_ored_deduplicated_and_in_source_order(tmp_path: Path) -> None:
    ds = Dataset.from_source("lance", lance_source(tmp_path, 20)).filter(
        ["value IN (7, 1, 4)", "value = 18", "value IN (4, 2)"]
    )
    assert values(ds) == [1, 2, 4, 7, 18]


def test_each_predicate_is_scanned_on_its_own_with_scalar_indexes(tmp_path: Path, scanned: list[Any]) -> None:
    values(
        Dataset.from_source("lance", lance_source(tmp_path, 20)).filter(
            ["value < 3", "value = 18", "value < 3"]
        )
    )
    assert scanned == [("value < 3", True), ("value = 18", True)]


def test_two_single_predicate_filters_scan_as_one_conjunction(tmp_path: Path, scanned: list[Any]) -> None:
    assert values(
        Dataset.from_source("lance", lance_source(tmp_path, 20)).filter("value >= 4").filter("value < 7")
    ) == [4, 5, 6]
    assert scanned == [("(value >= 4) AND (value < 7)", True)]


def test_filters_of_predicate_lists_are_anded(tmp_path: Path) -> None:
    ds = (
        Dataset.from_source("lance", lance_source(tmp_path, 20))
        .filter(["value < 10", "value > 15"])
        .filter(["value % 2 = 0", "value = 17"])
    )
    assert values(ds) == [0, 2, 4, 6, 8, 16, 17, 18]


def test_filters_over_several_datasets_keep_source_order(tmp_path: Path) -> None:
    uris = [lance_source(tmp_path, 5, "a.lance"), lance_source(tmp_path, 5, "b.lance")]
    assert values(Dataset.from_source("lance", uris).filter(["value = 4", "value = 0"])) == [0, 4, 0, 4]


def test_a_bad_predicate_on_an_empty_dataset_raises_a_clear_error(tmp_path: Path) -> None:
    uri = str(tmp_path / "empty.lance")
    lance.write_dataset(pa.table({"value": pa.array([], type=pa.int64())}), uri)
    assert values(Dataset.from_source("lance", uri).filter("value > 0")) == []
    with pytest.raises(InvalidPredicate, match=r"InvalidLanceFilter.*'missing > 0'.*No field named missing"):
        values(Dataset.from_source("lance", uri).filter("missing > 0"))


def test_a_bad_predicate_error_is_also_an_oserror_and_a_config_error(tmp_path: Path) -> None:
    ds = Dataset.from_source("lance", lance_source(tmp_path, 4)).filter("missing > 0")
    with pytest.raises(OSError, match="No field named missing"):
        values(ds)
    assert issubclass(InvalidPredicate, ConfigError)


def test_a_source_without_filter_does_not_list_fragments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = lance_source(tmp_path, 8)
    monkeypatch.setattr(
        lance.LanceDataset, "get_fragments", lambda _self: pytest.fail("fragments were listed")
    )
    assert values(Dataset.from_source("lance", uri)) == list(range(8))


def test_filter_on_a_non_lance_source_is_not_implemented(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"value": 1}\n')
    with pytest.raises(NotImplementedError, match="UnsupportedFilter"):
        Dataset.from_source("jsonl", str(path)).filter("value > 0")


@pytest.mark.parametrize(
    ("predicate", "error", "message"),
    [
        (1, TypeError, "predicate must be a string"),
        ("  ", ValueError, "predicate must be non-empty"),
        ([], ValueError, "predicate sequence must be non-empty"),
        (["value > 0", 1], TypeError, "every predicate must be a string"),
    ],
    ids=["not-a-string", "blank", "empty-list", "non-string-item"],
)
def test_bad_predicates_raise_mvps_error_types(
    tmp_path: Path, predicate: Any, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        Dataset.from_source("lance", lance_source(tmp_path, 2)).filter(predicate)


def test_index_options_are_unknown_config_keys(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown config key"):
        Dataset.from_source("lance", lance_source(tmp_path, 2)).filter("value > 0", index={"scope": "x"})


def test_filter_after_a_stage_or_a_split_is_an_invalid_placement(tmp_path: Path) -> None:
    ds = Dataset.from_source("lance", lance_source(tmp_path, 4))
    with pytest.raises(ValueError, match="InvalidFilterPlacement"):
        ds.map(lambda row: row).filter("value > 0")
    with pytest.raises(ValueError, match="InvalidFilterPlacement"):
        ds.split([1, 1])[0].filter("value > 0")


def test_filter_reads_datasets_with_deleted_rows(tmp_path: Path) -> None:
    # A deliberate difference: mvp-dataset refuses ([UnsupportedLanceFilterDeletedRows]); we read them.
    uri = lance_source(tmp_path, 8)
    lance.dataset(uri).delete("value = 1")
    assert values(Dataset.from_source("lance", uri).filter("value >= 0")) == [0, 2, 3, 4, 5, 6, 7]
