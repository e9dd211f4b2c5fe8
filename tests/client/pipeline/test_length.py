"""`len()` of a Dataset, a TorchLoader and a plain DataLoader over a Dataset: the items one pass yields,
where that is known before reading (`shardcache.pipeline.length`), checked against the items the passes
really yield; otherwise a TypeError that says how to get a length."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.pipelines import make_tars, write_tar
from harness.start_methods import worker_context

torch_data = pytest.importorskip("torch.utils.data")

from shardcache import Dataset, LengthUnknown, RuntimeContext, TorchLoader  # noqa: E402
from shardcache.sources.manifests import write_manifest  # noqa: E402

SHARD_SAMPLES = (7, 12, 5, 9, 11)  # 44 samples: no rank's or worker's share is a whole number of batches
TOTAL = sum(SHARD_SAMPLES)


def identity(batch: list[Any]) -> list[Any]:
    return batch


def keys_of(batch: list[dict[str, Any]]) -> list[str]:
    return [sample["__key__"] for sample in batch]


class Pairs:
    """An assembler: its output count depends on the data."""

    def __init__(self, context: RuntimeContext) -> None:
        self.held: list[object] = []

    def push(self, sample: object) -> list[object]:
        self.held.append(sample)
        return []

    def finish(self, *, drop_last: bool = False) -> list[object]:
        return self.held


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tar shards of unequal sizes and their manifest (sample counts): the folder."""
    root = tmp_path_factory.mktemp("length")
    for s, count in enumerate(SHARD_SAMPLES):
        members = [(f"s{s}_{i}.json", json.dumps({"i": i}).encode()) for i in range(count)]
        write_tar(root / f"shard_{s}.tar", members)
    write_manifest(str(root / "shard_*.tar"), root / "data.manifest.jsonl")
    return root


def counted(shards: Path, **options: Any) -> Dataset:
    """The dataset over the manifest: every shard's count known."""
    return Dataset.from_source("tars", str(shards / "data.manifest.jsonl"), daemon=None, **options)


def rank(shards: Path, r: int, world: int, **options: Any) -> Dataset:
    return counted(shards, context=RuntimeContext(rank=r, world_size=world, seed=3), **options)


def test_len_of_a_dataset_is_the_samples_one_pass_yields(shards: Path) -> None:
    ds = counted(shards)
    assert len(ds) == TOTAL == sum(1 for _ in ds)


@pytest.mark.parametrize("even", ["drop", "pad"])
def test_len_of_each_rank_is_its_share_of_the_epoch(shards: Path, even: str) -> None:
    for r in range(3):
        ds = rank(shards, r, 3, even=even)
        assert len(ds) == sum(1 for _ in ds) == (TOTAL // 3 if even == "drop" else -(-TOTAL // 3))


@pytest.mark.parametrize("drop_last", [False, True])
def test_len_after_a_batch_stage_counts_batches(shards: Path, drop_last: bool) -> None:
    ds = rank(shards, 1, 2, even="drop").map(identity).batch(4, drop_last=drop_last)
    assert len(ds) == sum(1 for _ in ds) == (22 // 4 if drop_last else 6)


def test_len_of_a_torchloader_is_its_steps_per_rank(shards: Path, start_method: str) -> None:
    for r in range(2):
        ds = rank(shards, r, 2, even="drop")
        loader = TorchLoader(
            ds, batch_size=4, num_workers=2, multiprocessing_context=worker_context(start_method)
        )
        # 22 samples per rank, 11 per worker: each worker makes 3 batches, the last one short.
        assert len(loader) == sum(1 for _ in loader) == 6
        loader.close()


def test_len_of_a_torchloader_counts_its_loader_side_stages(shards: Path) -> None:
    ds = rank(shards, 0, 2, even="pad")
    loader = TorchLoader(ds, batch_size=3, num_workers=2, collate_fn=identity).unbatch().shuffle(8).batch(5)
    assert len(loader) == sum(1 for _ in loader) == 5  # 22 samples, unbatched and batched by 5
    loader.close()


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_plain_dataloader_over_a_dataset_has_the_length_of_the_batches_its_workers_yield(
    shards: Path, drop_last: bool
) -> None:
    # torch turns the dataset's length into batches as ceil(or floor)(length / batch_size), as if one
    # stream were batched; each worker batches its own share, so the dataset answers it accordingly.
    ds = rank(shards, 0, 2, even="drop")
    loader = torch_data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=identity, drop_last=drop_last)
    assert len(loader) == sum(1 for _ in loader) == (4 if drop_last else 6)


def test_len_is_the_same_in_every_epoch(shards: Path) -> None:
    ds = rank(shards, 1, 2, even="drop")
    loader = TorchLoader(ds, batch_size=4, num_workers=2)
    lengths = [len(loader)]
    steps = []
    for _ in range(3):
        steps.append(sum(1 for _ in loader))
        lengths.append(len(loader))
    assert steps == [6, 6, 6] and lengths == [6, 6, 6, 6]
    loader.close()


def test_a_pass_that_yielded_its_length_has_ended(shards: Path) -> None:
    # A framework that knows the length (Lightning) stops after that many items and never asks for one
    # more: the pass has ended all the same, so its state resumes the next epoch, not an empty one.
    ds = rank(shards, 0, 2, even="drop")
    loader = TorchLoader(ds, batch_size=4, num_workers=2, collate_fn=keys_of)
    length = len(loader)
    iterator = iter(loader)
    first = [next(iterator) for _ in range(length)]
    state = loader.state_dict()
    assert state["state"] is None and state["end"]["epoch"] == 0
    resumed = TorchLoader(rank(shards, 0, 2, even="drop"), batch_size=4, num_workers=2, collate_fn=keys_of)
    resumed.load_state_dict(state)
    next_epoch = [batch for batch in resumed]
    assert len(next_epoch) == length and next_epoch != first
    assert resumed.state_dict()["end"]["epoch"] == 1
    loader.close()
    resumed.close()


def test_a_resumed_pass_ends_at_the_same_item_as_the_uninterrupted_one(shards: Path) -> None:
    loader = TorchLoader(rank(shards, 1, 2, even="drop"), batch_size=4, num_workers=2)
    length = len(loader)
    iterator = iter(loader)
    next(iterator), next(iterator)
    state = loader.state_dict()
    loader.close()
    resumed = TorchLoader(rank(shards, 1, 2, even="drop"), batch_size=4, num_workers=2)
    assert len(resumed) == length
    resumed.load_state_dict(state)
    rest = iter(resumed)
    taken = [next(rest) for _ in range(length - 2)]
    assert len(taken) == length - 2 and resumed.state_dict()["state"] is None
    resumed.close()


def test_len_without_known_counts_is_a_type_error_naming_the_manifest(shards: Path, tmp_path: Path) -> None:
    ds = Dataset.from_source("tars", make_tars(tmp_path / "tars", 3, 4), daemon=None)
    with pytest.raises(TypeError, match="manifest with num_samples") as raised:
        len(ds)
    assert isinstance(raised.value, LengthUnknown) and "count_samples" in str(raised.value)


def test_len_is_known_once_the_samples_were_counted(tmp_path: Path) -> None:
    ds = Dataset.from_source("tars", make_tars(tmp_path / "tars", 3, 4), daemon=None)
    ds.count_samples(always=True)
    assert len(ds) == 12


def test_len_without_even_on_several_ranks_is_a_type_error_naming_even(shards: Path) -> None:
    with pytest.raises(LengthUnknown, match="even='drop'"):
        len(rank(shards, 0, 2, even=None))


def test_len_of_workers_batching_whole_shards_without_even_is_a_type_error(shards: Path) -> None:
    # One rank reads every sample, but how its workers split them (and so their batches) changes each epoch.
    with pytest.raises(LengthUnknown, match="DataLoader workers read whole shards"):
        len(TorchLoader(counted(shards), batch_size=4, num_workers=2))
    assert len(TorchLoader(counted(shards), num_workers=2)) == TOTAL  # samples alone: the rank's total


def test_len_through_an_assembler_is_a_type_error_naming_the_stage(shards: Path) -> None:
    with pytest.raises(LengthUnknown, match=r"\.assemble"):
        len(counted(shards).assemble(Pairs))


def test_a_resampled_source_has_no_length(shards: Path) -> None:
    with pytest.raises(LengthUnknown, match="resample"):
        len(counted(shards, resample=True))


def test_a_mix_has_no_length(shards: Path) -> None:
    with pytest.raises(LengthUnknown, match="mix"):
        len(Dataset.mix({"a": counted(shards), "b": counted(shards)}, seed=0))


def test_a_dataset_or_loader_without_a_length_is_still_true(tmp_path: Path) -> None:
    ds = Dataset.from_source("tars", make_tars(tmp_path / "tars", 2, 2), daemon=None)
    assert bool(ds) and bool(TorchLoader(ds, batch_size=2))


def test_parquet_row_counts_come_from_the_footers(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    for s, rows in enumerate((10, 7)):
        pq.write_table(pa.table({"i": list(range(rows))}), tmp_path / f"part_{s}.parquet", row_group_size=4)
    ds = Dataset.from_source("parquet", str(tmp_path / "*.parquet"), daemon=None)
    assert len(ds) == sum(1 for _ in ds) == 17


@pytest.mark.parametrize("even", ["drop", "pad"])
def test_lance_row_counts_come_from_the_dataset(tmp_path: Path, even: str) -> None:
    lance = pytest.importorskip("lance")
    pa = pytest.importorskip("pyarrow")
    lance.write_dataset(pa.table({"i": list(range(37))}), str(tmp_path / "rows.lance"), max_rows_per_file=10)
    for r in range(3):
        ctx = RuntimeContext(rank=r, world_size=3, seed=1)
        ds = Dataset.from_source("lance", str(tmp_path / "rows.lance"), context=ctx, even=even)
        assert len(ds) == sum(1 for _ in ds) == (12 if even == "drop" else 13)
