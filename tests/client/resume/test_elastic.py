"""Elastic resume: a checkpoint taken mid-epoch on one topology resumes on another (`resume.elastic`).

Every rank's state is merged with `merge_states`; the new ranks (explicit contexts, or a TorchLoader with real
DataLoader worker processes) read the rest. Over the whole epoch no sample may be read twice or lost.
"""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.contexts import contexts
from harness.shards import unequal_keys, write_unequal_tars
from harness.start_methods import DEFAULT, loader_workers
from shardcache import Dataset, RuntimeContext, StateError, UnsupportedResume, merge_states

ALL = unequal_keys()


@pytest.fixture(scope="module")
def tars(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_unequal_tars(tmp_path_factory.mktemp("elastic"))


def dataset(tars: list[str], **options: Any) -> Dataset:
    return Dataset.from_source("tars", tars, daemon=None, **options)


def progress(slot: int) -> int:
    """How far slot `slot` got before the checkpoint: not started, mid-shard, past a shard, or done."""
    return [0, 2, 5, 9, 1000, 4, 13, 7][slot % 8]


def checkpoint(
    tars: list[str], ctxs: list[RuntimeContext], **options: Any
) -> tuple[list[str], dict[str, Any]]:
    """Read each old slot part of the epoch; return what was read and the merged state."""
    seen: list[str] = []
    states = []
    for ctx in ctxs:
        it = dataset(tars, **options).iter_context(ctx)
        seen += [s["__key__"] for s in itertools.islice(it, progress(ctx.slot))]
        states.append(it.state_dict())
    return seen, merge_states(states)


def resume(
    tars: list[str], merged: dict[str, Any], ctxs: list[RuntimeContext], **options: Any
) -> list[list[dict[str, Any]]]:
    """Every new slot's rest of the epoch, each in a fresh Dataset (as on a fresh rank)."""
    out = []
    for ctx in ctxs:
        ds = dataset(tars, **options)
        ds.load_state_dict(merged)
        out.append(list(ds.iter_context(ctx)))
    return out


TOPOLOGY_CHANGES = {
    "4x2->3x2": ((4, 2, 1), (3, 2, 1)),
    "4x2->8x1": ((4, 2, 1), (8, 1, 1)),
    "2x2->4x2": ((2, 2, 1), (4, 2, 1)),
    "4x2->4x1": ((4, 2, 1), (4, 1, 1)),
    "2x2 workers 2->4": ((2, 2, 2), (2, 2, 4)),
}


@pytest.mark.parametrize("shuffle_mode", ["shard_aware", "none"])
@pytest.mark.parametrize("placement", ["auto", "global"])
@pytest.mark.parametrize(("old", "new"), TOPOLOGY_CHANGES.values(), ids=TOPOLOGY_CHANGES.keys())
def test_elastic_resume_reads_every_remaining_sample_exactly_once(
    tars: list[str], old: tuple[int, int, int], new: tuple[int, int, int], placement: str, shuffle_mode: str
) -> None:
    options = {"placement": placement, "shuffle_mode": shuffle_mode}
    seen, merged = checkpoint(tars, contexts(*old), **options)
    assert 0 < len(seen) < sum(ALL.values())
    rest = [s["__key__"] for slot in resume(tars, merged, contexts(*new), **options) for s in slot]
    assert Counter(seen) + Counter(rest) == ALL  # none lost, none twice
    assert not set(seen) & set(rest)


def test_elastic_resume_keeps_each_piece_on_the_new_owner_of_its_shard(tars: list[str]) -> None:
    _, merged = checkpoint(tars, contexts(4, 2))
    new = contexts(3, 2)
    whole_epoch = [list(dataset(tars).iter_context(c)) for c in new]
    home: dict[int, set[str]] = {}
    for ctx, slot in zip(new, whole_epoch, strict=True):
        home.setdefault(ctx.node, set()).update(s["__key__"][:5] for s in slot)
    for ctx, slot in zip(new, resume(tars, merged, new), strict=True):
        assert {s["__key__"][:5] for s in slot} <= home[ctx.node]


def test_elastic_resume_under_drop_gives_new_ranks_equal_counts_and_reads_nothing_twice(
    tars: list[str],
) -> None:
    seen, merged = checkpoint(tars, contexts(4, 2), even="drop")
    new = contexts(3, 2)
    per_slot = resume(tars, merged, new, even="drop")
    assert len({len(slot) for slot in per_slot}) == 1  # one worker per rank: a slot is a rank
    read = Counter(seen) + Counter(s["__key__"] for slot in per_slot for s in slot)
    assert max(read.values()) == 1 and set(read) <= set(ALL)
    # What the old epoch left out (< 8 ranks), and again the resumed epoch (< 6 ranks).
    assert sum(ALL.values()) - len(read) < 8 + 6


def test_merged_state_on_the_same_topology_resumes_the_uninterrupted_order(tars: list[str]) -> None:
    ctxs = contexts(4, 2, workers=2, epoch=1)
    uninterrupted = [[s["__key__"] for s in dataset(tars).iter_context(c)] for c in ctxs]
    seen, merged = checkpoint(tars, ctxs)
    for ctx, rest, full in zip(ctxs, resume(tars, merged, ctxs), uninterrupted, strict=True):
        done = min(progress(ctx.slot), len(full))
        assert full[:done] + [s["__key__"] for s in rest] == full
    assert merged["state"]["epoch"] == 1


def test_next_epoch_after_an_elastic_resume_is_the_new_topologys_normal_plan(tars: list[str]) -> None:
    _, merged = checkpoint(tars, contexts(4, 2))
    for ctx in contexts(3, 2):
        ds = dataset(tars)
        ds.load_state_dict(merged)
        list(ds.iter_context(ctx))  # the rest of epoch 0
        after = [s["__key__"] for s in ds.iter_context(ctx.with_epoch(1))]
        assert after == [s["__key__"] for s in dataset(tars).iter_context(ctx.with_epoch(1))]


def test_merge_states_refuses_states_of_different_pipelines(tars: list[str]) -> None:
    ctxs = contexts(2, 1)
    a = dataset(tars).iter_context(ctxs[0])
    b = dataset(tars[:-1]).iter_context(ctxs[1])
    with pytest.raises(StateError, match="different pipelines"):
        merge_states([a.state_dict(), b.state_dict()])


def test_merged_state_of_another_pipeline_is_refused_naming_what_differs(tars: list[str]) -> None:
    _, merged = checkpoint(tars, contexts(2, 2))
    with pytest.raises(StateError, match=r"shard list differs.*24 shards.*23"):
        dataset(tars[:-1]).load_state_dict(merged)
    with pytest.raises(StateError, match=r"stage.*map\(\)"):
        dataset(tars).map(str).load_state_dict(merged)


@pytest.mark.parametrize(("old", "new"), TOPOLOGY_CHANGES.values(), ids=TOPOLOGY_CHANGES.keys())
def test_elastic_resume_through_a_shuffle_reads_every_sample_it_had_not_emitted_once(
    tars: list[str], old: tuple[int, int, int], new: tuple[int, int, int]
) -> None:
    def shuffled() -> Dataset:
        return dataset(tars).map(key_of).shuffle(6, initial=3).batch(2)

    seen: list[str] = []
    states = []
    for ctx in contexts(*old):
        it = shuffled().iter_context(ctx)
        seen += [k for batch in itertools.islice(it, progress(ctx.slot)) for k in batch]
        states.append(it.state_dict())
    merged = merge_states(states)
    rest: list[str] = []
    for ctx in contexts(*new):
        ds = shuffled()
        ds.load_state_dict(merged)
        rest += [k for batch in ds.iter_context(ctx) for k in batch]
    assert 0 < len(seen) < sum(ALL.values())
    assert Counter(seen) + Counter(rest) == ALL  # the buffered samples too: none lost, none twice


def test_elastic_resume_through_a_stage_that_holds_samples_back_is_refused_naming_it(
    tars: list[str],
) -> None:
    ctxs = contexts(2, 2)
    states = []
    for ctx in ctxs:
        it = dataset(tars).batch(2).unbatch().iter_context(ctx)
        next(it)
        states.append(it.state_dict())
    ds = dataset(tars).batch(2).unbatch()
    ds.load_state_dict(merge_states(states))
    with pytest.raises(UnsupportedResume, match=r"unbatch"):
        next(ds.iter_context(contexts(3, 2)[0]))


def test_elastic_resume_through_a_shuffle_after_a_batch_is_refused(tars: list[str]) -> None:
    states = []
    for ctx in contexts(2, 2):
        it = dataset(tars).batch(2).shuffle(4).iter_context(ctx)
        next(it)
        states.append(it.state_dict())
    ds = dataset(tars).batch(2).shuffle(4)
    ds.load_state_dict(merge_states(states))
    with pytest.raises(UnsupportedResume, match=r"batch\(.*below a shuffle"):
        next(ds.iter_context(contexts(3, 2)[0]))


def key_of(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


def identity(batch: list[Any]) -> list[Any]:
    return batch


def loader(tars: list[str], ctx: RuntimeContext, workers: int, method: str = DEFAULT) -> Any:
    from shardcache import TorchLoader

    ds = Dataset.from_source("tars", tars, daemon=None, context=ctx).map(key_of)
    processes = loader_workers(method) if workers else {}
    return TorchLoader(ds, num_workers=workers, batch_size=3, collate_fn=identity, **processes)


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_torchloader_elastic_resume_from_2_to_4_workers_reads_every_remaining_sample_once(
    tars: list[str], tmp_path: Path, loader_mode: str
) -> None:
    pytest.importorskip("torch.utils.data")
    ranks = [RuntimeContext(rank=r, world_size=2, local_world_size=1) for r in range(2)]  # 2 nodes x 1
    seen: list[str] = []
    states = []
    for ctx, batches in zip(ranks, (2, 5), strict=True):
        it = iter(loader(tars, ctx, 2, loader_mode))
        seen += [k for batch in itertools.islice(it, batches) for k in batch]
        states.append(it.state_dict())
        it.close()
    merged = merge_states(states)
    rest: list[str] = []
    for ctx in ranks:
        resumed = loader(tars, ctx, 4, loader_mode)
        resumed.load_state_dict(merged)
        rest += [k for batch in resumed for k in batch]
    assert len(seen) == 21
    assert Counter(seen) + Counter(rest) == ALL


def test_torchloader_merged_state_on_the_same_topology_resumes_the_uninterrupted_order(
    tars: list[str], loader_mode: str
) -> None:
    pytest.importorskip("torch.utils.data")
    ranks = [RuntimeContext(rank=r, world_size=2, local_world_size=1) for r in range(2)]
    uninterrupted = [[k for batch in loader(tars, ctx, 2, loader_mode) for k in batch] for ctx in ranks]
    heads: list[list[str]] = []
    states = []
    for ctx in ranks:
        it = iter(loader(tars, ctx, 2, loader_mode))
        heads.append([k for batch in itertools.islice(it, 3) for k in batch])
        states.append(it.state_dict())
        it.close()
    merged = merge_states(states)
    for ctx, head, full in zip(ranks, heads, uninterrupted, strict=True):
        resumed = loader(tars, ctx, 2, loader_mode)
        resumed.load_state_dict(merged)
        assert head + [k for batch in resumed for k in batch] == full


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize(("workers", "new_ranks", "new_workers"), [(2, 3, 1), (1, 1, 2), (2, 4, 2)])
def test_torchloader_elastic_resume_through_unbatch_shuffle_batch_reads_every_remaining_sample_once(
    tars: list[str], workers: int, new_ranks: int, new_workers: int, loader_mode: str
) -> None:
    """The recommended loader: worker micro-batches, then unbatch, a loader-side shuffle and batch."""
    pytest.importorskip("torch.utils.data")

    def recommended(ctx: RuntimeContext, n: int) -> Any:
        return loader(tars, ctx, n, loader_mode).unbatch().shuffle(7, initial=4).batch(4)

    ranks = [RuntimeContext(rank=r, world_size=2, local_world_size=1) for r in range(2)]
    seen: list[str] = []
    states = []
    for ctx, batches in zip(ranks, (3, 6), strict=True):
        it = iter(recommended(ctx, workers))
        seen += [k for batch in itertools.islice(it, batches) for k in batch]
        states.append(it.state_dict())
        it.close()
    merged = merge_states(states)
    rest: list[str] = []
    for r in range(new_ranks):
        resumed = recommended(RuntimeContext(rank=r, world_size=new_ranks, local_world_size=1), new_workers)
        resumed.load_state_dict(merged)
        rest += [k for batch in resumed for k in batch]
    assert len(seen) == 36
    assert Counter(seen) + Counter(rest) == ALL  # the shuffle's buffer too: none lost, none twice


def test_torchloader_elastic_resume_through_a_loader_side_assemble_is_refused_naming_it(
    tars: list[str],
) -> None:
    pytest.importorskip("torch.utils.data")
    states = []
    for r in range(2):
        it = iter(loader(tars, RuntimeContext(rank=r, world_size=2, local_world_size=1), 0).unbatch())
        next(it)
        states.append(it.state_dict())
    resumed = loader(tars, RuntimeContext(rank=0, world_size=3, local_world_size=1), 0).unbatch()
    resumed.load_state_dict(merge_states(states))
    with pytest.raises(UnsupportedResume, match=r"unbatch"):
        next(iter(resumed))


@pytest.mark.parametrize("even", [None, "pad"])
def test_a_second_elastic_resume_reads_every_remaining_sample_exactly_once(
    tars: list[str], even: str | None
) -> None:
    # 4 nodes x 1 rank x 3 workers -> 3 x 1 x 1 -> 1 x 1 x 1; under pad one new slot stops inside a piece
    # of repeated samples, whose rest must stay marked as a repeat (it was read again as a real sample).
    steps = [((4, 1, 3), [0, 8, 12, 12, 12, 12, 12, 12, 12, 12, 12, 11]), ((3, 1, 1), [0, 0, 5])]
    merged: dict[str, Any] | None = None
    real: Counter[str] = Counter()
    for topology, limits in steps:
        states = []
        for ctx, limit in zip(contexts(*topology), limits, strict=True):
            ds = dataset(tars, even=even)
            if merged is not None:
                ds.load_state_dict(merged)
            it = ds.iter_context(ctx)
            real.update(s["__key__"] for s in itertools.islice(it, limit) if not s.get("__pad__"))
            states.append(it.state_dict())
        merged = merge_states(states)
    assert merged is not None
    for slot in resume(tars, merged, contexts(1, 1), even=even):
        real.update(s["__key__"] for s in slot if not s.get("__pad__"))
    assert real == ALL


topologies = st.tuples(st.integers(1, 4), st.integers(1, 2), st.integers(1, 3))  # nodes, ranks/node, workers


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    first=topologies,
    second=topologies,
    last=topologies,
    placement=st.sampled_from(["auto", "global"]),
    even=st.sampled_from([None, "drop", "pad"]),
    data=st.data(),
)
def test_any_chain_of_elastic_resumes_reads_no_sample_twice_and_loses_only_drops(
    tars: list[str],
    first: tuple[int, int, int],
    second: tuple[int, int, int],
    last: tuple[int, int, int],
    placement: str,
    even: str | None,
    data: st.DataObject,
) -> None:
    options: dict[str, Any] = {"placement": placement, "even": even}
    merged: dict[str, Any] | None = None
    real: Counter[str] = Counter()
    ranks = 0
    for step, topology in enumerate((first, second, last)):
        ctxs = contexts(*topology)
        ranks += topology[0] * topology[1]
        limit_of = st.integers(0, 40) if step < 2 else st.just(10**6)  # the last one reads to the end
        limits = data.draw(st.lists(limit_of, min_size=len(ctxs), max_size=len(ctxs)))
        states = []
        for ctx, limit in zip(ctxs, limits, strict=True):
            ds = dataset(tars, **options)
            if merged is not None:
                ds.load_state_dict(merged)
            it = ds.iter_context(ctx)
            real.update(s["__key__"] for s in itertools.islice(it, limit) if not s.get("__pad__"))
            states.append(it.state_dict())
        merged = merge_states(states)
        if merged["state"] is None:
            break  # every rank had ended the epoch: loading that state starts the next pass anew
    assert max(real.values()) == 1 and set(real) <= set(ALL)
    if even == "drop":
        assert sum(ALL.values()) - len(real) < ranks  # each planning left out fewer than its ranks
    else:
        assert real == ALL


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_torchloader_elastic_resume_through_a_worker_side_shuffle_reads_every_remaining_sample_once(
    tars: list[str], loader_mode: str
) -> None:
    pytest.importorskip("torch.utils.data")
    from shardcache import TorchLoader

    def shuffled(ctx: RuntimeContext, workers: int) -> Any:
        ds = Dataset.from_source("tars", tars, daemon=None, context=ctx).map(key_of).shuffle(5)
        processes = loader_workers(loader_mode) if workers else {}
        return TorchLoader(ds, num_workers=workers, batch_size=3, collate_fn=identity, **processes)

    ranks = [RuntimeContext(rank=r, world_size=2, local_world_size=1) for r in range(2)]
    seen: list[str] = []
    states = []
    for ctx, batches in zip(ranks, (2, 5), strict=True):
        it = iter(shuffled(ctx, 2))
        seen += [k for batch in itertools.islice(it, batches) for k in batch]
        states.append(it.state_dict())
        it.close()
    merged = merge_states(states)
    rest: list[str] = []
    for ctx in [RuntimeContext(rank=r, world_size=3, local_world_size=1) for r in range(3)]:
        resumed = shuffled(ctx, 1)
        resumed.load_state_dict(merged)
        rest += [k for batch in resumed for k in batch]
    assert Counter(seen) + Counter(rest) == ALL
