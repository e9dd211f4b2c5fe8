"""The resume envelope (mvp-dataset 0.2.3's): {version, identity, state}, its refusals and their codes, the
initial and exhausted states, version-1 states still loading, the replaced-iterator warning, and the
context `consume` hands its factory.

One behaviour per test; the exact-order resume of every stage and source is `test_resume_contract.py`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import shardcache
from harness.pipelines import keys, make_tars, slot_contexts
from shardcache import Dataset, ResumeStateError, RuntimeContext, UnsupportedResume, merge_states
from shardcache.resume.state import STATE_VERSION


@pytest.fixture
def tars(tmp_path: Path) -> list[str]:
    return make_tars(tmp_path / "tars", count=4, samples=5)


def dataset(tars: list[str], seed: int | None = None, buffer: int = 4) -> Dataset:
    context = None if seed is None else RuntimeContext(seed=seed)
    return Dataset.from_source("tars", tars, daemon=None, context=context).shuffle(buffer)


def as_version_1(envelope: dict[str, Any]) -> dict[str, Any]:
    """The flat state version 1 wrote for the same position: the identity's own keys, then the position,
    without the seed (version 1 did not record it). What a checkpoint taken before version 2 holds."""
    own = {k: v for k, v in envelope["identity"]["shardcache"].items() if k != "seed"}
    return {"version": 1, **own, **envelope["state"]}


def test_state_has_mvps_envelope_keys_and_is_json(tars: list[str]) -> None:
    it = iter(dataset(tars))
    next(it)
    state = json.loads(json.dumps(it.state_dict()))
    assert set(state) == {"version", "identity", "state"}
    assert state["version"] == STATE_VERSION
    assert {"runtime", "source", "stages", "loader"} <= set(state["identity"])
    assert [stage["kind"] for stage in state["identity"]["stages"]] == ["shuffle"]
    assert state["identity"]["source"]["kind"] == "tars"
    assert state["identity"]["runtime"] == RuntimeContext.from_runtime().identity()


def test_state_before_iteration_is_the_initial_state(tars: list[str]) -> None:
    state = dataset(tars).state_dict()
    assert state["state"] is None
    resumed = dataset(tars)
    resumed.load_state_dict(state)
    assert keys(resumed) == keys(dataset(tars))


def test_exhausted_iterator_state_is_none_and_the_next_pass_reads_the_next_epoch(tars: list[str]) -> None:
    it = iter(dataset(tars))
    keys(it)
    state = it.state_dict()
    assert state["state"] is None
    resumed = dataset(tars)
    resumed.load_state_dict(state)
    next_epoch = dataset(tars)
    next_epoch.set_epoch(1)
    assert keys(resumed) == keys(next_epoch)


def test_dataset_state_follows_its_exhausted_iterator(tars: list[str]) -> None:
    ds = dataset(tars)
    keys(ds)
    assert ds.state_dict()["state"] is None


def test_live_state_has_no_version_or_identity(tars: list[str]) -> None:
    it = iter(dataset(tars))
    next(it)
    live = it.live_state()
    assert "version" not in live and "identity" not in live
    assert live == it.state_dict()["state"]


def test_an_iterator_loads_a_state_and_goes_on_from_it(tars: list[str]) -> None:
    it = iter(dataset(tars))
    head = [next(it)["__key__"] for _ in range(6)]
    state = it.state_dict()
    other = iter(dataset(tars))
    next(other)
    other.load_state_dict(state)
    assert head + keys(other) == keys(dataset(tars))


def test_another_pipeline_is_refused_as_an_identity_mismatch(tars: list[str]) -> None:
    it = iter(dataset(tars, buffer=4))
    next(it)
    with pytest.raises(ResumeStateError, match=r"^\[ResumeIdentityMismatch\] .*buffer_size differs"):
        dataset(tars, buffer=5).load_state_dict(it.state_dict())


def test_an_edited_identity_view_is_refused(tars: list[str]) -> None:
    state = dataset(tars).state_dict()
    state["identity"]["source"]["source_fingerprint"] = "changed"
    with pytest.raises(ResumeStateError, match=r"\[ResumeIdentityMismatch\] path=identity.source"):
        dataset(tars).load_state_dict(state)


def test_another_seed_of_an_explicit_context_is_refused_when_loading(tars: list[str]) -> None:
    state = iter(dataset(tars, seed=1)).state_dict()
    with pytest.raises(ResumeStateError, match=r"\[ResumeIdentityMismatch\] path=identity.shardcache.seed"):
        dataset(tars, seed=2).load_state_dict(state)


def test_another_seed_of_the_iterating_context_is_refused_when_iterating(tars: list[str]) -> None:
    it = dataset(tars).iter_context(RuntimeContext(seed=1))
    next(it)
    resumed = dataset(tars)
    resumed.load_state_dict(it.state_dict())
    with pytest.raises(ResumeStateError, match=r"\[ResumeIdentityMismatch\] .*another seed"):
        resumed.iter_context(RuntimeContext(seed=2))


def test_another_slot_is_refused_as_an_identity_mismatch(tars: list[str]) -> None:
    first, second = slot_contexts(2)
    it = dataset(tars).iter_context(first)
    next(it)
    resumed = dataset(tars)
    resumed.load_state_dict(it.state_dict())
    with pytest.raises(ResumeStateError, match=r"\[ResumeIdentityMismatch\] resume state is for slot 0"):
        resumed.iter_context(second)


def test_another_version_is_refused(tars: list[str]) -> None:
    with pytest.raises(ResumeStateError, match=r"^\[InvalidResumeStateVersion\]"):
        dataset(tars).load_state_dict({"version": STATE_VERSION + 1})


@pytest.mark.parametrize("blob", [[], {"version": STATE_VERSION}, {"version": STATE_VERSION, "state": None}])
def test_what_is_not_a_state_is_refused_as_invalid(tars: list[str], blob: Any) -> None:
    with pytest.raises(ResumeStateError, match=r"^\[InvalidResumeState\]"):
        dataset(tars).load_state_dict(blob)


def test_a_version_1_state_still_loads_and_resumes(tars: list[str]) -> None:
    it = iter(dataset(tars))
    head = [next(it)["__key__"] for _ in range(7)]
    old = json.loads(json.dumps(as_version_1(it.state_dict())))
    resumed = dataset(tars)
    resumed.load_state_dict(old)
    assert resumed.state_dict()["version"] == STATE_VERSION  # answered in this version's envelope
    assert head + keys(resumed) == keys(dataset(tars))


def test_version_1_states_still_merge_and_resume_elastically(tars: list[str]) -> None:
    old_slots, new_slots = slot_contexts(2), slot_contexts(4)
    full = sorted(keys(dataset(tars)))
    seen: list[str] = []
    states = []
    for ctx in old_slots:
        it = dataset(tars).iter_context(ctx)
        seen += [next(it)["__key__"] for _ in range(3)]
        states.append(as_version_1(it.state_dict()))
    merged = merge_states(states)
    assert merged["version"] == STATE_VERSION
    rest: list[str] = []
    for ctx in new_slots:
        resumed = dataset(tars)
        resumed.load_state_dict(merged)
        rest += keys(resumed.iter_context(ctx))
    assert sorted(seen + rest) == full


def test_merged_states_of_ended_ranks_start_the_next_epoch(tars: list[str]) -> None:
    states = []
    for ctx in slot_contexts(2):
        it = dataset(tars).iter_context(ctx)
        keys(it)
        states.append(it.state_dict())
    merged = merge_states(states)
    assert merged["state"] is None
    resumed = dataset(tars)
    resumed.load_state_dict(merged)
    (whole,) = slot_contexts(1)
    next_epoch = dataset(tars)
    next_epoch.set_epoch(1)
    assert keys(resumed.iter_context(whole)) == keys(next_epoch.iter_context(whole))


class Pairs:
    """A stateful assembler with mvp-dataset's `identity()`, whose version a test changes."""

    version = "v1"

    def __init__(self, context: RuntimeContext) -> None:
        self.pending: list[str] = []

    def push(self, sample: dict[str, Any]) -> list[str]:
        self.pending.append(sample["__key__"])
        if len(self.pending) < 2:
            return []
        pair, self.pending = "+".join(self.pending), []
        return [pair]

    def finish(self, *, drop_last: bool = False) -> list[str]:
        return [] if drop_last or not self.pending else ["+".join(self.pending)]

    def state_dict(self) -> dict[str, Any]:
        return {"pending": list(self.pending)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pending = list(state["pending"])

    def identity(self) -> str:
        return f"pairs:{self.version}"


def test_an_assembler_answering_another_identity_is_refused_when_loading(
    tars: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    it = iter(dataset(tars).assemble(Pairs))
    next(it)
    state = it.state_dict()
    monkeypatch.setattr(Pairs, "version", "v2")
    with pytest.raises(ResumeStateError, match=r"\[ResumeIdentityMismatch\] path=identity.assembler"):
        dataset(tars).assemble(Pairs).load_state_dict(state)


def test_an_assembler_with_the_same_identity_resumes(tars: list[str]) -> None:
    it = iter(dataset(tars).assemble(Pairs))
    head = [next(it) for _ in range(3)]
    resumed = dataset(tars).assemble(Pairs)
    resumed.load_state_dict(it.state_dict())
    assert head + list(resumed) == list(dataset(tars).assemble(Pairs))


class ListLogger:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def debug(self, msg: str, /) -> None: ...
    def info(self, msg: str, /) -> None: ...
    def error(self, msg: str, /) -> None: ...

    def warning(self, msg: str, /) -> None:
        self.warnings.append(msg)


@pytest.fixture
def warnings_logged() -> Any:
    logger = ListLogger()
    shardcache.set_logger(logger)
    yield logger.warnings
    shardcache.reset_logger()


def test_second_iterator_warns_while_the_first_is_active(tars: list[str], warnings_logged: list[str]) -> None:
    ds = dataset(tars)
    first = iter(ds)
    next(first)
    iter(ds)
    assert any("previous iterator is still active" in w for w in warnings_logged)


def test_no_warning_once_the_previous_iterator_ended(tars: list[str], warnings_logged: list[str]) -> None:
    ds = dataset(tars)
    keys(iter(ds))
    iter(ds)
    assert not any("previous iterator is still active" in w for w in warnings_logged)


class ContextOf:
    def __init__(self, context: RuntimeContext) -> None:
        self.context = context
        self.count = 0

    def push(self, item: Any) -> None:
        self.count += 1

    def finish(self) -> tuple[RuntimeContext, int]:
        return self.context, self.count


def test_consume_gives_its_factory_the_iterators_context(tars: list[str]) -> None:
    ds = Dataset.from_source("tars", tars, daemon=None, context=RuntimeContext(seed=7, rank=1, world_size=2))
    ds.set_epoch(2)
    context, count = ds.consume(ContextOf)
    assert context == ds.resolve_context()
    assert (context.rank, context.world_size, context.seed, context.epoch) == (1, 2, 7, 2)
    assert count == len(keys(ds))


def test_loader_state_before_iteration_is_refused_under_other_batching(tars: list[str]) -> None:
    pytest.importorskip("torch.utils.data")
    state = shardcache.TorchLoader(dataset(tars), batch_size=2).state_dict()
    assert state["state"] is None
    with pytest.raises(ResumeStateError, match=r"^\[ResumeIdentityMismatch\]"):
        shardcache.TorchLoader(dataset(tars), batch_size=3).load_state_dict(state)


def test_loader_exhausted_state_is_none(tars: list[str]) -> None:
    pytest.importorskip("torch.utils.data")
    loader = shardcache.TorchLoader(dataset(tars), batch_size=2, collate_fn=lambda b: b)
    it = iter(loader)
    list(it)
    assert it.state_dict()["state"] is None
    assert loader.state_dict()["state"] is None


def test_a_version_1_loader_state_still_loads(tars: list[str]) -> None:
    pytest.importorskip("torch.utils.data")

    def make() -> shardcache.TorchLoader:
        return shardcache.TorchLoader(dataset(tars), batch_size=2, collate_fn=lambda b: b)

    it = iter(make())
    head = [next(it) for _ in range(3)]
    resumed = make()
    resumed.load_state_dict(as_version_1(it.state_dict()))
    assert head + list(resumed) == list(make())


def test_a_plain_iterable_loader_state_is_unsupported_with_its_code() -> None:
    pytest.importorskip("torch.utils.data")
    it = iter(shardcache.TorchLoader([1, 2, 3]))
    next(it)
    with pytest.raises(UnsupportedResume, match=r"^\[UnsupportedResume\] TorchLoader dataset does not"):
        it.state_dict()


def test_state_shows_the_source_round_of_a_resampling_pipeline(tars: list[str]) -> None:
    it = iter(Dataset.from_source("tars", tars, daemon=None, resample=True))
    for _ in range(25):  # 4 shards of 5 samples: the second round has begun
        next(it)
    state = it.state_dict()
    assert state["state"]["source"] == {"epoch": 0, "round_index": 1}
    again = Dataset.from_source("tars", tars, daemon=None, resample=True)
    again.load_state_dict(json.loads(json.dumps(state)))
    assert next(iter(again)) == next(it)


def test_the_source_view_is_not_part_of_the_position(tars: list[str]) -> None:
    it = iter(dataset(tars))
    next(it)
    state = it.state_dict()
    state["state"]["source"] = {"epoch": 7, "round_index": 9}  # a view: editing it changes nothing
    resumed = dataset(tars)
    resumed.load_state_dict(state)
    assert keys(resumed) == keys(it)


def test_identity_views_keep_the_kind_of_a_stage_with_a_long_description(tars: list[str]) -> None:
    def a_function_with_a_name_long_enough_to_make_the_description_longer_than_the_limit(x: Any) -> Any:
        return x

    it = iter(
        dataset(tars).map(a_function_with_a_name_long_enough_to_make_the_description_longer_than_the_limit)
    )
    next(it)
    kinds = [stage["kind"] for stage in it.state_dict()["identity"]["stages"]]
    assert kinds == ["shuffle", "map"]
