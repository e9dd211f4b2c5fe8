"""`Dataset.mix` and `Dataset.mini_epochs`: the facade wraps the specs `shardcache.pipeline.mixing` and
`shardcache.pipeline.mini_epochs` make."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from harness.pipelines import keys, make_tars
from shardcache import Dataset
from shardcache.pipeline.iteration import start
from shardcache.pipeline.mini_epochs import mini_epochs
from shardcache.pipeline.mixing import MixSource


def test_dataset_mix_builds_a_mixed_dataset_with_the_planned_counts(tmp_path: Path) -> None:
    big = Dataset.from_source("tars", make_tars(tmp_path / "big", 4, 5, prefix="big"), daemon=None)
    small = Dataset.from_source("tars", make_tars(tmp_path / "small", 2, 5, prefix="small"), daemon=None)
    mixed = Dataset.mix({"big": big, "small": small}, seed=3)
    assert type(mixed) is Dataset and isinstance(mixed.source, MixSource)
    counts = Counter(sample["txt"].split(b"-")[0] for sample in mixed)
    # The largest source keeps its size; the other is upsampled towards it, capped at 1.5x the total.
    assert counts[b"big"] == 20 and counts[b"small"] == 10


def test_dataset_mix_recipe_batches_have_exact_counts(tmp_path: Path) -> None:
    main = Dataset.from_source("tars", make_tars(tmp_path / "main", 2, 6, prefix="main"), daemon=None)
    aux = Dataset.from_source("tars", make_tars(tmp_path / "aux", 1, 2, prefix="aux"), daemon=None)
    batches = list(Dataset.mix({"main": main, "aux": aux}, recipe={"main": 3, "aux": 1}, main="main"))
    assert len(batches) == 4
    for batch in batches:
        assert Counter(s["txt"].split(b"-")[0] for s in batch) == {b"main": 3, b"aux": 1}


def test_dataset_mini_epochs_wraps_the_pipeline_function(tmp_path: Path) -> None:
    ds = Dataset.from_source("tars", make_tars(tmp_path / "tars", 6, 2), daemon=None)
    ds.set_epoch(2)
    by_method = ds.mini_epochs(4, num_workers=0)
    ctx = ds.resolve_context()
    by_function = mini_epochs(ds.spec, ctx, 4, num_workers=0)
    assert [c.spec for c in by_method] == by_function
    assert [keys(c) for c in by_method] == [keys(start(spec, ctx, None)) for spec in by_function]
    assert sorted(k for c in by_method for k in keys(c)) == sorted(keys(ds))


def test_a_mix_refuses_cache_with_a_config_error(tmp_path: Path) -> None:
    import pytest

    from shardcache import ConfigError

    a = Dataset.from_source("tars", make_tars(tmp_path / "a", 2, 2, prefix="a"), daemon=None)
    with pytest.raises(ConfigError, match="cache each dataset before mixing"):
        Dataset.mix({"a": a}, seed=1).map(keys).cache()


def test_a_mix_with_stages_keeps_its_root_and_fingerprint(tmp_path: Path) -> None:
    a = Dataset.from_source("tars", make_tars(tmp_path / "a", 2, 2, prefix="a"), daemon=None)
    mixed = Dataset.mix({"a": a}, seed=1)
    staged = mixed.batch(2)
    assert staged.source is mixed.source
    assert staged.fingerprint() != mixed.fingerprint()
    assert Dataset.mix({"a": a}, seed=1).fingerprint() == mixed.fingerprint()
