"""A resume refusal names the source or stage, and the argument, that differ (`shardcache.resume.check`)."""

from __future__ import annotations

import json
from typing import Any

from shardcache import Dataset
from shardcache.resume.check import describe_mismatch, mismatch_message, pipeline_parts, short_descriptions


def parts(ds: Dataset) -> list[str]:
    return pipeline_parts(ds.source, ds.stages)


def tars(shards: list[str], **options: Any) -> Dataset:
    return Dataset.from_source("tars", shards, daemon=None, **options)


URLS = [f"s3://bucket/shard_{i:06d}.tar" for i in range(1000)]


def key(sample: dict[str, object]) -> object:
    return sample["__key__"]


def test_a_changed_stage_argument_is_named() -> None:
    message = describe_mismatch(parts(tars(URLS).shuffle(7)), parts(tars(URLS).shuffle(8)))
    assert message == "stage 1 shuffle(): buffer_size differs (saved 7, now 8)"


def test_a_changed_source_option_is_named() -> None:
    message = describe_mismatch(parts(tars(URLS)), parts(tars(URLS, on_error="skip")))
    assert message == "the source: on_error differs (saved unset, now 'skip')"


def test_a_changed_shard_list_is_named_with_its_counts() -> None:
    message = describe_mismatch(parts(tars(URLS)), parts(tars(URLS[:-1])))
    assert message == "the source: the shard list differs (saved 1000 shards, now 999)"


def test_an_added_stage_is_named() -> None:
    message = describe_mismatch(parts(tars(URLS).map(key)), parts(tars(URLS).map(key).batch(4)))
    assert message == "this pipeline has 1 more stage(s): batch()"


def test_a_subset_difference_is_named() -> None:
    a, b = tars(URLS).split([0.5, 0.5])
    assert "subset differs" in describe_mismatch(parts(a), parts(b))


def test_descriptions_stay_small_for_a_thousand_shards() -> None:
    assert len(json.dumps(parts(tars(URLS).shuffle(4).batch(2)))) < 200


def test_a_state_without_descriptions_says_so() -> None:
    assert "older version" in mismatch_message({"fingerprint": "x"}, parts(tars(URLS)))


def test_a_changed_mix_argument_is_named() -> None:
    member = tars(URLS)
    concat = Dataset.from_source("mixed", sources={"a": member}, strategy="concat")
    rotating = Dataset.from_source("mixed", sources={"a": member}, strategy="round_robin")
    message = describe_mismatch(parts(concat), parts(rotating))
    assert message == 'the source: strategy differs (saved "concat", now "round_robin")'


def test_a_changed_mix_member_is_named() -> None:
    before = Dataset.from_source("mixed", sources={"a": tars(URLS)})
    after = Dataset.from_source("mixed", sources={"a": tars(URLS).shuffle(2)})
    assert describe_mismatch(parts(before), parts(after)) == (
        "the source: a mixed dataset's own source or stages differ"
    )


def test_pipeline_parts_are_the_short_descriptions() -> None:
    ds = tars(URLS).shuffle(3)
    assert pipeline_parts(ds.source, ds.stages) == short_descriptions(
        ds.source.describe(), [s.describe() for s in ds.stages]
    )


def test_a_changed_loader_setting_is_named() -> None:
    saved = [*parts(tars(URLS)), "loader(2,8,None,False)"]
    current = [*parts(tars(URLS)), "loader(4,8,None,False)"]
    assert describe_mismatch(saved, current) == "the loader: num_workers differs (saved 2, now 4)"
