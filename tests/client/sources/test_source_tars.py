"""The "tars" source: samples, slots, epochs, resample, sidecars, corrupt shards (seed README, TAR)."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest

from harness.pipelines import keys, make_tars, slot_contexts, write_tar
from shardcache import Dataset, RuntimeContext
from shardcache.errors import ConfigError, CorruptShardError


@pytest.fixture
def tars(tmp_path: Path) -> list[str]:
    return make_tars(tmp_path / "tars", count=8, samples=5)


def test_samples_carry_fields_as_bytes_and_metadata(tars: list[str]) -> None:
    sample = next(iter(Dataset.from_source("tars", tars[:1], daemon=None)))
    assert sample["__key__"] == "s000_0000"
    assert sample["__shard__"] == tars[0]
    assert sample["__index_in_shard__"] == 0
    assert sample["txt"] == b"shard-0-0"
    assert isinstance(sample["json"], bytes)


def test_tar_is_an_alias_of_tars(tars: list[str]) -> None:
    assert keys(Dataset.from_source("tar", tars, daemon=None)) == keys(
        Dataset.from_source("tars", tars, daemon=None)
    )


@pytest.mark.parametrize("total", [1, 2, 3, 8])
def test_every_sample_once_per_epoch_across_slots(tars: list[str], total: int) -> None:
    ds = Dataset.from_source("tars", tars, daemon=None)
    seen = Counter(k for ctx in slot_contexts(total) for k in keys(ds.iter_context(ctx)))
    assert len(seen) == 40
    assert set(seen.values()) == {1}


def test_slots_of_ranks_times_workers_partition_the_data(tars: list[str]) -> None:
    ds = Dataset.from_source("tars", tars, daemon=None)
    seen = Counter(k for ctx in slot_contexts(4, workers=2) for k in keys(ds.iter_context(ctx)))
    assert len(seen) == 40 and set(seen.values()) == {1}


def test_fewer_shards_than_slots_is_a_clear_error(tars: list[str]) -> None:
    ds = Dataset.from_source("tars", tars[:2], daemon=None)
    with pytest.raises(ConfigError, match="2 tar shards cannot feed 3 slots"):
        list(ds.iter_context(RuntimeContext(rank=0, world_size=3)))


def test_shard_order_is_deterministic_per_epoch_and_differs_across_epochs(tars: list[str]) -> None:
    def order(epoch: int) -> list[str]:
        ds = Dataset.from_source("tars", tars, daemon=None)
        ds.set_epoch(epoch)
        return [k for k in keys(ds) if k.endswith("_0000")]

    assert order(0) == order(0)
    assert order(0) != order(1)
    assert sorted(order(0)) == sorted(order(1))


def test_seed_changes_the_shard_order(tars: list[str]) -> None:
    ds = Dataset.from_source("tars", tars, daemon=None)
    a = keys(ds.iter_context(RuntimeContext(seed=1)))
    b = keys(ds.iter_context(RuntimeContext(seed=2)))
    assert a != b and sorted(a) == sorted(b)


def test_resample_cycles_forever_in_reshuffled_rounds(tars: list[str]) -> None:
    ds = Dataset.from_source("tars", tars[:2], daemon=None, resample=True)
    it = iter(ds)
    taken = [next(it)["__key__"] for _ in range(50)]
    assert Counter(taken).most_common(1)[0][1] >= 2  # samples repeat: more than one round was read
    assert len(set(taken)) == 10


def test_key_dot_level_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_tar(tmp_path / "t.tar", [("a.x.jpg", b"1"), ("a.x.txt", b"2"), ("a.y.jpg", b"3")])
    monkeypatch.setenv("LOADER_TAR_KEY_DOT_LEVEL", "2")
    assert [(s["__key__"], sorted(s)) for s in Dataset.from_source("tars", str(path), daemon=None)] == [
        ("a.x", ["__index_in_shard__", "__key__", "__shard__", "jpg", "txt"]),
        ("a.y", ["__index_in_shard__", "__key__", "__shard__", "jpg"]),
    ]


def test_sidecars_are_zipped_by_key(tmp_path: Path) -> None:
    images = make_tars(tmp_path / "images", 2, 3)
    depth_dir = tmp_path / "depth"
    depth_dir.mkdir()
    for s in range(2):
        write_tar(
            depth_dir / f"shard_{s:06d}.tar", [(f"s{s:03d}_{i:04d}.depth", b"d%d" % i) for i in range(3)]
        )
    ds = Dataset.from_source(
        "tars", images, daemon=None, sidecars=[("depth", lambda p: p.replace("/images/", "/depth/"))]
    )
    samples = list(ds)
    assert len(samples) == 6
    assert all(s["depth"] == b"d%d" % s["__index_in_shard__"] for s in samples)
    assert all("txt" in s for s in samples)


def test_sidecar_with_other_keys_is_refused(tmp_path: Path) -> None:
    images = make_tars(tmp_path / "images", 1, 2)
    (tmp_path / "depth").mkdir()
    write_tar(tmp_path / "depth" / "shard_000000.tar", [("other.depth", b"1"), ("s000_0001.depth", b"2")])
    ds = Dataset.from_source(
        "tars", images, daemon=None, sidecars=[("depth", lambda p: p.replace("images", "depth"))]
    )
    with pytest.raises(ConfigError, match="has key 'other'"):
        list(ds)


def test_sidecar_with_fewer_samples_is_refused(tmp_path: Path) -> None:
    images = make_tars(tmp_path / "images", 1, 2)
    (tmp_path / "depth").mkdir()
    write_tar(tmp_path / "depth" / "shard_000000.tar", [("s000_0000.depth", b"1")])
    ds = Dataset.from_source(
        "tars", images, daemon=None, sidecars=[("depth", lambda p: p.replace("images", "depth"))]
    )
    with pytest.raises(ConfigError, match="different numbers of samples"):
        list(ds)


def _truncate(path: str, keep: int) -> None:
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[:keep])


def test_truncated_shard_raises_naming_shard_and_member(tars: list[str]) -> None:
    _truncate(tars[0], 2600)
    with pytest.raises(CorruptShardError, match="shard_000000.tar") as err:
        list(Dataset.from_source("tars", tars[:1], daemon=None))
    assert err.value.member is not None


def test_on_corrupt_skip_drops_the_rest_of_the_shard_and_logs_once(
    tars: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    _truncate(tars[0], 3 * 2048 + 600)  # inside the fourth sample
    ds = Dataset.from_source("tars", tars[:2], daemon=None, on_corrupt="skip")
    with caplog.at_level(logging.WARNING, logger="shardcache"):
        got = keys(ds)
    assert [k for k in got if k.startswith("s001")] == [f"s001_{i:04d}" for i in range(5)]
    assert 0 < len([k for k in got if k.startswith("s000")]) < 5
    assert len([r for r in caplog.records if "corrupt shard" in r.getMessage()]) == 1
    assert ds.state_dict()["end"]["pipeline"]["kind"] == "tars"  # the pass ended: its position is "end"


def test_resume_with_resample_continues_the_rounds(tars: list[str]) -> None:
    def make() -> Dataset:
        return Dataset.from_source("tars", tars[:2], daemon=None, resample=True).batch(3)

    full = make()
    it = iter(full)
    expected = [next(it) for _ in range(12)]
    ds = make()
    it = iter(ds)
    head = [next(it) for _ in range(7)]
    resumed = make()
    resumed.load_state_dict(ds.state_dict())
    it = iter(resumed)
    assert head + [next(it) for _ in range(5)] == expected
