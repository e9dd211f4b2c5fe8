"""A source's shard list keeps its URLs as one buffer (`shardcache.shards.ShardTuple`): what identifies the
dataset is hashed from it, the same bytes as before, and a forked DataLoader worker never walks the refs."""

from __future__ import annotations

import hashlib
import multiprocessing
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from harness.pipelines import make_tars
from shardcache import Dataset, RuntimeContext
from shardcache.jobs import default_job
from shardcache.resume.check import short_descriptions, spec_parts
from shardcache.shards import ShardRef, ShardTuple
from shardcache.sources.deal.schedule import source_job

torch_data = pytest.importorskip("torch.utils.data")


@dataclass(frozen=True)
class CountedRef(ShardRef):
    """A shard reference that counts, in memory shared with forked workers, every read of its `url`."""

    reads: ClassVar[Any] = None

    def __getattribute__(self, name: str) -> Any:
        if name == "url":
            counter = type(self).reads
            with counter.get_lock():
                counter.value += 1
        return super().__getattribute__(name)


def identity(sample: dict[str, Any]) -> dict[str, Any]:
    return sample


@pytest.fixture
def tars(tmp_path: Path) -> list[str]:
    return make_tars(tmp_path / "tars", count=64, samples=2)


def test_a_forked_dataloader_worker_reads_the_urls_of_its_share_only(tars: list[str]) -> None:
    CountedRef.reads = multiprocessing.get_context("fork").Value("q", 0)
    # 16 ranks of one worker each: this worker's share is 4 shards of the 64.
    ctx = RuntimeContext(rank=3, world_size=16, seed=0)
    ds = Dataset.from_source("tars", [CountedRef(url) for url in tars], daemon=None, context=ctx)
    ds = ds.map(identity)
    CountedRef.reads.value = 0  # what building the dataset read (in this process) does not count
    loader = torch_data.DataLoader(
        ds, num_workers=1, batch_size=None, multiprocessing_context=multiprocessing.get_context("fork")
    )
    samples = iter(loader)
    next(samples)
    del samples
    # The fingerprint, the resume state's description and the job id come from the URL buffer made when
    # the dataset was built; before it, the worker walked all 64 refs three times.
    assert CountedRef.reads.value < len(tars)


def test_the_fingerprint_hashes_the_description(tars: list[str]) -> None:
    ds = Dataset.from_source("tars", tars, daemon=None, resample=True).map(identity).shuffle(8)
    described = ds._spec.describe()
    assert ds.fingerprint() == hashlib.sha256(described.encode()).hexdigest()[:32]


def test_the_state_description_is_the_short_description(tars: list[str]) -> None:
    ds = Dataset.from_source("tars", tars, daemon=None).map(identity)
    stages = [stage.describe() for stage in ds.stages]
    assert spec_parts(ds._spec) == short_descriptions(ds.source.describe(), stages)


def test_a_mix_keeps_its_fingerprint_and_description(tars: list[str]) -> None:
    members = {
        "a": Dataset.from_source("tars", tars[:40], daemon=None),
        "b": Dataset.from_source("tars", tars[40:], daemon=None),
    }
    ds = Dataset.mix(members, weights={"a": 1.0, "b": 3.0})
    described = ds._spec.describe()
    assert ds.fingerprint() == hashlib.sha256(described.encode()).hexdigest()[:32]
    assert spec_parts(ds._spec) == short_descriptions(ds.source.describe(), [])


def test_the_job_id_hashes_the_urls_and_seed(tars: list[str]) -> None:
    ds = Dataset.from_source("tars", tars, daemon=None)
    assert source_job(None, ds.source.shards, 7) == default_job(tars, 7)


def test_a_pickled_shard_list_is_the_same_list() -> None:
    shards = ShardTuple([ShardRef("a.tar"), ShardRef("b.tar", size=3)])
    assert shards.urls_blob == b"a.tar\nb.tar"
    copy = pickle.loads(pickle.dumps(shards))
    assert isinstance(copy, ShardTuple) and copy == shards and copy.urls_blob == shards.urls_blob
