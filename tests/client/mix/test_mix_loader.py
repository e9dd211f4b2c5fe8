"""A mix read by real torch DataLoader workers: each worker is a slot; together they give the counts."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from harness.pipelines import make_tars
from harness.start_methods import worker_context
from shardcache import Dataset
from shardcache.mix.plan import plan_mix


def origin(sample: dict[str, bytes]) -> str:
    return sample["txt"].split(b"-")[0].decode()


def test_two_dataloader_workers_read_the_planned_counts(tmp_path: Path, start_method: str) -> None:
    torch = pytest.importorskip("torch")
    big = Dataset.from_source("tars", make_tars(tmp_path / "b", 4, 20, prefix="big"), daemon=None)
    small = Dataset.from_source("tars", make_tars(tmp_path / "s", 2, 5, prefix="small"), daemon=None)
    mixed = Dataset.mix({"big": big, "small": small}, temperature=2.0, seed=5).map(origin)
    loader = torch.utils.data.DataLoader(
        mixed, batch_size=None, num_workers=2, multiprocessing_context=worker_context(start_method)
    )
    plan = plan_mix(["big", "small"], [80, 10], temperature=2.0, seed=5, epoch=0)
    assert Counter(loader) == dict(zip(plan.names, plan.counts, strict=True))
