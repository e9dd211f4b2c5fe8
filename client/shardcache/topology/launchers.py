"""What each launcher tells a process about the job: its rank, the world, and which ranks share its node.

Every launcher sets variables of its own in the processes it starts:

- torchrun (TorchElastic): `RANK`, `WORLD_SIZE`; `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`,
  `GROUP_WORLD_SIZE` (nodes).
- Lightning's own launcher (`Trainer(num_nodes=N)`): `WORLD_SIZE`, `LOCAL_RANK`, `NODE_RANK`; neither the
  rank (its process group has it) nor the ranks per node.
- Open MPI (`mpirun`): `OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`, `_LOCAL_SIZE`, `_NODE_RANK`.
- Slurm (`srun`): `SLURM_PROCID`, `SLURM_STEP_NUM_TASKS` (or `SLURM_NTASKS`), `SLURM_LOCALID`, `SLURM_NODEID`,
  `SLURM_STEP_TASKS_PER_NODE` (or `SLURM_TASKS_PER_NODE`, or `SLURM_NTASKS_PER_NODE` times the nodes).

`launches(env)` reads every set present, closest launcher first: a launcher started inside another
(torchrun under `srun`, `mpirun` whose daemons `srun` started) sets its own variables for the processes it
spawned, and those are the truth for them, while the outer launcher's describe the processes *it* started.
So torchrun's `LOCAL_WORLD_SIZE` comes first, then `RANK`/`WORLD_SIZE` however they were set (by a launcher
or by hand), then Open MPI's, then Slurm's. Slurm's count only inside a job step (`SLURM_STEP_ID`, which
`srun` sets): a batch script run without `srun` is one process, whatever `--ntasks` the allocation has.

A layout must be the same on every rank, or node placement deals the data inconsistently. torchrun
(`GROUP_WORLD_SIZE`) and Slurm (`SLURM_STEP_TASKS_PER_NODE`, compressed as in `2(x3),1`) give every rank
the whole distribution, so uneven nodes are seen alike everywhere and refused alike. Open MPI gives only this
node's count (`whole=False`): ranks on nodes of different sizes would each derive another layout, so under a
process group the hosts exchanged through it decide instead (`shardcache.topology.hosts`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from shardcache.errors import ConfigError


@dataclass(frozen=True)
class NodeLayout:
    """Which ranks share this rank's node: the same on every rank of the job (sizes), and this rank's place.

    Attributes:
        local_world_size: Ranks per node (every node runs as many).
        num_nodes: Nodes of the job.
        local_rank: This rank's index on its node (None: rank % local_world_size).
        node_rank: This rank's node (None: rank // local_world_size).
        source: Where the layout came from, for messages.
    """

    local_world_size: int
    num_nodes: int
    local_rank: int | None = None
    node_rank: int | None = None
    source: str = ""


@dataclass(frozen=True)
class Launch:
    """One launcher's variables as this process sees them.

    Attributes:
        name: The launcher, for messages ("torchrun", "Slurm", ...).
        rank: This process's rank (None when the launcher does not say).
        world_size: Ranks of the job as the launcher counts them.
        layout: The node layout the variables give, None when they cannot tell.
        problem: Why the variables' layout cannot be used (ranks spread unevenly over the nodes, or numbered
            across nodes), said the same way on every rank; None when usable or absent.
        whole: Whether every rank sees the same figures (so a bad layout is seen alike everywhere).
        hint: What to set when this launcher cannot tell the layout.
    """

    name: str
    rank: int | None
    world_size: int | None
    layout: NodeLayout | None = None
    problem: str | None = None
    whole: bool = True
    hint: str = ""

    def describes(self, rank: int, world_size: int) -> bool:
        """Whether these variables are about the process with this rank in a world of this size."""
        return self.rank == rank and self.world_size == world_size


SET_LOCAL_WORLD_SIZE = (
    "set LOCAL_WORLD_SIZE (ranks per node) in every rank's environment, or pass "
    "RuntimeContext(..., local_world_size=N)"
)


def integer(env: Mapping[str, str], name: str) -> int | None:
    """The integer in `env[name]`; None when unset or empty; ConfigError naming the variable otherwise."""
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from exc


def _first(env: Mapping[str, str], *names: str) -> tuple[str, int] | None:
    for name in names:
        value = integer(env, name)
        if value is not None:
            return name, value
    return None


def launches(env: Mapping[str, str]) -> list[Launch]:
    """Every launcher's variables present in `env`, closest launcher first (see the module)."""
    found = [torchrun(env), _rank_and_world(env), open_mpi(env), slurm(env)]
    return [launch for launch in found if launch is not None]


def torchrun(env: Mapping[str, str]) -> Launch | None:
    """torchrun's variables (`LOCAL_WORLD_SIZE`, or anyone's who sets it), with `RANK` and `WORLD_SIZE`."""
    local_world_size = integer(env, "LOCAL_WORLD_SIZE")
    if local_world_size is None:
        return None
    rank = integer(env, "RANK") or 0
    world_size = integer(env, "WORLD_SIZE") or 1
    launch = Launch("torchrun", rank, world_size)
    if local_world_size < 1 or world_size % local_world_size:
        problem = (
            f"LOCAL_WORLD_SIZE={local_world_size} does not divide WORLD_SIZE={world_size}, so the nodes "
            "cannot all run as many ranks"
        )
        return Launch(launch.name, rank, world_size, problem=problem)
    num_nodes = world_size // local_world_size
    groups = integer(env, "GROUP_WORLD_SIZE")
    if groups is not None and groups != num_nodes:
        problem = (
            f"torchrun runs {local_world_size} ranks on this node (LOCAL_WORLD_SIZE) but {world_size} on "
            f"{groups} nodes (WORLD_SIZE, GROUP_WORLD_SIZE): its nodes run different numbers of ranks"
        )
        return Launch(launch.name, rank, world_size, problem=problem)
    node = _first(env, "GROUP_RANK", "NODE_RANK")
    layout = NodeLayout(
        local_world_size, num_nodes, integer(env, "LOCAL_RANK"), None if node is None else node[1], "torchrun"
    )
    return Launch(launch.name, rank, world_size, layout)


def _rank_and_world(env: Mapping[str, str]) -> Launch | None:
    """`RANK`/`WORLD_SIZE` without `LOCAL_WORLD_SIZE`: set by hand, or by Lightning's launcher (which sets
    `WORLD_SIZE`, `NODE_RANK` and `LOCAL_RANK`, and leaves the rank to the process group it creates)."""
    rank, world_size = integer(env, "RANK"), integer(env, "WORLD_SIZE")
    if rank is None and world_size is None:
        return None
    world_size = 1 if world_size is None else world_size  # RANK alone: out of range, refused as such
    if integer(env, "NODE_RANK") is not None:
        hint = (
            "Lightning's launcher (NODE_RANK, LOCAL_RANK, WORLD_SIZE) does not say how many ranks each node "
            "runs: " + SET_LOCAL_WORLD_SIZE
        )
        return Launch("Lightning", rank, world_size, hint=hint)
    return Launch("RANK/WORLD_SIZE", rank, world_size, hint=SET_LOCAL_WORLD_SIZE)


def open_mpi(env: Mapping[str, str]) -> Launch | None:
    """Open MPI's `OMPI_COMM_WORLD_*` variables (`mpirun`)."""
    world_size = integer(env, "OMPI_COMM_WORLD_SIZE")
    if world_size is None:
        return None
    rank = integer(env, "OMPI_COMM_WORLD_RANK")
    local_world_size = integer(env, "OMPI_COMM_WORLD_LOCAL_SIZE")
    if local_world_size is None or local_world_size < 1 or world_size % local_world_size:
        hint = f"Open MPI runs {local_world_size} of {world_size} ranks on this node: " + SET_LOCAL_WORLD_SIZE
        return Launch("Open MPI", rank, world_size, whole=False, hint=hint)
    layout = NodeLayout(
        local_world_size,
        world_size // local_world_size,
        integer(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
        integer(env, "OMPI_COMM_WORLD_NODE_RANK"),
        "Open MPI",
    )
    return Launch("Open MPI", rank, world_size, layout, whole=False)


_TASKS = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def tasks_per_node(name: str, value: str) -> list[int]:
    """Slurm's compressed tasks-per-node list (`2(x3),1` is [2, 2, 2, 1]); ConfigError naming `name`.

    Example:
        >>> tasks_per_node("SLURM_STEP_TASKS_PER_NODE", "2(x3),1")
        [2, 2, 2, 1]
    """
    counts: list[int] = []
    for item in value.split(","):
        match = _TASKS.fullmatch(item.strip())
        if match is None:
            raise ConfigError(
                f"environment variable {name}={value!r} is not Slurm's tasks-per-node list (such as "
                "'2(x3),1')"
            )
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


def slurm(env: Mapping[str, str]) -> Launch | None:
    """Slurm's variables in a job step started by `srun` (see the module)."""
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")
    rank = integer(env, "SLURM_PROCID")
    world = _first(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
    if not step or rank is None or world is None:
        return None
    world_size = world[1]
    counts, source = _slurm_counts(env)
    if counts is None or sum(counts) != world_size:
        hint = f"Slurm's step of {world_size} tasks names no tasks per node: " + SET_LOCAL_WORLD_SIZE
        return Launch("Slurm", rank, world_size, hint=hint)
    if len(set(counts)) > 1:
        problem = (
            f"Slurm runs different numbers of tasks on the step's nodes ({source}): launch with "
            "--ntasks-per-node so that every node runs as many"
        )
        return Launch("Slurm", rank, world_size, problem=problem)
    node = integer(env, "SLURM_NODEID")
    layout = NodeLayout(counts[0], len(counts), integer(env, "SLURM_LOCALID"), node, "Slurm")
    return Launch("Slurm", rank, world_size, layout)


def _slurm_counts(env: Mapping[str, str]) -> tuple[list[int] | None, str]:
    """Tasks on each node of the step, and the variable that said so; the step's own first."""
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        value = env.get(name)
        if value:
            return tasks_per_node(name, value), f"{name}={value}"
    per_node = integer(env, "SLURM_NTASKS_PER_NODE")
    nodes = _first(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
    if per_node is None or nodes is None:
        return None, ""
    return [per_node] * nodes[1], f"SLURM_NTASKS_PER_NODE={per_node} on {nodes[0]}={nodes[1]}"
