"""`shardcache_client_samples_total` counts samples, not items; the default job name is recognisable."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from harness.daemon_api import client_samples
from harness.shards import ShardSet
from shardcache import Dataset
from shardcache.daemon_access.item_counts import count_items
from shardcache.daemon_access.telemetry import Telemetry
from shardcache.jobs import default_job, script_name

TOTAL = 4 * 8  # local_shards: four shards of eight samples


def nested(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A collate whose first column is itself a dict of columns (as default_collate makes of a dict field)."""
    return {
        "meta": {"key": [s["__key__"] for s in samples]},
        "image": np.stack([np.frombuffer(s["bin"], dtype=np.uint8)[:16].reshape(4, 4) for s in samples]),
    }


def with_image(sample: dict[str, Any]) -> dict[str, Any]:
    """One sample whose first field is an image array (its leading dimension is not a sample count)."""
    return {"image": np.zeros((24, 24, 3), dtype=np.uint8), "key": sample["__key__"]}


def reported_samples(daemon: Any, job: str, expected: float) -> float | None:
    """The daemon's samples_total for (job, slot 0) once it reaches `expected` (polled with a deadline)."""
    deadline = time.monotonic() + 20
    while True:
        value = client_samples(daemon).get(("shardcache_client_samples_total", job, "0"))
        if value == expected or time.monotonic() > deadline:
            return value
        time.sleep(0.05)  # the last report leaves from the background thread


@pytest.mark.parametrize(
    ("batch", "samples"),
    [
        ([{"a": 1}] * 5, 5),
        ((np.zeros((7, 3)), np.zeros(7)), 7),
        (np.zeros((6, 2)), 6),
        ({"__key__": ["a", "b", "c"], "x": np.zeros((3, 2))}, 3),
        ({"name": "batch", "x": np.zeros((4, 2))}, 4),
        ({"meta": {"id": np.arange(9)}, "x": np.zeros((9, 2))}, 9),
        ([], 0),
        (object(), 1),
    ],
)
def test_count_items_counts_the_samples_of_a_batch(batch: Any, samples: int) -> None:
    assert count_items(batch) == samples


def test_a_torch_loader_counts_samples_of_batches_whose_first_column_is_a_dict(  # type: ignore[no-untyped-def]
    local_shards: ShardSet, daemon_factory, loader_mode: str
) -> None:
    pytest.importorskip("torch")
    from harness.start_methods import loader_workers
    from shardcache import TorchLoader

    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=str(daemon.socket), job="nested")
    loader = TorchLoader(
        ds,
        num_workers=2,
        batch_size=3,
        collate_fn=nested,
        **loader_workers(loader_mode),
    )
    it = iter(loader)
    assert sum(len(batch["meta"]["key"]) for batch in it) == TOTAL
    it.close()
    assert reported_samples(daemon, "nested", TOTAL) == TOTAL


def test_a_torch_loader_without_batches_counts_one_sample_per_item(  # type: ignore[no-untyped-def]
    local_shards: ShardSet, daemon_factory, loader_mode: str
) -> None:
    pytest.importorskip("torch")
    from harness.start_methods import loader_workers
    from shardcache import TorchLoader

    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=str(daemon.socket), job="single")
    loader = TorchLoader(ds.map(with_image), num_workers=1, **loader_workers(loader_mode))
    it = iter(loader)
    assert len(list(it)) == TOTAL
    it.close()
    assert reported_samples(daemon, "single", TOTAL) == TOTAL


def test_a_dataset_batched_in_the_trainer_counts_samples(  # type: ignore[no-untyped-def]
    local_shards: ShardSet, daemon_factory
) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=str(daemon.socket), job="in-trainer")
    it = iter(ds.batch(5, collate_fn=nested))
    assert len(list(it)) == 7  # 32 samples in batches of 5
    it.close()  # type: ignore[attr-defined]
    assert reported_samples(daemon, "in-trainer", TOTAL) == TOTAL


def test_the_default_job_is_the_script_name_and_a_short_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHARDCACHE_JOB", raising=False)
    monkeypatch.setattr("sys.argv", ["/home/me/experiments/train_resnet.py", "--lr", "0.1"])
    job = default_job(["s3://bucket/a.tar", "s3://bucket/b.tar"], seed=0)
    assert job.startswith("train_resnet-") and len(job) == len("train_resnet-") + 8
    assert job == default_job(["s3://bucket/a.tar", "s3://bucket/b.tar"], seed=0)
    assert job != default_job(["s3://bucket/a.tar", "s3://bucket/b.tar"], seed=1)


def test_shardcache_job_names_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDCACHE_JOB", "resnet-run-7")
    assert default_job(["s3://bucket/a.tar"], seed=0) == "resnet-run-7"
    assert Telemetry(interval_s=0).job == "resnet-run-7"


@pytest.mark.parametrize(
    ("argv0", "name"),
    [
        ("train.py", "train"),
        ("/srv/pkg/__main__.py", "pkg"),
        ("-c", "python"),
        ("", "python"),
        ("my run!.py", "my-run"),
    ],
)
def test_script_name_is_a_short_label(argv0: str, name: str) -> None:
    assert script_name(argv0) == name


def test_a_telemetry_without_a_job_is_named_after_the_script(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHARDCACHE_JOB", raising=False)
    monkeypatch.setattr("sys.argv", ["finetune.py"])
    assert Telemetry(interval_s=0).job == "finetune"
