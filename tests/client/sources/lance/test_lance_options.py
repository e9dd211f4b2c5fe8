"""mvp-dataset 0.2.3's Lance options: `read_batch_size`, `shuffle_mode="chunk"` with `chunk_shuffle`, and the
row metadata of Lance samples (`__file__`, `__local_index__`, `__global_index__`, `__key__`).

Datasets are real Lance datasets written under tmp_path; every row's `v` is its global row index, so a
sample's `__global_index__` can be checked against its data.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from harness.pipelines import assert_resumes, slot_contexts
from shardcache import Dataset, RuntimeContext
from shardcache.errors import ConfigError, StateError

lance = pytest.importorskip("lance")

ROWS = 23  # not a multiple of the chunk sizes below: the last chunk is short
CHUNK = {"chunk_size": 4, "k": 2}


def write(path: Path, values: list[int], per_file: int = 5, **extra: list[Any]) -> str:
    lance.write_dataset(pa.table({"v": values, **extra}), str(path), max_rows_per_file=per_file)
    return str(path)


@pytest.fixture
def one(tmp_path: Path) -> str:
    return write(tmp_path / "one.lance", list(range(ROWS)))


@pytest.fixture
def two(tmp_path: Path) -> list[str]:
    """Two datasets of 7 and 9 rows: global rows 0..15."""
    return [write(tmp_path / "a.lance", list(range(7))), write(tmp_path / "b.lance", list(range(7, 16)))]


def values(ds: Dataset, **ctx: Any) -> list[int]:
    return [s["v"] for s in ds.iter_context(RuntimeContext(**ctx))]


def chunked(shards: Any, **options: Any) -> Dataset:
    options.setdefault("chunk_shuffle", CHUNK)
    return Dataset.from_source("lance", shards, shuffle_mode="chunk", **options)


# -- read_batch_size ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["none", "global", "chunk"])
def test_read_batch_size_changes_neither_rows_nor_order(two: list[str], mode: str) -> None:
    extra: dict[str, Any] = {"chunk_shuffle": CHUNK} if mode == "chunk" else {}

    def read(size: int) -> list[dict[str, Any]]:
        ds = Dataset.from_source("lance", two, shuffle_mode=mode, read_batch_size=size, batch_size=5, **extra)
        return list(ds.iter_context(RuntimeContext(seed=4)))

    assert read(1) == read(3) == read(1000)


def test_read_batch_size_stays_out_of_the_fingerprint(one: str) -> None:
    plain = Dataset.from_source("lance", one).fingerprint()
    assert Dataset.from_source("lance", one, read_batch_size=7).fingerprint() == plain


def test_a_state_resumes_under_another_read_batch_size(one: str) -> None:
    first = Dataset.from_source("lance", one, shuffle_mode="global", batch_size=6, read_batch_size=2)
    it = iter(first)
    head = [next(it)["v"] for _ in range(9)]
    state = first.state_dict()
    second = Dataset.from_source("lance", one, shuffle_mode="global", batch_size=6, read_batch_size=5)
    second.load_state_dict(state)
    assert head + [s["v"] for s in second] == values(Dataset.from_source("lance", one, shuffle_mode="global"))


@pytest.mark.parametrize("bad", [0, -3, 2.5, "8", True])
def test_a_bad_read_batch_size_is_refused(one: str, bad: object) -> None:
    with pytest.raises(ConfigError, match=r"read_batch_size=.*positive integer"):
        Dataset.from_source("lance", one, read_batch_size=bad)


# -- shuffle_mode="chunk" -------------------------------------------------------------------------------


@pytest.mark.parametrize("total", [1, 2, 3, 8])
def test_chunk_reads_every_row_once_across_slots(one: str, total: int) -> None:
    ds = chunked(one, batch_size=3)
    seen = Counter(s["v"] for ctx in slot_contexts(total) for s in ds.iter_context(ctx))
    assert sorted(seen) == list(range(ROWS)) and set(seen.values()) == {1}


def size(chunk: int, chunk_size: int = 4) -> int:
    return min(chunk_size, ROWS - chunk * chunk_size)


def test_chunk_reads_whole_windows_of_k_chunks_in_turn(one: str) -> None:
    got = values(chunked(one), seed=5)
    assert got != list(range(ROWS)) and sorted(got) == list(range(ROWS))
    # Cut the reading order where the rows read so far are exactly k=2 whole chunks of 4 rows (or the rest).
    cut, windows = 0, []
    while cut < ROWS:
        chunks: set[int] = set()
        end = cut
        while True:
            chunks.add(got[end] // 4)
            end += 1
            assert len(chunks) <= 2, f"a window of {got[cut:end]} spans more than k chunks"
            whole = sum(map(size, chunks)) == end - cut
            if whole and (len(chunks) == 2 or end == ROWS):
                break
        windows.append(got[cut:end])
        cut = end
    assert len(windows) == 3  # 6 chunks (the last of 3 rows) in windows of 2


def test_chunk_permuted_shuffles_rows_within_a_window(one: str) -> None:
    got = values(chunked(one, chunk_shuffle={"chunk_size": 8, "k": 1}), seed=5)
    # One chunk per window: each chunk is read as a block, its rows in a shuffled order.
    blocks = [got[i : i + 8] for i in range(0, len(got), 8)]
    assert any(block != sorted(block) for block in blocks)


def test_chunk_sequential_reads_runs_of_whole_chunks(one: str) -> None:
    got = values(chunked(one, chunk_shuffle={**CHUNK, "row_order": "sequential"}), seed=5)
    assert got != list(range(ROWS)) and sorted(got) == list(range(ROWS))
    position = 0
    while position < ROWS:  # each chunk is read whole, in source order, from its first row
        first = got[position]
        assert first % 4 == 0
        assert got[position : position + size(first // 4)] == list(range(first, first + size(first // 4)))
        position += size(first // 4)


def test_chunk_order_is_seeded_and_changes_per_epoch(one: str) -> None:
    ds = chunked(one)
    assert values(ds, seed=1) == values(ds, seed=1)
    assert values(ds, seed=1) != values(ds, seed=2)
    assert values(ds, seed=1, epoch=0) != values(ds, seed=1, epoch=1)


def test_chunk_shuffle_defaults_equal_an_omitted_chunk_shuffle(one: str) -> None:
    omitted = Dataset.from_source("lance", one, shuffle_mode="chunk")
    spelled = chunked(one, chunk_shuffle={"chunk_size": 250_000, "k": 8, "row_order": "permuted"})
    assert values(omitted, seed=3) == values(spelled, seed=3)
    assert omitted.fingerprint() == spelled.fingerprint()


def test_chunk_fingerprints_follow_the_order_not_the_spelling(one: str) -> None:
    base = chunked(one, chunk_shuffle={"k": 2, "chunk_size": 4}).fingerprint()
    assert chunked(one, chunk_shuffle={"chunk_size": 4, "k": 2}).fingerprint() == base
    assert chunked(one, chunk_shuffle={"chunk_size": 4, "k": 3}).fingerprint() != base
    assert chunked(one, chunk_shuffle={**CHUNK, "row_order": "sequential"}).fingerprint() != base
    assert Dataset.from_source("lance", one, shuffle_mode="global").fingerprint() != base
    assert Dataset.from_source("lance", one).fingerprint() != base


def test_a_state_of_another_chunk_shuffle_is_refused(one: str) -> None:
    first = chunked(one)
    it = iter(first)
    next(it)
    state = first.state_dict()
    with pytest.raises(StateError):
        chunked(one, chunk_shuffle={"chunk_size": 5, "k": 2}).load_state_dict(state)


@pytest.mark.parametrize("mode", ["none", "global", "random_scan"])
def test_chunk_shuffle_none_is_accepted_with_the_other_modes(one: str, mode: str) -> None:
    plain = Dataset.from_source("lance", one, shuffle_mode=mode)
    ds = Dataset.from_source("lance", one, shuffle_mode=mode, chunk_shuffle=None)
    assert ds.fingerprint() == plain.fingerprint()
    assert sorted(values(ds)) == list(range(ROWS))


@pytest.mark.parametrize("mode", ["none", "global"])
def test_a_chunk_shuffle_dict_needs_the_chunk_mode(one: str, mode: str) -> None:
    with pytest.raises(ConfigError, match=r"chunk_shuffle=.*requires shuffle_mode='chunk'"):
        Dataset.from_source("lance", one, shuffle_mode=mode, chunk_shuffle=CHUNK)


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"chunk_size": 0}, "chunk_size"),
        ({"k": 0}, "k=0"),
        ({"k": "2"}, "k="),
        ({"row_order": "reversed"}, "row_order"),
        ({"window": 3}, "unknown config key.*window"),
        ([4, 2], "expected a dict"),
    ],
)
def test_a_bad_chunk_shuffle_is_refused(one: str, bad: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        chunked(one, chunk_shuffle=bad)


def test_an_unknown_shuffle_mode_lists_chunk(one: str) -> None:
    with pytest.raises(ConfigError, match=r"shuffle_mode='sorted'.*'chunk'"):
        Dataset.from_source("lance", one, shuffle_mode="sorted")


@pytest.mark.parametrize("batch_size", [3, 100])
def test_chunk_resumes_exactly(one: str, batch_size: int) -> None:
    assert_resumes(
        lambda: chunked(one, batch_size=batch_size, read_batch_size=2),
        [0, 1, 5, 12, 22],
        RuntimeContext(seed=8),
    )


def test_chunk_resumes_exactly_on_a_slot_with_resample(one: str) -> None:
    ctx = RuntimeContext(rank=1, world_size=2, seed=3)

    def make() -> Dataset:
        return chunked(one, batch_size=4, resample=True, context=ctx)

    full = [s["v"] for s in itertools.islice(iter(make()), 40)]  # several rounds of 11 or 12 rows
    for n in (5, 11, 17):
        first = make()
        head = [s["v"] for s in itertools.islice(iter(first), n)]
        state = json.loads(json.dumps(first.state_dict()))
        second = make()
        second.load_state_dict(state)
        assert head + [s["v"] for s in itertools.islice(iter(second), 40 - n)] == full
    # Its first round is the rows a non-resampling rank 1 reads: those rank 0 does not.
    rank0 = values(chunked(one), rank=0, world_size=2, seed=3)
    assert sorted(full[:11]) == sorted(set(range(ROWS)) - set(rank0))


@pytest.mark.parametrize("even", ["pad", "drop"])
def test_chunk_with_even_gives_every_rank_the_same_count(one: str, even: str) -> None:
    ds = chunked(one, even=even)
    ranks = [values(ds, rank=r, world_size=3, seed=2) for r in range(3)]
    assert len({len(r) for r in ranks}) == 1
    assert_resumes(lambda: chunked(one, even=even), [0, 3, 6], RuntimeContext(rank=2, world_size=3, seed=2))


def test_chunk_over_a_filter_reads_only_matching_rows_once(one: str) -> None:
    ds = chunked(one).filter("v % 3 = 0")
    got = values(ds, seed=6)
    assert got != sorted(got) and sorted(got) == list(range(0, ROWS, 3))
    assert_resumes(lambda: chunked(one).filter("v % 3 = 0"), [0, 2, 5], RuntimeContext(seed=6))


def test_chunk_over_a_split_cuts_the_parts_from_the_seeds_chunk_order(one: str) -> None:
    left, right = chunked(one).split([0.5, 0.5])
    # The parts follow the context seed (as mvp-dataset's do), and keep their rows in every epoch.
    first = sorted(values(left, seed=1))
    assert first == sorted(values(left, seed=1, epoch=3))
    assert sorted(first + values(right, seed=1)) == list(range(ROWS))
    assert len(first) == round(0.5 * ROWS)
    assert first != sorted(values(left, seed=2))


# -- row metadata ---------------------------------------------------------------------------------------


def test_samples_carry_file_indexes_and_key(one: str) -> None:
    first = next(iter(Dataset.from_source("lance", one)))
    assert first == {
        "v": 0,
        "__file__": one,
        "__local_index__": 0,
        "__global_index__": 0,
        "__key__": f"{one}:0",
    }


def test_global_index_runs_across_the_datasets_of_a_source(two: list[str]) -> None:
    rows = list(Dataset.from_source("lance", two, read_batch_size=3))
    assert [s["__global_index__"] for s in rows] == list(range(16))
    assert [s["__local_index__"] for s in rows] == list(range(7)) + list(range(9))
    assert [s["__file__"] for s in rows] == [two[0]] * 7 + [two[1]] * 9
    assert rows[8]["__key__"] == f"{two[1]}:1"


@pytest.mark.parametrize("mode", ["global", "chunk", "random_scan"])
def test_every_mode_tags_each_row_with_its_own_indexes(two: list[str], mode: str) -> None:
    extra: dict[str, Any] = {"chunk_shuffle": CHUNK} if mode == "chunk" else {}
    rows = list(Dataset.from_source("lance", two, shuffle_mode=mode, read_batch_size=2, **extra))
    assert sorted(s["v"] for s in rows) == list(range(16))
    assert all(s["__global_index__"] == s["v"] for s in rows)
    assert all(s["__local_index__"] == s["v"] - (0 if s["__file__"] == two[0] else 7) for s in rows)


def test_filter_keeps_the_original_indexes(two: list[str]) -> None:
    rows = list(Dataset.from_source("lance", two).filter(["v IN (4, 6, 8)", "v IN (5, 12)"]))
    assert [s["__global_index__"] for s in rows] == [4, 5, 6, 8, 12]
    assert [s["__local_index__"] for s in rows] == [4, 5, 6, 1, 5]


def test_subsets_keep_the_original_indexes(two: list[str]) -> None:
    parts = [
        *Dataset.from_source("lance", two).split([0.5, 0.5]),
        Dataset.from_source("lance", two).sample(0.4),
    ]
    for part in parts:
        assert all(s["__global_index__"] == s["v"] for s in part)


def test_a_key_column_of_the_data_wins(tmp_path: Path) -> None:
    path = write(tmp_path / "keyed.lance", [0, 1], __key__=["first", "second"])
    rows = list(Dataset.from_source("lance", path))
    assert [s["__key__"] for s in rows] == ["first", "second"]
    assert [s["__global_index__"] for s in rows] == [0, 1]


def test_cache_read_back_keeps_the_written_metadata(one: str, tmp_path: Path) -> None:
    source = Dataset.from_source("lance", one).filter("v >= 20")
    cached = source.cache(str(tmp_path / "cache"))
    assert list(cached) == list(source)


# -- ref_columns and resolve_ref ------------------------------------------------------------------------


@pytest.fixture
def refs(tmp_path: Path) -> dict[str, Any]:
    """Main rows v=0..9 with `img` = key "k<v % 4>" (row 9: a key with no reference row) and `imgs` lists."""
    images = [f"k{v % 4}" if v != 9 else "absent" for v in range(10)]
    pairs = [[f"k{v % 4}", f"k{(v + 1) % 4}"] for v in range(10)]
    main = write(tmp_path / "main.lance", list(range(10)), per_file=4, img=images, imgs=pairs)
    lance.write_dataset(pa.table({"key": ["k0", "k1"], "val": [b"zero", b"one"]}), str(tmp_path / "r1.lance"))
    lance.write_dataset(
        pa.table({"key": ["k2", "k3", "k0"], "val": [b"two", b"three", b"dup"]}), str(tmp_path / "r2.lance")
    )
    uris = [str(tmp_path / "r1.lance"), str(tmp_path / "r2.lance")]
    config = {"uri": uris, "key_column": "key", "value_column": "val"}
    return {"main": main, "uris": uris, "ref_columns": {"img": config, "imgs": config}}


NAMES = {0: b"zero", 1: b"one", 2: b"two", 3: b"three"}


def with_refs(refs: dict[str, Any], **options: Any) -> Dataset:
    return Dataset.from_source("lance", refs["main"], ref_columns=refs["ref_columns"], **options)


def test_resolve_ref_replaces_keys_by_the_referenced_values(refs: dict[str, Any]) -> None:
    rows = list(with_refs(refs).resolve_ref(["img"], resolve_batch_size=3))
    assert [s["img"] for s in rows] == [NAMES[v % 4] for v in range(9)] + [None]  # k0: the first row wins
    assert rows[0]["imgs"] == ["k0", "k1"]  # not asked for: left as it is


def test_resolve_ref_resolves_lists_of_keys(refs: dict[str, Any]) -> None:
    rows = list(with_refs(refs).resolve_ref("imgs"))
    assert [s["imgs"] for s in rows] == [[NAMES[v % 4], NAMES[(v + 1) % 4]] for v in range(10)]


def test_resolve_ref_resolves_batched_samples(refs: dict[str, Any]) -> None:
    batches = list(with_refs(refs).batch(4).resolve_ref(["img"], resolve_batch_size=2))
    assert [s["img"] for batch in batches for s in batch] == [NAMES[v % 4] for v in range(9)] + [None]


def test_resolve_ref_after_a_filter_under_chunk_shuffle(refs: dict[str, Any]) -> None:
    ds = with_refs(refs, shuffle_mode="chunk", chunk_shuffle=CHUNK, read_batch_size=2)
    rows = list(ds.filter("v IN (1, 4, 7)").resolve_ref(["img", "imgs"], resolve_batch_size=2))
    assert sorted((s["__global_index__"], s["img"]) for s in rows) == [
        (1, b"one"),
        (4, b"zero"),
        (7, b"three"),
    ]


def test_resolve_ref_reads_the_references_as_they_were_when_called(refs: dict[str, Any]) -> None:
    ds = with_refs(refs).resolve_ref(["img"])
    lance.write_dataset(pa.table({"key": ["k1"], "val": [b"new"]}), refs["uris"][0], mode="overwrite")
    assert [s["img"] for s in ds][:2] == [b"zero", b"one"]


def test_resolve_ref_resumes_exactly(refs: dict[str, Any]) -> None:
    def make() -> Dataset:
        return with_refs(refs, shuffle_mode="global", batch_size=3).resolve_ref(["img"], resolve_batch_size=4)

    assert_resumes(make, [0, 1, 3, 4, 5, 9], RuntimeContext(seed=2))


def test_ref_columns_stay_out_of_the_source_fingerprint(refs: dict[str, Any]) -> None:
    plain = Dataset.from_source("lance", refs["main"])
    assert with_refs(refs).fingerprint() == plain.fingerprint()
    assert with_refs(refs).resolve_ref("img").fingerprint() != plain.fingerprint()
    assert (
        with_refs(refs).resolve_ref("img").fingerprint() != with_refs(refs).resolve_ref("imgs").fingerprint()
    )


def test_resolve_ref_of_an_unconfigured_column_is_refused(refs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"'label' not in the lance source's ref_columns"):
        with_refs(refs).resolve_ref(["img", "label"])
    with pytest.raises(ConfigError, match="configured: none"):
        Dataset.from_source("lance", refs["main"]).resolve_ref("img")


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (["img"], "expected a dict"),
        ({"img": {"uri": "x.lance", "key_column": "key"}}, "missing \\['value_column'\\]"),
        ({"img": {"uri": [], "key_column": "k", "value_column": "v"}}, "uri=\\[\\]"),
        (
            {"img": {"uri": "x", "key_column": "k", "value_column": "v", "scope": "a"}},
            "unknown \\['scope'\\]",
        ),
    ],
)
def test_bad_ref_columns_are_refused(refs: dict[str, Any], bad: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Dataset.from_source("lance", refs["main"], ref_columns=bad)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"resolve_batch_size": 0}, "resolve_batch_size=0"),
        ({"index": {"scope": "shared"}}, "unknown config key.*scope"),
        ({"index": {"build_strategy": "sorted"}}, "build_strategy='sorted'"),
        ({"index": {"bucket_count": 0}}, "bucket_count=0"),
    ],
)
def test_bad_resolve_ref_arguments_are_refused(
    refs: dict[str, Any], kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        with_refs(refs).resolve_ref("img", **kwargs)


def test_resolve_ref_accepts_mvps_index_settings(refs: dict[str, Any]) -> None:
    ds = with_refs(refs).resolve_ref("img", index={"build_strategy": "bucketed", "bucket_count": 2})
    assert [s["img"] for s in ds][:4] == [b"zero", b"one", b"two", b"three"]
