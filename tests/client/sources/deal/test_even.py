"""Equal work per rank with explicit contexts (no torchrun): `even="drop"|"pad"` over unequal shards.

Every rank must read the same number of samples, and through a TorchLoader with workers yield the same
number of worker-side batches, so a plain DDP loop never waits on a rank that has run out. "drop" reads each
sample at most once and leaves out fewer than world_size; "pad" reads each at least once and repeats fewer
than world_size, marked `__pad__: True`. Tars and jsonl get their counts from a manifest or a counting pass,
parquet from its row-group metadata. test_ddp_torchrun.py runs the same under real torchrun.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.pipelines import assert_resumes, slot_contexts, write_tar
from harness.start_methods import loader_workers
from shardcache import Dataset, RuntimeContext, TorchLoader
from shardcache.sources.manifests import write_manifest

TAR_SAMPLES = (23, 7, 31, 12, 5, 19, 28)  # 125 samples in 7 shards of unequal size
JSONL_LINES = (17, 4, 26, 9, 11)
PARQUET_ROW_GROUPS = ((10, 3, 7), (12,), (5, 5, 1, 9))  # rows per row group, per file
COUNTING_LOGGER = "shardcache.sources.deal.counting"


class Files:
    """Unequal shards of each kind, written once for the module."""

    def __init__(self, root: Path) -> None:
        (root / "tars").mkdir()
        for s, count in enumerate(TAR_SAMPLES):
            members = []
            for i in range(count):
                key = f"s{s:03d}_{i:04d}"
                members += [(f"{key}.txt", f"{s}-{i}".encode()), (f"{key}.json", b"{}")]
            write_tar(root / "tars" / f"shard_{s:03d}.tar", members)
        self.tars = str(root / "tars" / "shard_{000..006}.tar")
        self.tar_keys = [f"s{s:03d}_{i:04d}" for s, n in enumerate(TAR_SAMPLES) for i in range(n)]
        self.tar_manifest = str(root / "tars.manifest.jsonl")
        write_manifest(self.tars, self.tar_manifest)
        (root / "jsonl").mkdir()
        for f, count in enumerate(JSONL_LINES):
            lines = "".join(json.dumps({"id": f"j{f}_{i}"}) + "\n" for i in range(count))
            (root / "jsonl" / f"part_{f}.jsonl").write_text(lines)
        self.jsonl = str(root / "jsonl" / "part_{0..4}.jsonl")
        self.jsonl_ids = [f"j{f}_{i}" for f, n in enumerate(JSONL_LINES) for i in range(n)]
        self.jsonl_manifest = str(root / "jsonl.manifest.jsonl")
        write_manifest(self.jsonl, self.jsonl_manifest)
        (root / "parquet").mkdir()
        self.parquet_ids = []
        for f, groups in enumerate(PARQUET_ROW_GROUPS):
            ids = [f"p{f}_{i}" for i in range(sum(groups))]
            self.parquet_ids += ids
            with pq.ParquetWriter(
                root / "parquet" / f"train_{f}.parquet", pa.schema([("id", pa.string())])
            ) as w:
                start = 0
                for size in groups:
                    w.write_table(pa.table({"id": ids[start : start + size]}))
                    start += size
        self.parquet = str(root / "parquet" / "train_{0..2}.parquet")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    return Files(tmp_path_factory.mktemp("even"))


def tars(f: Files, even: str | None, context: RuntimeContext | None = None) -> Dataset:
    return Dataset.from_source("tars", f.tars, daemon=None, even=even, context=context)


Ranks = list[list[tuple[str, bool]]]


def per_rank(ds: Dataset, world_size: int, workers: int, key: str = "__key__", **kw: Any) -> Ranks:
    """Every rank's samples as (key, marked pad), reading each of its worker slots in turn."""
    ranks: Ranks = [[] for _ in range(world_size)]
    for ctx in slot_contexts(world_size * workers, workers, seed=5, epoch=2, **kw):
        ranks[ctx.rank] += [(str(s[key]), bool(s.get("__pad__", False))) for s in ds.iter_context(ctx)]
    return ranks


def check_drop(ranks: Ranks, universe: list[str]) -> None:
    sizes = [len(r) for r in ranks]
    assert sizes == [sizes[0]] * len(ranks), f"samples per rank {sizes}"
    read = [key for r in ranks for key, pad in r]
    assert not any(pad for r in ranks for _, pad in r)
    assert len(read) == len(set(read)) and set(read) <= set(universe), "drop read a sample twice"
    assert len(universe) - len(read) < len(ranks), f"drop left out {len(universe) - len(read)}"


def check_pad(ranks: Ranks, universe: list[str]) -> None:
    sizes = [len(r) for r in ranks]
    assert sizes == [sizes[0]] * len(ranks), f"samples per rank {sizes}"
    real = [key for r in ranks for key, pad in r if not pad]
    repeats = [key for r in ranks for key, pad in r if pad]
    assert sorted(real) == sorted(universe), "pad must read every sample once, unmarked"
    assert len(repeats) < len(ranks) and set(repeats) <= set(universe)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_drop_gives_every_rank_the_same_samples_each_read_at_most_once(
    files: Files, world_size: int, workers: int
) -> None:
    check_drop(per_rank(tars(files, "drop"), world_size, workers), files.tar_keys)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_pad_gives_every_rank_the_same_samples_with_repeats_marked(
    files: Files, world_size: int, workers: int
) -> None:
    check_pad(per_rank(tars(files, "pad"), world_size, workers), files.tar_keys)


def test_pad_marks_only_in_pad_mode(files: Files) -> None:
    ctx = RuntimeContext(rank=0, world_size=3)
    assert all(s["__pad__"] in (True, False) for s in tars(files, "pad").iter_context(ctx))
    assert not any("__pad__" in s for s in tars(files, "drop").iter_context(ctx))
    assert not any("__pad__" in s for s in tars(files, None).iter_context(ctx))


def test_without_even_ranks_read_whole_shards_of_different_sizes(files: Files) -> None:
    sizes = [len(r) for r in per_rank(tars(files, None), 2, 2)]
    assert sum(sizes) == len(files.tar_keys) and sizes[0] != sizes[1]


def test_the_worker_split_is_the_same_on_every_rank(files: Files) -> None:
    ds = tars(files, "drop")
    per_slot = {(c.rank, c.worker_id): sum(1 for _ in ds.iter_context(c)) for c in slot_contexts(6, 2)}
    assert [per_slot[(r, 0)] for r in range(3)] == [per_slot[(0, 0)]] * 3
    assert [per_slot[(r, 1)] for r in range(3)] == [per_slot[(0, 1)]] * 3


@pytest.mark.parametrize("even", ["drop", "pad"])
@pytest.mark.parametrize(("nodes", "per_node", "workers"), [(2, 2, 2), (3, 1, 2), (2, 3, 1)])
def test_even_composes_with_node_placement(
    tmp_path: Path, even: str, nodes: int, per_node: int, workers: int
) -> None:
    counts = [6, 18, 17, 4, 0, 29, 19, 15, 20, 18, 2, 19, 0]  # 167 samples, two empty shards
    for s, count in enumerate(counts):
        write_tar(tmp_path / f"n_{s:02d}.tar", [(f"n{s:02d}_{i:03d}.txt", b"v") for i in range(count)])
    universe = [f"n{s:02d}_{i:03d}" for s, count in enumerate(counts) for i in range(count)]
    ds = Dataset.from_source("tars", str(tmp_path / "n_{00..12}.tar"), daemon=None, even=even)
    ranks = per_rank(ds, nodes * per_node, workers, local_world_size=per_node)
    (check_drop if even == "drop" else check_pad)(ranks, universe)


def keep_list(batch: list[Any]) -> list[Any]:
    return batch


def loader(
    f: Files, even: str | None, rank: int, world_size: int, method: str, kind: str = "tars"
) -> TorchLoader:
    ctx = RuntimeContext(rank=rank, world_size=world_size, seed=5)
    shards = {"tars": f.tars, "jsonl": f.jsonl, "parquet": f.parquet}[kind]
    ds = Dataset.from_source(kind, shards, daemon=None, even=even, context=ctx)
    return TorchLoader(ds, num_workers=2, batch_size=4, collate_fn=keep_list, **loader_workers(method))


@pytest.mark.parametrize("kind", ["tars", "jsonl", "parquet"])
@pytest.mark.parametrize("even", ["drop", "pad"])
def test_torch_loader_workers_yield_the_same_batches_on_every_rank(
    files: Files, even: str, kind: str, loader_mode: str
) -> None:
    pytest.importorskip("torch.utils.data")
    key, universe = {
        "tars": ("__key__", files.tar_keys),
        "jsonl": ("id", files.jsonl_ids),
        "parquet": ("id", files.parquet_ids),
    }[kind]
    batches = [list(loader(files, even, rank, 3, loader_mode, kind)) for rank in range(3)]
    counts = [len(b) for b in batches]
    assert counts == [counts[0]] * 3, f"batches per rank {counts}"
    ranks = [[(str(s[key]), bool(s.get("__pad__", False))) for b in rank for s in b] for rank in batches]
    (check_drop if even == "drop" else check_pad)(ranks, universe)


@pytest.mark.parametrize("even", ["drop", "pad"])
def test_fewer_samples_than_slots_still_give_every_rank_the_same_count(tmp_path: Path, even: str) -> None:
    for s in range(3):
        write_tar(tmp_path / f"tiny_{s}.tar", [(f"t{s}.txt", b"x")])
    ds = Dataset.from_source("tars", str(tmp_path / "tiny_{0..2}.tar"), daemon=None, even=even)
    ranks = per_rank(ds, 4, 2)
    (check_drop if even == "drop" else check_pad)(ranks, ["t0", "t1", "t2"])


def counted(caplog: pytest.LogCaptureFixture) -> bool:
    return any(r.name == COUNTING_LOGGER and "counting the samples" in r.getMessage() for r in caplog.records)


def test_tars_without_counts_are_counted_once_before_the_first_sample(
    files: Files, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=COUNTING_LOGGER)
    ds = tars(files, "drop", RuntimeContext(rank=1, world_size=3))
    assert len(list(ds)) == len(files.tar_keys) // 3
    assert counted(caplog)


def test_a_tar_manifest_with_num_samples_skips_the_counting_pass(
    files: Files, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=COUNTING_LOGGER)
    ds = Dataset.from_source("tars", files.tar_manifest, daemon=None, even="drop")
    check_drop(per_rank(ds, 3, 2), files.tar_keys)
    ds.count_samples(RuntimeContext(rank=0, world_size=3))
    assert not counted(caplog)


@pytest.mark.parametrize("even", ["drop", "pad"])
def test_jsonl_counted_by_a_counting_pass(files: Files, even: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=COUNTING_LOGGER)
    ds = Dataset.from_source("jsonl", files.jsonl, daemon=None, even=even)
    ds.count_samples(RuntimeContext(rank=0, world_size=3))
    assert counted(caplog)
    ranks = per_rank(ds, 3, 2, key="id")
    (check_drop if even == "drop" else check_pad)(ranks, files.jsonl_ids)


@pytest.mark.parametrize("even", ["drop", "pad"])
def test_jsonl_counted_from_a_manifest_without_a_counting_pass(
    files: Files, even: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=COUNTING_LOGGER)
    ds = Dataset.from_source("jsonl", files.jsonl_manifest, daemon=None, even=even)
    ds.count_samples(RuntimeContext(rank=0, world_size=3))
    ranks = per_rank(ds, 3, 2, key="id")
    (check_drop if even == "drop" else check_pad)(ranks, files.jsonl_ids)
    assert not counted(caplog)


@pytest.mark.parametrize("even", ["drop", "pad"])
def test_parquet_counted_from_row_group_metadata(
    files: Files, even: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=COUNTING_LOGGER)
    ds = Dataset.from_source("parquet", files.parquet, daemon=None, even=even)
    ds.count_samples(RuntimeContext(rank=0, world_size=4))
    ranks = per_rank(ds, 4, 2, key="id")
    (check_drop if even == "drop" else check_pad)(ranks, files.parquet_ids)
    assert not counted(caplog)


MODES: list[str | None] = ["drop", "pad", None]
POINTS = [0, 1, 4, 9, 10_000]


@pytest.mark.parametrize("even", MODES)
def test_every_mode_resumes_exactly(files: Files, even: str | None) -> None:
    assert_resumes(lambda: tars(files, even), POINTS, RuntimeContext(rank=1, world_size=3, seed=5, epoch=1))


@pytest.mark.parametrize("even", MODES)
def test_every_mode_resumes_exactly_in_a_worker_slot(files: Files, even: str | None) -> None:
    ctx = RuntimeContext(rank=2, world_size=3, worker_id=1, num_workers=2, seed=5, epoch=1)
    assert_resumes(lambda: tars(files, even).map(keep_list), POINTS, ctx)


@pytest.mark.parametrize("even", MODES)
def test_every_mode_resumes_exactly_through_torch_loader_workers(
    files: Files, even: str | None, loader_mode: str
) -> None:
    pytest.importorskip("torch.utils.data")
    make: Callable[[], TorchLoader] = lambda: loader(files, even, 1, 3, loader_mode)  # noqa: E731
    assert_resumes(make, [1, 10_000])
