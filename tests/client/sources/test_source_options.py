"""mvp-dataset 0.2.3's source options: `shuffle_mode` (tars, jsonl, parquet), parquet's
`min_row_groups_per_chunk` and `use_threads`.

The default mode ("shard_aware", parquet "chunk_aware") reads the units (shards, row-group chunks) in a
seeded order per epoch; "none" reads them in source order, dealt to slots round-robin. Samples within a unit
are always in file order. Modes that change the order are part of the fingerprint, so a state of one mode
does not resume another.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.pipelines import assert_resumes, keys, make_tars, slot_contexts
from shardcache import Dataset, RuntimeContext
from shardcache.errors import ConfigError, StateError

SHARDS = 8
PER_SHARD = 3
ROW_GROUPS = (2, 2, 2, 2, 1)  # rows per row group of each parquet file: 5 groups, 9 rows


def tar_keys() -> list[str]:
    return [f"s{s:03d}_{i:04d}" for s in range(SHARDS) for i in range(PER_SHARD)]


@pytest.fixture
def tars(tmp_path: Path) -> list[str]:
    return make_tars(tmp_path / "tars", SHARDS, PER_SHARD)


@pytest.fixture
def jsonl(tmp_path: Path) -> list[str]:
    paths = []
    for f in range(4):
        path = tmp_path / f"part_{f}.jsonl"
        path.write_text("".join(json.dumps({"id": f"j{f}_{i}"}) + "\n" for i in range(3)))
        paths.append(str(path))
    return paths


@pytest.fixture
def parquet(tmp_path: Path) -> list[str]:
    paths = []
    for f in range(2):
        ids = [f"p{f}_{i}" for i in range(sum(ROW_GROUPS))]
        path = tmp_path / f"rows_{f}.parquet"
        with pq.ParquetWriter(path, pa.schema([("id", pa.string())])) as writer:
            start = 0
            for rows in ROW_GROUPS:
                writer.write_table(pa.table({"id": ids[start : start + rows]}))
                start += rows
        assert pq.ParquetFile(path).metadata.num_row_groups == len(ROW_GROUPS)
        paths.append(str(path))
    return paths


def parquet_ids(files: int = 2) -> list[str]:
    return [f"p{f}_{i}" for f in range(files) for i in range(sum(ROW_GROUPS))]


def read(ds: Dataset, field: str = "__key__", **ctx: Any) -> list[Any]:
    return [s[field] for s in ds.iter_context(RuntimeContext(**ctx))]


def runs(ids: list[str]) -> list[list[str]]:
    """`ids` cut where an id does not follow the previous one in the same file (ids are `<file>_<index>`)."""
    out: list[list[str]] = []
    last: tuple[str, int] | None = None
    for value in ids:
        f, i = value.rsplit("_", 1)
        if last is not None and last == (f, int(i) - 1):
            out[-1].append(value)
        else:
            out.append([value])
        last = (f, int(i))
    return out


def contiguous(got: list[str], chunk: list[str]) -> bool:
    """Whether `chunk` is read as one block, in order."""
    at = got.index(chunk[0])
    return got[at : at + len(chunk)] == chunk


# -- shuffle_mode --------------------------------------------------------------------------------------


def test_tars_none_reads_shards_in_source_order_every_epoch(tars: list[str]) -> None:
    ds = Dataset.from_source("tars", tars, daemon=None, shuffle_mode="none")
    for epoch in (0, 1, 2):
        assert keys(ds.iter_context(RuntimeContext(epoch=epoch, seed=3))) == tar_keys()


def test_tars_shard_aware_is_the_default_and_shuffles_shards_per_epoch(tars: list[str]) -> None:
    default = Dataset.from_source("tars", tars, daemon=None)
    explicit = Dataset.from_source("tars", tars, daemon=None, shuffle_mode="shard_aware")
    orders = []
    for epoch in (0, 1):
        got = read(explicit, epoch=epoch, seed=3)
        assert got == read(default, epoch=epoch, seed=3)
        assert sorted(got) == tar_keys() and got != tar_keys()
        assert all(len(run) == PER_SHARD for run in runs(got))  # whole shards, samples in file order
        orders.append(got)
    assert orders[0] != orders[1]


def test_none_deals_source_order_round_robin_to_slots(tars: list[str]) -> None:
    ds = Dataset.from_source("tars", tars, daemon=None, shuffle_mode="none")
    for slot, ctx in enumerate(slot_contexts(4, workers=2)):
        want = [k for k in tar_keys() if int(k[1:4]) % 4 == slot]
        assert keys(ds.iter_context(ctx)) == want


def test_none_with_resample_rotates_shards_across_slots_per_round(tmp_path: Path) -> None:
    paths = make_tars(tmp_path / "three", 3, 1)
    ds = Dataset.from_source("tars", paths, daemon=None, shuffle_mode="none", resample=True)
    ctx0, ctx1 = slot_contexts(2)
    # Round r gives slot s the positions i with (3r + i) % 2 == s, as mvp-dataset deals them.
    assert keys(itertools.islice(ds.iter_context(ctx0), 5)) == ["s000_0000", "s002_0000", "s001_0000"] + [
        "s000_0000",
        "s002_0000",
    ]
    assert keys(itertools.islice(ds.iter_context(ctx1), 3)) == ["s001_0000", "s000_0000", "s002_0000"]


def test_jsonl_none_reads_files_in_source_order(jsonl: list[str]) -> None:
    want = [f"j{f}_{i}" for f in range(4) for i in range(3)]
    none = Dataset.from_source("jsonl", jsonl, daemon=None, shuffle_mode="none")
    assert read(none, "id", epoch=1, seed=7) == want
    shuffled = read(Dataset.from_source("jsonl", jsonl, daemon=None), "id", epoch=1, seed=7)
    assert sorted(shuffled) == want and shuffled != want


def test_parquet_none_reads_row_groups_in_source_order(parquet: list[str]) -> None:
    none = Dataset.from_source("parquet", parquet, daemon=None, shuffle_mode="none")
    assert read(none, "id", epoch=2, seed=1) == parquet_ids()
    chunk_aware = Dataset.from_source("parquet", parquet, daemon=None, shuffle_mode="chunk_aware")
    shuffled = read(chunk_aware, "id", epoch=2, seed=1)
    assert shuffled == read(Dataset.from_source("parquet", parquet, daemon=None), "id", epoch=2, seed=1)
    assert sorted(shuffled) == sorted(parquet_ids()) and shuffled != parquet_ids()


@pytest.mark.parametrize("even", ["drop", "pad"])
@pytest.mark.parametrize("placement", ["global", "node"])
def test_none_composes_with_placement_and_even(tars: list[str], placement: str, even: str) -> None:
    ds = Dataset.from_source("tars", tars, daemon=None, shuffle_mode="none", placement=placement, even=even)
    contexts = slot_contexts(4, workers=2, num_nodes=2, local_world_size=1)
    per_slot = [keys(ds.iter_context(ctx)) for ctx in contexts]
    assert len({len(k) for k in per_slot}) == 1  # equal work per slot
    seen = [k for slot in per_slot for k in slot]
    assert set(seen) == set(tar_keys())  # 24 samples over 4 slots: nothing dropped or padded
    again = Dataset.from_source(
        "tars", tars, daemon=None, shuffle_mode="none", placement=placement, even=even
    )
    later = [keys(again.iter_context(ctx.with_epoch(1))) for ctx in contexts]
    assert later == per_slot  # no per-epoch shuffle


@pytest.mark.parametrize("kind", ["tars", "jsonl", "parquet"])
@pytest.mark.parametrize("bad", ["global", "random", None, 1])
def test_a_bad_shuffle_mode_names_the_allowed_values(
    kind: str, bad: object, tars: list[str], jsonl: list[str], parquet: list[str]
) -> None:
    shards = {"tars": tars, "jsonl": jsonl, "parquet": parquet}[kind]
    default = "'chunk_aware'" if kind == "parquet" else "'shard_aware'"
    with pytest.raises(ConfigError, match=f"shuffle_mode=.*{default} or 'none'"):
        Dataset.from_source(kind, shards, daemon=None, shuffle_mode=bad)


def test_each_kind_refuses_the_other_kinds_default(tars: list[str], parquet: list[str]) -> None:
    with pytest.raises(ConfigError, match="'chunk_aware' or 'none'"):
        Dataset.from_source("parquet", parquet, daemon=None, shuffle_mode="shard_aware")
    with pytest.raises(ConfigError, match="'shard_aware' or 'none'"):
        Dataset.from_source("tars", tars, daemon=None, shuffle_mode="chunk_aware")


# -- parquet: min_row_groups_per_chunk, use_threads ----------------------------------------------------------


def test_min_row_groups_per_chunk_groups_consecutive_row_groups(parquet: list[str]) -> None:
    ds = Dataset.from_source("parquet", parquet[:1], daemon=None, min_row_groups_per_chunk=2)
    chunks = [["p0_0", "p0_1", "p0_2", "p0_3"], ["p0_4", "p0_5", "p0_6", "p0_7"], ["p0_8"]]
    orders = set()
    for epoch in range(6):
        got = read(ds, "id", epoch=epoch)
        assert sorted(got) == sorted(parquet_ids(1))
        # Chunks: row groups (0, 1) = rows 0-3, (2, 3) = rows 4-7, (4,) = row 8; each read whole, in order.
        assert all(contiguous(got, chunk) for chunk in chunks)
        orders.add(tuple(got))
    assert len(orders) > 1  # the chunks are shuffled per epoch
    none = Dataset.from_source(
        "parquet", parquet[:1], daemon=None, min_row_groups_per_chunk=2, shuffle_mode="none"
    )
    slots = [read(none, "id", rank=r, world_size=3) for r in range(3)]
    assert slots == [["p0_0", "p0_1", "p0_2", "p0_3"], ["p0_4", "p0_5", "p0_6", "p0_7"], ["p0_8"]]


def test_too_few_chunks_for_the_slots_falls_back_to_row_groups(parquet: list[str]) -> None:
    # 5 row groups in chunks of 4 is 2 chunks for 4 slots: every row group is its own chunk again.
    ds = Dataset.from_source(
        "parquet", parquet[:1], daemon=None, min_row_groups_per_chunk=4, shuffle_mode="none"
    )
    slots = [read(ds, "id", rank=r, world_size=4) for r in range(4)]
    assert slots == [["p0_0", "p0_1", "p0_8"], ["p0_2", "p0_3"], ["p0_4", "p0_5"], ["p0_6", "p0_7"]]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_a_bad_min_row_groups_per_chunk_is_refused(parquet: list[str], bad: object) -> None:
    with pytest.raises(ConfigError, match=r"min_row_groups_per_chunk=.*integer >= 1"):
        Dataset.from_source("parquet", parquet, daemon=None, min_row_groups_per_chunk=bad)


def test_use_threads_reads_the_same_rows(parquet: list[str]) -> None:
    threaded = Dataset.from_source("parquet", parquet, daemon=None, use_threads=True)
    single = Dataset.from_source("parquet", parquet, daemon=None, use_threads=False)
    assert read(single, "id", seed=4) == read(threaded, "id", seed=4)
    assert single.fingerprint() == threaded.fingerprint()
    with pytest.raises(ConfigError, match="use_threads='yes': expected True or False"):
        Dataset.from_source("parquet", parquet, daemon=None, use_threads="yes")


def test_min_row_groups_per_chunk_keeps_even_and_subsets_exact(parquet: list[str]) -> None:
    ds = Dataset.from_source("parquet", parquet, daemon=None, min_row_groups_per_chunk=2, even="drop")
    slots = [read(ds, "id", rank=r, world_size=4) for r in range(4)]
    assert {len(s) for s in slots} == {18 // 4}
    assert len({i for s in slots for i in s}) == 4 * (18 // 4)
    train, val = Dataset.from_source("parquet", parquet, daemon=None, min_row_groups_per_chunk=2).split(
        [0.5, 0.5]
    )
    both = read(train, "id") + read(val, "id")
    assert sorted(both) == sorted(parquet_ids()) and read(train, "id") and read(val, "id")


# -- fingerprints and resume ----------------------------------------------------------------------------


def test_fingerprints_differ_between_modes(tars: list[str], jsonl: list[str], parquet: list[str]) -> None:
    for kind, shards, default in (
        ("tars", tars, "shard_aware"),
        ("jsonl", jsonl, "shard_aware"),
        ("parquet", parquet, "chunk_aware"),
    ):
        omitted = Dataset.from_source(kind, shards, daemon=None).fingerprint()
        assert Dataset.from_source(kind, shards, daemon=None, shuffle_mode=default).fingerprint() == omitted
        assert Dataset.from_source(kind, shards, daemon=None, shuffle_mode="none").fingerprint() != omitted
    plain = Dataset.from_source("parquet", parquet, daemon=None)
    one = Dataset.from_source("parquet", parquet, daemon=None, min_row_groups_per_chunk=1)
    two = Dataset.from_source("parquet", parquet, daemon=None, min_row_groups_per_chunk=2)
    assert plain.fingerprint() == one.fingerprint() != two.fingerprint()


def test_a_state_of_one_mode_does_not_resume_another(tars: list[str]) -> None:
    none = Dataset.from_source("tars", tars, daemon=None, shuffle_mode="none")
    it = iter(none)
    next(it)
    state = none.state_dict()
    with pytest.raises(StateError):
        Dataset.from_source("tars", tars, daemon=None).load_state_dict(state)


@pytest.mark.parametrize("mode", ["shard_aware", "none"])
def test_tars_resume_in_each_mode(tars: list[str], mode: str) -> None:
    assert_resumes(
        lambda: Dataset.from_source("tars", tars, daemon=None, shuffle_mode=mode),
        [0, 1, 4, 11, 23],
        RuntimeContext(seed=2, epoch=1),
    )


@pytest.mark.parametrize("mode", ["shard_aware", "none"])
def test_jsonl_resume_in_each_mode(jsonl: list[str], mode: str) -> None:
    assert_resumes(lambda: Dataset.from_source("jsonl", jsonl, daemon=None, shuffle_mode=mode), [0, 2, 5, 11])


@pytest.mark.parametrize("per_chunk", [1, 2])
@pytest.mark.parametrize("mode", ["chunk_aware", "none"])
def test_parquet_resume_in_each_mode(parquet: list[str], mode: str, per_chunk: int) -> None:
    assert_resumes(
        lambda: Dataset.from_source(
            "parquet", parquet, daemon=None, shuffle_mode=mode, min_row_groups_per_chunk=per_chunk
        ),
        [0, 1, 3, 4, 9, 17],
        RuntimeContext(seed=6),
    )


@pytest.mark.parametrize("kind", ["tars", "parquet"])
def test_none_resumes_with_even_and_with_resample(tars: list[str], parquet: list[str], kind: str) -> None:
    shards = tars if kind == "tars" else parquet
    ctx = RuntimeContext(rank=1, world_size=2, seed=9)
    assert_resumes(
        lambda: Dataset.from_source(kind, shards, daemon=None, shuffle_mode="none", even="pad"),
        [0, 3, 7],
        ctx,
    )
    options: dict[str, Any] = {"shuffle_mode": "none", "resample": True}
    if kind == "parquet":
        options["min_row_groups_per_chunk"] = 2

    def make() -> Dataset:
        return Dataset.from_source(kind, shards, daemon=None, context=ctx, **options)

    full = keys(itertools.islice(iter(make()), 60))  # several rounds: 12 or 9 units for 2 slots
    first = make()
    it = iter(first)
    head = keys(itertools.islice(it, 29))
    state = json.loads(json.dumps(first.state_dict()))
    second = make()
    second.load_state_dict(state)
    assert head + keys(itertools.islice(iter(second), 31)) == full


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        ("tars", "UnsupportedTarShuffleMode"),
        ("jsonl", "UnsupportedJsonlShuffleMode"),
        ("parquet", "UnsupportedParquetShuffleMode"),
    ],
)
def test_a_global_shuffle_mode_of_a_shard_kind_carries_mvps_error_code(
    tmp_path: Path, kind: str, code: str
) -> None:
    with pytest.raises(ConfigError, match=rf"^\[{code}\] shuffle_mode='global'") as raised:
        Dataset.from_source(kind, str(tmp_path / "x"), daemon=None, shuffle_mode="global")
    assert raised.value.code == code
