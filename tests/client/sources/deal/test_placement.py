"""Node placement at the Dataset level: explicit contexts simulate nodes, ranks and workers (daemon=None).

Shards hold different numbers of samples, so an exact cut cannot come out right by accident.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from harness.contexts import contexts
from harness.shards import UNEQUAL_SHARDS, unequal_keys, write_unequal_tars
from shardcache import Dataset, RuntimeContext

SHARDS = UNEQUAL_SHARDS
ALL = unequal_keys()


@pytest.fixture(scope="module")
def tars(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_unequal_tars(tmp_path_factory.mktemp("placement"))


def dataset(tars: list[str], **options: Any) -> Dataset:
    return Dataset.from_source("tars", tars, daemon=None, **options)


def read(ds: Dataset, ctx: RuntimeContext, limit: int | None = None) -> list[dict[str, Any]]:
    out = []
    for sample in ds.iter_context(ctx):
        out.append(sample)
        if limit is not None and len(out) == limit:
            break
    return out


def shard_of(key: str) -> int:
    return int(key[1:5])


def shards_by_node(per_slot: Iterable[tuple[RuntimeContext, list[dict[str, Any]]]]) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for ctx, samples in per_slot:
        out.setdefault(ctx.node, set()).update(shard_of(s["__key__"]) for s in samples)
    return out


def keys_per_slot(ds: Dataset, ctxs: list[RuntimeContext]) -> list[list[str]]:
    return [[s["__key__"] for s in read(ds, c)] for c in ctxs]


def test_default_placement_is_node_with_several_nodes(tars: list[str]) -> None:
    ctxs = contexts(4, 2)
    default = keys_per_slot(dataset(tars), ctxs)
    assert default == keys_per_slot(dataset(tars, placement="node"), ctxs)
    assert default != keys_per_slot(dataset(tars, placement="global"), ctxs)


def test_default_placement_is_global_on_one_node(tars: list[str]) -> None:
    ctxs = contexts(4, 2, one_node=True)
    default = keys_per_slot(dataset(tars), ctxs)
    assert default == keys_per_slot(dataset(tars, placement="global"), ctxs)
    assert default != keys_per_slot(dataset(tars, placement="node"), contexts(4, 2))


def test_each_node_reads_only_its_share_in_every_epoch(tars: list[str]) -> None:
    ds = dataset(tars, placement="node")
    shares = []
    for epoch in range(3):
        ctxs = contexts(4, 2, workers=2, epoch=epoch)
        shares.append(shards_by_node((c, read(ds, c)) for c in ctxs))
    assert shares[0] == shares[1] == shares[2]
    nodes = list(shares[0].values())
    assert sorted(s for node in nodes for s in node) == list(range(SHARDS))  # disjoint, complete
    assert all(5 <= len(node) <= 7 for node in nodes)  # balanced by samples: about a quarter each


@pytest.mark.parametrize("even", [None, "drop", "pad"])
@pytest.mark.parametrize("placement", ["node", "global"])
def test_every_sample_once_per_epoch_across_ranks_and_workers(
    tars: list[str], placement: str, even: str | None
) -> None:
    ds = dataset(tars, placement=placement, even=even)
    total = sum(ALL.values())
    for epoch in range(3):
        ctxs = contexts(4, 2, workers=2, epoch=epoch)
        per_slot = [read(ds, c) for c in ctxs]
        real = Counter(s["__key__"] for samples in per_slot for s in samples if not s.get("__pad__"))
        pads = [s["__key__"] for samples in per_slot for s in samples if s.get("__pad__")]
        per_rank = Counter(c.rank for c, samples in zip(ctxs, per_slot, strict=True) for _ in samples)
        if even is None:
            assert real == ALL and not pads
        elif even == "drop":
            assert set(real) <= set(ALL) and max(real.values()) == 1
            assert total - len(real) < 8 and not pads
            assert set(per_rank.values()) == {total // 8}
        else:
            assert real == ALL and len(pads) < 8 and set(pads) <= set(ALL)
            assert set(per_rank.values()) == {-(-total // 8)}


def test_pad_marks_every_sample_only_in_pad_mode(tars: list[str]) -> None:
    ctx = contexts(4, 2)[0]
    assert {s["__pad__"] for s in read(dataset(tars, even="pad"), ctx)} <= {True, False}
    assert all("__pad__" not in s for s in read(dataset(tars, even=None), ctx))


def test_resample_rounds_stay_inside_the_node(tars: list[str]) -> None:
    ds = dataset(tars, placement="node", resample=True)
    ctxs = contexts(4, 2, workers=2)
    home = shards_by_node((c, read(dataset(tars, placement="node"), c)) for c in ctxs)
    # Three rounds' worth of samples per slot: rounds start over inside the node's own shards.
    per_slot = [(c, read(ds, c, limit=3 * sum(ALL.values()) // len(ctxs))) for c in ctxs]
    assert shards_by_node(per_slot) == home
    keys = Counter(s["__key__"] for _, samples in per_slot for s in samples)
    assert max(keys.values()) > 1  # it did go round


def test_mini_epochs_keep_each_node_on_its_share_and_read_every_sample_once(tars: list[str]) -> None:
    ctxs = contexts(4, 2)
    base = Dataset.from_source("tars", tars, daemon=None, placement="node", context=ctxs[0])
    home = shards_by_node((c, read(dataset(tars, placement="node"), c)) for c in ctxs)
    for epoch in range(2):
        base.set_epoch(epoch)
        chunks = base.mini_epochs(8)
        assert len(chunks) == 3
        seen: Counter[str] = Counter()
        for chunk in chunks:
            per_slot = [(c, read(chunk, c.with_epoch(epoch))) for c in ctxs]
            for node, shards in shards_by_node(per_slot).items():
                assert shards <= home[node]
            seen.update(s["__key__"] for _, samples in per_slot for s in samples)
        assert seen == ALL


def test_cache_parts_are_the_ranks_node_shares_and_hold_every_sample_once(
    tars: list[str], tmp_path: Path
) -> None:
    from shardcache.snapshots import read_rows

    ctxs = contexts(4, 2)
    plain = dataset(tars, placement="node")
    cached = Dataset.from_source("tars", tars, daemon=None, placement="node", context=ctxs[0]).cache(
        cache_dir=str(tmp_path / "cache")
    )
    assert Counter(s["__key__"] for c in ctxs for s in read(cached, c)) == ALL
    # The merged cache is the parts in rank order; part r holds what rank r reads: its node's share.
    (merged,) = (tmp_path / "cache").glob("*/dataset/data.lance")
    rows = [row["__key__"] for row in read_rows(str(merged))]
    assert rows == [s["__key__"] for c in ctxs for s in read(plain, c)]


def test_mix_members_stay_on_each_nodes_share(tars: list[str]) -> None:
    ctxs = contexts(4, 2)
    members = {"a": tars[:12], "b": tars[12:]}
    home = {name: shards_by_node((c, read(dataset(part), c)) for c in ctxs) for name, part in members.items()}
    mixed = Dataset.mix({name: dataset(part) for name, part in members.items()})  # sizes as weights
    for node, shards in shards_by_node((c, read(mixed, c)) for c in ctxs).items():
        assert shards <= home["a"][node] | home["b"][node]
