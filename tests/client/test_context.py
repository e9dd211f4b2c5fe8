"""RuntimeContext and DataLoadMesh (seed README, Distributed and Tensor-Parallel Behavior)."""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from harness.pipelines import FakeDeviceMesh, keys, make_tars
from shardcache import DataLoadMesh, Dataset, RuntimeContext
from shardcache.errors import ConfigError


def mesh_context(dp: int, tp: int, **kw: int) -> RuntimeContext:
    device_mesh = FakeDeviceMesh({"dp": 2, "tp": 2}, {"dp": dp, "tp": tp})
    return RuntimeContext.from_runtime(
        device_mesh=device_mesh,
        dp_dims=("dp",),
        env={"RANK": str(dp * 2 + tp), "WORLD_SIZE": "4", **{k: str(v) for k, v in kw.items()}},
    )


def test_slot_is_rank_times_workers_plus_worker() -> None:
    ctx = RuntimeContext(rank=2, world_size=4, worker_id=1, num_workers=3)
    assert (ctx.slot, ctx.total_slots) == (7, 12)


def test_from_runtime_reads_the_launcher_environment() -> None:
    ctx = RuntimeContext.from_runtime(
        env={"RANK": "1", "WORLD_SIZE": "2", "WORKER": "1", "NUM_WORKERS": "2"}, seed=9
    )
    assert (ctx.rank, ctx.world_size, ctx.worker_id, ctx.num_workers, ctx.seed) == (1, 2, 1, 2, 9)


def test_mesh_slots_count_data_parallel_ranks_only() -> None:
    ctx = mesh_context(dp=1, tp=1)
    assert (ctx.rank, ctx.dp_rank, ctx.dp_size, ctx.slot, ctx.total_slots) == (3, 1, 2, 1, 2)
    assert not ctx.mesh.is_dp_leader and mesh_context(1, 0).mesh.is_dp_leader  # type: ignore[union-attr]


def test_multi_dimension_dp_rank_is_row_major() -> None:
    mesh = DataLoadMesh(
        FakeDeviceMesh({"rep": 2, "shard": 3, "tp": 2}, {"rep": 1, "shard": 2, "tp": 0}), ("rep", "shard")
    )
    assert (mesh.dp_rank, mesh.dp_size) == (5, 6)


@pytest.fixture
def tars(tmp_path: Path) -> list[str]:
    return make_tars(tmp_path / "tars", count=8, samples=3)


def test_tp_co_members_read_identical_data_and_dp_ranks_distinct(tars: list[str]) -> None:
    ds = Dataset.from_source("tars", tars, daemon=None).shuffle(4)
    data = {(dp, tp): keys(ds.iter_context(mesh_context(dp, tp))) for dp in range(2) for tp in range(2)}
    assert data[(0, 0)] == data[(0, 1)]
    assert data[(1, 0)] == data[(1, 1)]
    assert not set(data[(0, 0)]) & set(data[(1, 0)])
    assert len(data[(0, 0)]) + len(data[(1, 0)]) == 24


def test_mesh_with_workers_keeps_tp_identical_and_dp_distinct(tars: list[str]) -> None:
    ds = Dataset.from_source("tars", tars, daemon=None)
    got = {}
    for dp in range(2):
        for tp in range(2):
            for w in range(2):
                ctx = RuntimeContext(
                    rank=dp * 2 + tp, world_size=4, worker_id=w, num_workers=2, mesh=mesh_context(dp, tp).mesh
                )
                got[(dp, tp, w)] = keys(ds.iter_context(ctx))
    for dp in range(2):
        for w in range(2):
            assert got[(dp, 0, w)] == got[(dp, 1, w)]
    everything = [k for (dp, tp, w), v in got.items() if tp == 0 for k in v]
    assert len(everything) == len(set(everything)) == 24


def test_an_explicit_context_is_honoured_at_iteration(tars: list[str]) -> None:
    ctx = RuntimeContext(rank=1, world_size=4)
    ds = Dataset.from_source("tars", tars, daemon=None, context=ctx)
    assert keys(ds) == keys(Dataset.from_source("tars", tars, daemon=None).iter_context(ctx))
    assert len(keys(ds)) == 6


def test_environment_is_read_when_no_context_is_given(
    tars: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = Dataset.from_source("tars", tars, daemon=None)
    as_rank_1 = keys(ds.iter_context(RuntimeContext(rank=1, world_size=2)))
    assert keys(ds) == as_rank_1


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"rank": 2, "world_size": 2}, "rank="),
        ({"world_size": 0}, "world_size="),
        ({"num_workers": 0}, "num_workers="),
        ({"worker_id": 3, "num_workers": 2}, "worker_id="),
        ({"epoch": -1}, "epoch="),
    ],
)
def test_bad_context_values_name_the_field(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        RuntimeContext(**kwargs)


def test_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="RANK"):
        RuntimeContext.from_runtime(env={"RANK": "x"})


# -- mvp-dataset 0.2.3's fields, node layout, identity() and Dataset.context ---------------------------------

FIELDS = [
    "rank",
    "world_size",
    "local_rank",
    "local_world_size",
    "node_rank",
    "num_nodes",
    "worker_id",
    "num_workers",
    "epoch",
    "seed",
    "mesh",
]


def layout(ctx: RuntimeContext) -> tuple[int, int, int, int]:
    return (ctx.local_rank, ctx.local_world_size, ctx.node_rank, ctx.num_nodes)


def test_fields_are_mvp_datasets_in_its_order() -> None:
    assert [f.name for f in dataclasses.fields(RuntimeContext)] == FIELDS


def test_a_default_context_is_one_rank_on_one_node() -> None:
    ctx = RuntimeContext()
    assert [getattr(ctx, name) for name in FIELDS] == [0, 1, 0, 1, 0, 1, 0, 1, 0, 0, None]


def test_positional_arguments_follow_the_field_order() -> None:
    ctx = RuntimeContext(5, 8, 1, 4, 1, 2, 1, 3, 6, 9)
    assert [getattr(ctx, name) for name in FIELDS] == [5, 8, 1, 4, 1, 2, 1, 3, 6, 9, None]
    assert (ctx.slot, ctx.total_slots, ctx.node) == (16, 24, 1)


def test_without_a_node_layout_every_rank_is_on_one_node() -> None:
    ctx = RuntimeContext(rank=5, world_size=8)
    assert layout(ctx) == (5, 8, 0, 1)
    assert (ctx.node, ctx.node_groups) == (0, 1)


@pytest.mark.parametrize(
    "kwargs",
    [{"local_world_size": 4}, {"num_nodes": 2}, {"local_world_size": 4, "num_nodes": 2}],
    ids=["local_world_size", "num_nodes", "both"],
)
def test_the_node_layout_derives_from_either_size(kwargs: dict[str, Any]) -> None:
    ctx = RuntimeContext(rank=5, world_size=8, **kwargs)
    assert layout(ctx) == (1, 4, 1, 2)  # rank 5 = node 1 x 4 ranks per node + local rank 1
    assert (ctx.node, ctx.node_groups) == (1, 2)


def test_explicit_local_and_node_ranks_are_kept() -> None:
    ctx = RuntimeContext(rank=5, world_size=8, local_rank=3, local_world_size=4, node_rank=0)
    assert layout(ctx) == (3, 4, 0, 2)
    assert ctx.node == 0


def test_node_placement_follows_num_nodes() -> None:
    two_nodes = [RuntimeContext(rank=r, world_size=4, num_nodes=2) for r in range(4)]
    assert [c.node_group for c in two_nodes] == [0, 0, 1, 1]
    assert [c.node_group for c in (RuntimeContext(rank=r, world_size=4) for r in range(4))] == [0] * 4


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"world_size": 4, "local_world_size": 0}, "local_world_size="),
        ({"world_size": 4, "local_world_size": 3}, "local_world_size="),
        ({"world_size": 4, "num_nodes": 0}, "num_nodes="),
        ({"world_size": 4, "num_nodes": 3}, "num_nodes="),
        ({"world_size": 4, "local_world_size": 2, "num_nodes": 1}, "num_nodes="),
        ({"world_size": 4, "local_world_size": 2, "local_rank": 2}, "local_rank="),
        ({"world_size": 4, "local_world_size": 2, "local_rank": -1}, "local_rank="),
        ({"world_size": 4, "num_nodes": 2, "node_rank": 2}, "node_rank="),
        ({"world_size": 4, "node_rank": 1}, "node_rank="),
        ({"rank": -1}, "rank="),
        ({"rank": "0"}, "rank="),
        ({"world_size": True}, "world_size="),
        ({"seed": 1.5}, "seed="),
    ],
)
def test_bad_node_layouts_and_types_name_the_field(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ConfigError, match=name) as caught:
        RuntimeContext(**kwargs)
    assert isinstance(caught.value, ValueError)  # mvp-dataset raises ValueError


def test_integer_like_values_are_stored_as_ints() -> None:
    values: dict[str, Any] = {"rank": Index(1), "world_size": Index(2), "seed": Index(7)}
    ctx = RuntimeContext(**values)
    assert (type(ctx.rank), type(ctx.world_size), type(ctx.seed)) == (int, int, int)


class Index:
    """An integer-like value, as numpy's integers are (`__index__`)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def test_replace_and_pickle_keep_the_layout() -> None:
    ctx = RuntimeContext(rank=5, world_size=8, local_world_size=4, seed=3)
    assert layout(dataclasses.replace(ctx, epoch=2)) == layout(ctx)
    assert pickle.loads(pickle.dumps(ctx)) == ctx
    assert hash(ctx) == hash(RuntimeContext(rank=5, world_size=8, num_nodes=2, seed=3))


TORCHRUN_2X4 = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "NODE_RANK": "1"}


def test_from_runtime_reads_the_node_layout_of_the_launcher() -> None:
    ctx = RuntimeContext.from_runtime(env=TORCHRUN_2X4, prefer_torch=False)
    assert (ctx.rank, ctx.world_size, *layout(ctx)) == (5, 8, 1, 4, 1, 2)
    assert ctx.node_groups == 2


def test_from_runtime_honours_local_rank_and_node_rank() -> None:
    env = {**TORCHRUN_2X4, "LOCAL_RANK": "3", "NODE_RANK": "0"}
    assert layout(RuntimeContext.from_runtime(env=env)) == (3, 4, 0, 2)


def test_from_runtime_derives_local_and_node_rank_when_absent() -> None:
    env = {"RANK": "6", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "2"}
    assert layout(RuntimeContext.from_runtime(env=env)) == (0, 2, 3, 4)


@pytest.mark.parametrize(
    "env",
    [
        {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "5", "NODE_RANK": "0"},
        {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "3", "NODE_RANK": "1"},
    ],
    ids=["no LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE not dividing WORLD_SIZE"],
)
def test_from_runtime_without_a_usable_local_world_size_is_one_node(env: dict[str, str]) -> None:
    assert layout(RuntimeContext.from_runtime(env=env)) == (5, 8, 0, 1)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({**TORCHRUN_2X4, "LOCAL_RANK": "4"}, "local_rank="),
        ({**TORCHRUN_2X4, "NODE_RANK": "2"}, "node_rank="),
        ({**TORCHRUN_2X4, "NODE_RANK": "one"}, "NODE_RANK"),
        ({**TORCHRUN_2X4, "LOCAL_WORLD_SIZE": "four"}, "LOCAL_WORLD_SIZE"),
    ],
)
def test_from_runtime_refuses_bad_node_variables(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RuntimeContext.from_runtime(env=env)


def test_from_runtime_inherits_seed_epoch_and_mesh_from_base() -> None:
    base = RuntimeContext(seed=4, epoch=2, mesh=mesh_context(1, 0).mesh)
    ctx = RuntimeContext.from_runtime(base=base, seed=99, env=TORCHRUN_2X4)
    assert (ctx.seed, ctx.epoch, ctx.mesh, ctx.rank) == (4, 2, base.mesh, 5)


def test_identity_is_rank_world_size_seed_and_mesh() -> None:
    ctx = RuntimeContext(
        rank=5, world_size=8, local_world_size=4, worker_id=1, num_workers=2, epoch=3, seed=7
    )
    assert ctx.identity() == {"rank": 5, "world_size": 8, "seed": 7, "mesh": None}
    assert ctx.identity() == ctx.with_epoch(0).identity() == dataclasses.replace(ctx, worker_id=0).identity()
    meshed = mesh_context(dp=1, tp=0)
    assert meshed.identity() == {"rank": 2, "world_size": 4, "seed": 0, "mesh": {"dp_rank": 1, "dp_size": 2}}
    assert json.loads(json.dumps(meshed.identity())) == meshed.identity()


def test_dataset_context_is_the_explicit_context(tars: list[str]) -> None:
    ctx = RuntimeContext(rank=1, world_size=2, seed=5)
    ds = Dataset.from_source("tars", tars, daemon=None, context=ctx).shuffle(4)
    assert ds.context == ctx
    ds.set_epoch(3)
    assert ds.context == ctx.with_epoch(3)


def test_dataset_context_is_inferred_without_one(tars: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in TORCHRUN_2X4.items():
        monkeypatch.setenv(name, value)
    ds = Dataset.from_source("tars", tars, daemon=None)
    assert ds.context == RuntimeContext.from_runtime(env=TORCHRUN_2X4)
    assert (ds.context.rank, ds.context.node_rank, ds.context.num_nodes) == (5, 1, 2)


def test_a_seed_only_context_takes_its_rank_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tars = make_tars(tmp_path / "t", 4, 3)
    rank1 = keys(
        Dataset.from_source("tars", tars, daemon=None, context=RuntimeContext(rank=1, world_size=2, seed=5))
    )
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    seeded = Dataset.from_source("tars", tars, daemon=None, context=RuntimeContext(seed=5))
    assert keys(seeded) == rank1
    assert (seeded.context.rank, seeded.context.world_size, seeded.context.seed) == (1, 2, 5)


def test_a_context_that_names_its_reader_ignores_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tars = make_tars(tmp_path / "t", 4, 3)
    whole = keys(Dataset.from_source("tars", tars, daemon=None, context=RuntimeContext(seed=5)))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    named = Dataset.from_source(
        "tars", tars, daemon=None, context=RuntimeContext(rank=0, world_size=1, seed=5)
    )
    assert keys(named) == whole
    assert named.context.world_size == 1


@pytest.mark.parametrize(
    ("given", "places"),
    [({}, False), ({"seed": 3, "epoch": 1}, False), ({"rank": 0}, True), ({"num_workers": 2}, True)],
)
def test_places_reader_is_whether_a_rank_or_worker_field_was_given(
    given: dict[str, int], places: bool
) -> None:
    assert RuntimeContext(**given).places_reader is places  # type: ignore[arg-type]


def test_a_seed_only_context_stays_one_across_epochs_and_pickling() -> None:
    ctx = RuntimeContext(seed=3)
    assert not ctx.with_epoch(2).places_reader
    assert not pickle.loads(pickle.dumps(ctx)).places_reader
