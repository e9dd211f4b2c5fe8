"""RuntimeContext and DataLoadMesh (seed README, Distributed and Tensor-Parallel Behavior)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardcache import DataLoadMesh, Dataset, RuntimeContext
from shardcache.errors import ConfigError
from tests.client.pipeline_support import FakeDeviceMesh, keys, make_tars


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
    assert keys(ds) == keys(ds.iter_context(RuntimeContext(rank=1, world_size=2)))


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
