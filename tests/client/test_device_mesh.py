"""DataLoadMesh over a real torch `DeviceMesh` (gloo, CPU), as TP/FSDP trainers build it.

In this process: a 1x1 ("dp", "tp") mesh on a world of one (FileStore), read through DataLoader workers
under every start method. Under torchrun: a 2x2 mesh on four ranks (`mesh_worker.py`), launched with a
watchdog that fails the test and prints the ranks' output.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.pipelines import keys, make_tars
from harness.start_methods import worker_context
from shardcache import DataLoadMesh, Dataset, RuntimeContext, TorchLoader
from shardcache.errors import ConfigError

dist = pytest.importorskip("torch.distributed")

WORKER = Path(__file__).parent / "workers" / "mesh_worker.py"
SHARDS, SAMPLES = 8, 3
ALL_KEYS = sorted(f"s{s:03d}_{i:04d}" for s in range(SHARDS) for i in range(SAMPLES))
RANK_HANG_S = 60.0  # a rank stuck this long dumps its stacks and exits (faulthandler in the worker)
LAUNCH_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def device_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real ("dp", "tp") DeviceMesh of shape (1, 1): a gloo world of one process, this one."""
    from torch.distributed.device_mesh import init_device_mesh

    store = dist.FileStore(str(tmp_path_factory.mktemp("mesh-store") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def tars(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_tars(tmp_path_factory.mktemp("mesh-tars"), count=SHARDS, samples=SAMPLES)


def test_a_real_mesh_is_read_through_its_dimension_names(device_mesh: Any) -> None:
    mesh = DataLoadMesh(device_mesh, ("dp",))
    assert (mesh.mesh_dim_names, mesh.mesh_shape, mesh.coordinate) == (("dp", "tp"), (1, 1), (0, 0))
    assert (mesh.dp_rank, mesh.dp_size, mesh.is_dp_leader) == (0, 1, True)


def test_from_runtime_wraps_a_real_mesh_by_dimension_name(device_mesh: Any) -> None:
    ctx = RuntimeContext.from_runtime(device_mesh=device_mesh, dp_dims="dp")
    assert ctx.mesh == DataLoadMesh(device_mesh, ("dp",))
    assert (ctx.dp_rank, ctx.dp_size, ctx.slot, ctx.total_slots) == (0, 1, 0, 1)


def test_an_unknown_dp_dimension_is_refused_naming_the_mesh_dimensions(device_mesh: Any) -> None:
    with pytest.raises(ConfigError, match=r"no dimension named 'data'; its dimensions are \('dp', 'tp'\)"):
        DataLoadMesh(device_mesh, ("data",))


def test_a_mesh_without_dimension_names_is_refused(device_mesh: Any) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    with pytest.raises(ConfigError, match="mesh_dim_names"):
        DataLoadMesh(init_device_mesh("cpu", (1,)), ("dp",))


def test_a_pickled_mesh_carries_its_integers_and_not_the_device_mesh(device_mesh: Any) -> None:
    mesh = DataLoadMesh(device_mesh, ("dp",))
    copy = pickle.loads(pickle.dumps(mesh))
    assert copy.device_mesh is None
    assert copy == mesh and hash(copy) == hash(mesh)
    assert (copy.dp_rank, copy.dp_size, copy.is_dp_leader) == (mesh.dp_rank, mesh.dp_size, mesh.is_dp_leader)


def test_a_dataset_over_a_real_mesh_reads_in_loader_workers(
    device_mesh: Any, tars: list[str], any_start_method: str
) -> None:
    ctx = RuntimeContext.from_runtime(device_mesh=device_mesh, dp_dims="dp")
    ds = Dataset.from_source("tars", tars, daemon=None, context=ctx)
    loader = TorchLoader(ds, num_workers=2, multiprocessing_context=worker_context(any_start_method))
    assert sorted(keys(loader)) == ALL_KEYS


def launch_2x2(tars: list[str], out: Path) -> list[dict[str, Any]]:
    """Four torchrun ranks on a 2x2 ("dp", "tp") mesh; their reports, by rank."""
    shards = str(Path(tars[0]).parent / f"shard_{{000000..{SHARDS - 1:06d}}}.tar")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    command += [str(WORKER), "--shards", shards, "--out", str(out), "--shape", "2,2"]
    command += ["--hang-after", str(RANK_HANG_S)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launch = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    try:
        output, _ = launch.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(launch.pid, signal.SIGKILL)
        output, _ = launch.communicate()
        pytest.fail(
            f"torchrun on a 2x2 mesh did not finish in {LAUNCH_TIMEOUT_S} s; the ranks said:\n{output}"
        )
    assert launch.returncode == 0, f"torchrun on a 2x2 mesh failed; the ranks said:\n{output[-8000:]}"
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(4)]


@pytest.fixture(scope="module")
def reports_2x2(tars: list[str], tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return launch_2x2(tars, tmp_path_factory.mktemp("mesh-2x2"))


def test_each_rank_of_a_2x2_mesh_has_its_dp_rank_and_size(reports_2x2: list[dict[str, Any]]) -> None:
    # torch's init_device_mesh lays ranks out row-major: rank = dp * 2 + tp.
    got = [(r["rank"], r["dp_rank"], r["dp_size"], r["leader"]) for r in reports_2x2]
    assert got == [(0, 0, 2, True), (1, 0, 2, False), (2, 1, 2, True), (3, 1, 2, False)]


@pytest.mark.parametrize("read", ["keys", "loader_keys"])
def test_tp_co_members_of_a_2x2_mesh_read_identical_samples(
    reports_2x2: list[dict[str, Any]], read: str
) -> None:
    by_rank = [r[read] for r in reports_2x2]
    assert by_rank[0] == by_rank[1] and by_rank[2] == by_rank[3]


@pytest.mark.parametrize("read", ["keys", "loader_keys"])
def test_dp_ranks_of_a_2x2_mesh_read_disjoint_samples_covering_the_dataset(
    reports_2x2: list[dict[str, Any]], read: str
) -> None:
    dp0, dp1 = reports_2x2[0][read], reports_2x2[2][read]
    assert dp0 and dp1 and not set(dp0) & set(dp1)
    assert sorted(dp0 + dp1) == ALL_KEYS
