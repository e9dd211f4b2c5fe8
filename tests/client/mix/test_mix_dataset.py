"""`Dataset.mix` end to end over real tar and jsonl shards: counts, recipes, epochs, slots, resume."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from harness.pipelines import assert_resumes, make_tars, slot_contexts
from shardcache import Dataset, RuntimeContext
from shardcache.errors import ConfigError
from shardcache.mix.plan import plan_mix
from shardcache.pipeline.mixing import MixSource


def origin(sample: Any) -> str:
    """Which dataset a sample came from: tars carry it in `txt`, jsonl rows in `src`."""
    if "txt" in sample:
        return str(sample["txt"].split(b"-")[0].decode())
    return str(sample["src"])


def ident(sample: Any) -> str:
    return sample["txt"].decode() if "txt" in sample else f"{sample['src']}-{sample['i']}"


def make_jsonl(root: Path, files: int, rows: int, name: str) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in range(files):
        path = root / f"{name}_{f:04d}.jsonl"
        path.write_text("".join(json.dumps({"src": name, "i": f * rows + i}) + "\n" for i in range(rows)))
        paths.append(str(path))
    return paths


@pytest.fixture
def sources(tmp_path: Path) -> dict[str, Dataset]:
    return {
        "big": Dataset.from_source("tars", make_tars(tmp_path / "big", 4, 30, prefix="big"), daemon=None),
        "small": Dataset.from_source(
            "tars", make_tars(tmp_path / "small", 2, 6, prefix="small"), daemon=None
        ),
        "rows": Dataset.from_source("jsonl", make_jsonl(tmp_path / "rows", 2, 20, "rows"), daemon=None),
    }


@pytest.mark.parametrize("temperature", [1.0, 2.0, 5.0])
def test_counts_per_source_match_the_plan(sources: dict[str, Dataset], temperature: float) -> None:
    mixed = Dataset.mix(sources, temperature=temperature, seed=4)
    got = Counter(origin(s) for s in mixed)
    plan = plan_mix(["big", "small", "rows"], [120, 12, 40], temperature=temperature, seed=4, epoch=0)
    assert got == dict(zip(plan.names, plan.counts, strict=True))


def test_explicit_weights_and_virtual_size_set_the_counts(sources: dict[str, Dataset]) -> None:
    mixed = Dataset.mix(sources, weights={"big": 1, "small": 1, "rows": 2}, virtual_size=100)
    assert Counter(origin(s) for s in mixed) == {"big": 25, "small": 25, "rows": 50}


def test_manifest_num_samples_give_the_sizes_without_counting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from shardcache.shards import ShardRef

    paths = make_tars(tmp_path / "m", 2, 10, prefix="man")
    manifested = Dataset.from_source("tars", [ShardRef(p, num_samples=10) for p in paths], daemon=None)
    with caplog.at_level(logging.INFO, logger="shardcache"):
        mixed = Dataset.mix({"man": manifested}, seed=0)
    assert isinstance(mixed.source, MixSource) and mixed.source.config is not None
    assert mixed.source.config.sizes == (20,)
    assert "counting the samples" not in caplog.text


def test_non_upsampled_source_reads_each_sample_once_per_epoch(sources: dict[str, Dataset]) -> None:
    mixed = Dataset.mix(sources, weights=[2, 1, 1], virtual_size=120 + 60 + 60)
    big = [ident(s) for s in mixed if origin(s) == "big"]
    assert sorted(big) == sorted(ident(s) for s in sources["big"])


def test_upsampled_source_repeats_whole_passes(sources: dict[str, Dataset]) -> None:
    mixed = Dataset.mix(sources, weights=[1, 1, 1], virtual_size=3 * 36)
    small = Counter(ident(s) for s in mixed if origin(s) == "small")
    assert len(small) == 12 and set(small.values()) == {3}


def test_order_repeats_for_same_seed_and_epoch_and_differs_across_epochs(sources: dict[str, Dataset]) -> None:
    def run(epoch: int) -> list[str]:
        mixed = Dataset.mix(sources, temperature=2.0, seed=9)
        mixed.set_epoch(epoch)
        return [ident(s) for s in mixed]

    assert run(1) == run(1)
    assert run(0) != run(1)


def test_recipe_batches_have_exact_counts_until_main_ends(sources: dict[str, Dataset]) -> None:
    mixed = Dataset.mix(sources, recipe={"big": 24, "small": 4, "rows": 4}, main="big")
    batches = list(mixed)
    assert len(batches) == 120 // 24
    for batch in batches:
        assert Counter(origin(s) for s in batch) == {"big": 24, "small": 4, "rows": 4}
    assert sorted(ident(s) for b in batches for s in b if origin(s) == "big") == sorted(
        ident(s) for s in sources["big"]
    )


def test_stages_chain_after_a_mix(sources: dict[str, Dataset]) -> None:
    mixed = Dataset.mix(sources, virtual_size=50).map(origin).batch(10)
    batches = list(mixed)
    assert [len(b) for b in batches] == [10] * 5
    assert all(isinstance(x, str) for b in batches for x in b)


@pytest.mark.parametrize("total", [2, 3])
def test_slots_split_each_count_evenly_and_add_up(sources: dict[str, Dataset], total: int) -> None:
    mixed = Dataset.mix({"big": sources["big"], "rows": sources["rows"]}, temperature=3.0, seed=2)
    plan = plan_mix(["big", "rows"], [120, 40], temperature=3.0, seed=2, epoch=0)
    per_slot = [Counter(origin(s) for s in mixed.iter_context(ctx)) for ctx in slot_contexts(total, seed=0)]
    assert sum(per_slot, Counter()) == dict(zip(plan.names, plan.counts, strict=True))
    for name in ("big", "rows"):
        shares = [c[name] for c in per_slot]
        assert max(shares) - min(shares) <= 1


def test_slots_read_disjoint_samples_of_a_source_pass(sources: dict[str, Dataset]) -> None:
    mixed = Dataset.mix(
        {"big": sources["big"], "small": sources["small"]}, weights=[1, 1], virtual_size=120 + 120
    )
    seen = [[ident(s) for s in mixed.iter_context(ctx) if origin(s) == "big"] for ctx in slot_contexts(2)]
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == sorted(ident(s) for s in sources["big"])


@pytest.mark.parametrize("context", [None, RuntimeContext(rank=1, world_size=2)])
def test_proportional_mix_resumes_exactly(
    sources: dict[str, Dataset], context: RuntimeContext | None
) -> None:
    assert_resumes(lambda: Dataset.mix(sources, temperature=2.0, seed=1), [0, 1, 37, 80], context)


def test_recipe_mix_resumes_exactly(sources: dict[str, Dataset]) -> None:
    assert_resumes(
        lambda: Dataset.mix(sources, recipe={"big": 8, "small": 3, "rows": 2}, main="big"), [0, 1, 7]
    )


def test_state_of_another_mix_is_refused(sources: dict[str, Dataset]) -> None:
    from shardcache.errors import StateError

    first = Dataset.mix(sources, temperature=2.0)
    next(iter(first))
    other = Dataset.mix(sources, temperature=3.0)
    with pytest.raises(StateError, match="another source or stage list"):
        other.load_state_dict(first.state_dict())


def test_mix_of_cached_datasets(sources: dict[str, Dataset], tmp_path: Path) -> None:
    cached = {
        name: ds.cache(cache_dir=str(tmp_path / "cache")) for name, ds in sources.items() if name != "rows"
    }
    mixed = Dataset.mix(cached, weights=[1, 1], virtual_size=60, seed=3)
    assert Counter(origin(s) for s in mixed) == {"big": 30, "small": 30}
    assert_resumes(lambda: Dataset.mix(cached, weights=[1, 1], virtual_size=60, seed=3), [0, 29])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"recipe": {"big": 2, "small": 1, "rows": 1}}, "go together"),
        ({"recipe": {"big": 2}, "main": "big"}, "one entry per dataset"),
        ({"recipe": {"big": 2, "small": 1, "rows": 1}, "main": "nope"}, "main='nope'"),
        ({"recipe": {"big": 2, "small": 1, "rows": 1}, "main": "big", "weights": [1, 1, 1]}, "drop weights"),
        ({"weights": [1, 2]}, "one per dataset"),
        ({"temperature": -1.0}, "temperature"),
    ],
)
def test_bad_arguments_are_config_errors(
    sources: dict[str, Dataset], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        Dataset.mix(sources, **kwargs)


def test_resampling_member_is_refused(tmp_path: Path) -> None:
    ds = Dataset.from_source("tars", make_tars(tmp_path / "r", 2, 2), daemon=None, resample=True)
    with pytest.raises(ConfigError, match="resample"):
        Dataset.mix({"r": ds})


def test_cache_after_mix_is_refused(sources: dict[str, Dataset]) -> None:
    with pytest.raises(ConfigError, match="cache each dataset before mixing"):
        Dataset.mix(sources).cache()
