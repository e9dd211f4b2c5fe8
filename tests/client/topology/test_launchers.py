"""The node layout from each launcher's variables, and the one warning when nothing tells it.

Each environment below is what the launcher sets in the process it starts (its documented variables); the
layout is read through `RuntimeContext.from_runtime(env=...)`, as a reader does, without torch.distributed
(`prefer_torch=False`), and through `node_layout` with a fresh record of warnings where a test checks one.
"""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from shardcache import RuntimeContext
from shardcache.errors import ConfigError
from shardcache.topology import Warnings, node_layout
from shardcache.topology.launchers import NodeLayout, tasks_per_node

Env = dict[str, str]


def where(env: Env) -> tuple[int, int, int, int, int, int]:
    """rank, world_size, local_rank, local_world_size, node_rank, num_nodes as a reader resolves them."""
    ctx = RuntimeContext.from_runtime(env=env, prefer_torch=False)
    return ctx.rank, ctx.world_size, ctx.local_rank, ctx.local_world_size, ctx.node_rank, ctx.num_nodes


def warned(env: Env, rank: int, world_size: int, caplog: pytest.LogCaptureFixture) -> list[str]:
    """The warnings a process that had said nothing yet logs resolving the layout of `env` (twice)."""
    said = Warnings()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="shardcache"):
        for _ in range(2):
            node_layout(env, rank, world_size, None, owns_group=True, warnings=said)
    return [record.getMessage() for record in caplog.records]


# torchrun --nnodes 2 --nproc-per-node 4, the second node's second rank.
TORCHRUN = {
    "RANK": "5",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "ROLE_RANK": "5",
    "TORCHELASTIC_RUN_ID": "job",
}
# Lightning's launcher, Trainer(num_nodes=2, devices=2) on the node with NODE_RANK=1: its local rank 1.
LIGHTNING = {"WORLD_SIZE": "4", "NODE_RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1"}
# srun -N 3 --ntasks-per-node 2: the third node's first task.
SRUN = {
    "SLURM_JOB_ID": "42",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "4",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "2",
    "SLURM_NTASKS": "6",
    "SLURM_STEP_NUM_TASKS": "6",
    "SLURM_STEP_NUM_NODES": "3",
    "SLURM_NNODES": "3",
    "SLURM_STEP_TASKS_PER_NODE": "2(x3)",
    "SLURM_TASKS_PER_NODE": "2(x3)",
}
# mpirun -np 8 on 2 hosts of 4 slots: the second host's last rank.
OPEN_MPI = {
    "OMPI_COMM_WORLD_RANK": "7",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "3",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
}


def test_torchrun_gives_the_ranks_per_node_and_the_node() -> None:
    assert where(TORCHRUN) == (5, 8, 1, 4, 1, 2)


def test_torchrun_with_nodes_of_different_sizes_counts_one_node_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # --nproc-per-node 2 here, 4 on the first node: 6 ranks on 2 nodes (the first node's ranks see that
    # 4 does not divide 6; see the next test).
    env = {**TORCHRUN, "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "2"}
    assert where(env)[3:] == (6, 0, 1)
    (message,) = warned(env, 5, 6, caplog)
    assert "GROUP_WORLD_SIZE" in message and "one node" in message


def test_a_local_world_size_that_does_not_divide_the_world_counts_one_node_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "3"}
    assert where(env)[3:] == (8, 0, 1)
    (message,) = warned(env, 5, 8, caplog)
    assert "LOCAL_WORLD_SIZE=3 does not divide WORLD_SIZE=8" in message


def test_lightning_without_its_process_group_counts_one_node_and_names_what_to_set(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert where(LIGHTNING)[1:] == (4, 0, 4, 0, 1)
    (message,) = warned(LIGHTNING, 3, 4, caplog)
    assert "Lightning" in message and "LOCAL_WORLD_SIZE" in message and "torch.distributed" in message


def test_the_warning_is_logged_once_per_process() -> None:
    # A fresh interpreter: what the process has said is the process's own.
    code = (
        "import logging, os; logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(message)s');"
        "from shardcache import RuntimeContext;"
        "[RuntimeContext.from_runtime() for _ in range(3)]"
    )
    env = {"PATH": "/usr/bin:/bin", "RANK": "1", "WORLD_SIZE": "2"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("WARNING") == 1, done.stderr
    assert "set LOCAL_WORLD_SIZE" in done.stderr


def test_one_rank_needs_no_layout_and_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    assert where({}) == (0, 1, 0, 1, 0, 1)
    assert warned({"RANK": "0", "WORLD_SIZE": "1"}, 0, 1, caplog) == []


def test_srun_gives_rank_world_and_layout_from_slurms_variables() -> None:
    assert where(SRUN) == (4, 6, 0, 2, 2, 3)


@pytest.mark.parametrize(
    ("value", "counts"),
    [("4", [4]), ("2(x3)", [2, 2, 2]), ("2(x3),1", [2, 2, 2, 1]), ("3,1(x2),2", [3, 1, 1, 2])],
)
def test_slurms_compressed_tasks_per_node_list_expands(value: str, counts: list[int]) -> None:
    assert tasks_per_node("SLURM_TASKS_PER_NODE", value) == counts


def test_a_malformed_tasks_per_node_list_is_refused_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match="SLURM_STEP_TASKS_PER_NODE='2x3'"):
        where({**SRUN, "SLURM_STEP_TASKS_PER_NODE": "2x3"})


def test_srun_with_uneven_tasks_per_node_counts_one_node_and_names_the_list(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {**SRUN, "SLURM_STEP_NUM_TASKS": "7", "SLURM_NTASKS": "7", "SLURM_STEP_TASKS_PER_NODE": "2(x3),1"}
    assert where(env)[:2] == (4, 7) and where(env)[3:] == (7, 0, 1)
    (message,) = warned(env, 4, 7, caplog)
    assert "SLURM_STEP_TASKS_PER_NODE=2(x3),1" in message and "--ntasks-per-node" in message


def test_srun_without_a_tasks_per_node_list_uses_ntasks_per_node_and_the_node_count() -> None:
    env = {k: v for k, v in SRUN.items() if "TASKS_PER_NODE" not in k}
    assert where({**env, "SLURM_NTASKS_PER_NODE": "2"}) == (4, 6, 0, 2, 2, 3)


def test_a_batch_script_outside_any_srun_step_is_one_process() -> None:
    # sbatch --ntasks 6 runs the script once: its SLURM_PROCID/SLURM_NTASKS describe the allocation.
    batch = {k: v for k, v in SRUN.items() if not k.startswith("SLURM_STEP")}
    assert where({**batch, "SLURM_PROCID": "0"}) == (0, 1, 0, 1, 0, 1)


def test_srun_numbering_tasks_across_nodes_keeps_the_layout_and_says_how_to_fix_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # srun -m cyclic: task 4 on the first node.
    env = {**SRUN, "SLURM_NODEID": "0", "SLURM_LOCALID": "1"}
    assert where(env) == (4, 6, 1, 2, 0, 3)
    (message,) = warned(env, 4, 6, caplog)
    assert "srun -m block" in message


def test_open_mpi_gives_rank_world_and_layout() -> None:
    assert where(OPEN_MPI) == (7, 8, 3, 4, 1, 2)


def test_torchrun_under_srun_reads_torchruns_variables() -> None:
    # srun -N 2 --ntasks-per-node 1 torchrun --nnodes 2 --nproc-per-node 4: Slurm counts the torchruns.
    slurm = {**SRUN, "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_NTASKS": "2"}
    slurm |= {"SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}
    assert where({**slurm, **TORCHRUN}) == (5, 8, 1, 4, 1, 2)


def test_open_mpi_under_srun_reads_open_mpis_variables() -> None:
    # mpirun inside an allocation starts its daemons with srun: Slurm's variables describe those.
    daemons = {**SRUN, "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2"}
    daemons |= {"SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_NODEID": "1", "SLURM_STEP_NUM_NODES": "2"}
    assert where({**daemons, **OPEN_MPI}) == (7, 8, 3, 4, 1, 2)


def test_rank_and_world_set_by_hand_take_the_layout_from_srun_when_it_describes_the_same_rank() -> None:
    assert where({**SRUN, "RANK": "4", "WORLD_SIZE": "6"}) == (4, 6, 0, 2, 2, 3)


def test_a_world_size_set_by_hand_without_a_rank_takes_the_rank_from_srun() -> None:
    assert where({**SRUN, "WORLD_SIZE": "6"}) == (4, 6, 0, 2, 2, 3)


def test_a_launcher_describing_another_rank_or_world_is_not_read_for_the_layout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Lightning spawning 4 processes inside an interactive `srun --pty bash` step of one task.
    step = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    step |= {"SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_TASKS_PER_NODE": "1"}
    env = {**step, **LIGHTNING, "RANK": "3"}
    assert where(env) == (3, 4, 3, 4, 0, 1)
    (message,) = warned(env, 3, 4, caplog)
    assert "Lightning" in message


def test_a_layout_gives_the_context_its_node_fields() -> None:
    env = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    assert node_layout(env, 2, 4, None, owns_group=True) == NodeLayout(2, 2, None, None, "torchrun")
