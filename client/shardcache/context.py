"""Where a pipeline runs: rank, worker, seed, epoch, and the data-parallel mesh.

`RuntimeContext.slot` / `total_slots` decide which shards a reader gets. With a `DataLoadMesh` the slot
comes from the data-parallel rank only, so tensor-parallel co-members read identical data.

Nodes: `local_world_size` ranks share a node, `num_nodes` = world_size // local_world_size of them; rank r
runs on node `node_rank` (r // local_world_size unless given, as torchrun numbers ranks); `from_runtime`
learns them from the launcher's variables or the process group's hosts (`shardcache.topology`). Node
placement (`sources.deal.partition`) gives each node a fixed share of the data so its daemon's cache keeps
serving it; it groups data-parallel ranks, not global ranks: the data "node groups" are gcd(num_nodes,
dp_size) contiguous blocks of dp ranks. With the usual mesh (dp outer, tensor/pipeline parallel inside a
node) that is exactly one group per node. When a model-parallel group spans nodes, several nodes serve one
data-parallel rank: they form one group, read the same shards and each caches them (its daemon still keeps
them across epochs).
"""

from __future__ import annotations

import contextlib
import math
import operator
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from shardcache.errors import ConfigError
from shardcache.mesh import DataLoadMesh
from shardcache.topology import node_layout, rank_and_world
from shardcache.topology.launchers import integer


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    value = integer(env, name)
    return default if value is None else value


# The worker a TorchLoader thread runs as (`worker_thread`): torch's worker info is one per process.
_thread_worker = threading.local()


@contextlib.contextmanager
def worker_thread(worker_id: int, num_workers: int) -> Iterator[None]:
    """Run the body as DataLoader worker `worker_id` of `num_workers`, in this thread only.

    TorchLoader's thread workers (`shardcache.loader.threads`) run each worker's slot on its own thread
    of the trainer's process; inside, everything that asks which worker it is (`torch_worker_id`,
    `in_main_process`, `RuntimeContext.resolve`) answers as a worker process would.
    """
    _thread_worker.info = (worker_id, num_workers)
    try:
        yield
    finally:
        _thread_worker.info = None


def _torch_worker_info() -> tuple[int, int] | None:
    thread: tuple[int, int] | None = getattr(_thread_worker, "info", None)
    if thread is not None:
        return thread
    # Only consult torch when it is already imported: importing it here would cost seconds for nothing.
    data = sys.modules.get("torch.utils.data")
    if data is None:
        return None
    info = data.get_worker_info()
    return None if info is None else (int(info.id), int(info.num_workers))


def torch_worker_id() -> int | None:
    """The id of the torch DataLoader worker running this code (None in the trainer's own process), or of
    the worker a TorchLoader thread runs as (`worker_thread`)."""
    info = _torch_worker_info()
    return None if info is None else info[0]


def torch_distributed() -> ModuleType | None:
    """`torch.distributed` when it is imported and initialised in this process, else None."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def in_main_process() -> bool:
    """False inside a torch DataLoader worker (or a TorchLoader thread running as one: `worker_thread`)."""
    return _torch_worker_info() is None


_INT_FIELDS = (
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
)


def _as_int(name: str, value: Any) -> int:
    """`value` as an int (anything with `__index__`, not a bool), else ConfigError naming `name`."""
    if isinstance(value, bool):
        raise ConfigError(f"RuntimeContext({name}={value!r}): expected an integer")
    try:
        return operator.index(value)
    except TypeError:
        raise ConfigError(f"RuntimeContext({name}={value!r}): expected an integer") from None


def _check_range(name: str, value: int, low: int, high: int | None = None, bound: str = "") -> None:
    """ConfigError naming `name` unless low <= value (< high, the field `bound`)."""
    if value < low:
        raise ConfigError(f"RuntimeContext({name}={value}): must be >= {low}")
    if high is not None and value >= high:
        raise ConfigError(f"RuntimeContext({name}={value}): must be in [{low}, {bound}={high})")


def _node_sizes(world_size: int, local_world_size: int | None, num_nodes: int | None) -> tuple[int, int]:
    """(local_world_size, num_nodes), each derived from the other when not given; they must multiply to
    world_size (every node runs the same number of ranks)."""
    if num_nodes is not None:
        _check_range("num_nodes", num_nodes, 1)
    if local_world_size is None:
        if num_nodes is None:
            return world_size, 1
        if world_size % num_nodes:
            raise ConfigError(
                f"RuntimeContext(num_nodes={num_nodes}): must divide world_size={world_size} (every node "
                "runs the same number of ranks)"
            )
        return world_size // num_nodes, num_nodes
    _check_range("local_world_size", local_world_size, 1)
    if world_size % local_world_size:
        raise ConfigError(
            f"RuntimeContext(local_world_size={local_world_size}): must divide world_size={world_size} "
            "(ranks per node; every node runs the same number of ranks)"
        )
    derived = world_size // local_world_size
    if num_nodes is not None and num_nodes != derived:
        raise ConfigError(
            f"RuntimeContext(num_nodes={num_nodes}): must be world_size // local_world_size = "
            f"{world_size} // {local_world_size} = {derived}, or left out to be derived"
        )
    return local_world_size, derived


@dataclass(frozen=True, init=False)
class RuntimeContext:
    """Rank, node, worker, epoch, seed and mesh of one reader (mvp-dataset 0.2.3's fields, in its order).

    The node layout (`local_rank`, `local_world_size`, `node_rank`, `num_nodes`) is derived from what is
    given, as torchrun numbers ranks (rank = node_rank × local_world_size + local_rank):

    - nothing: one node of `world_size` ranks;
    - `local_world_size`: `num_nodes = world_size // local_world_size` (it must divide world_size);
    - `num_nodes`: `local_world_size = world_size // num_nodes` (it must divide world_size);
    - `local_rank` / `node_rank`: default to rank % local_world_size and rank // local_world_size.

    Both layout sizes given must agree (`num_nodes × local_world_size == world_size`): node placement
    (`shardcache.sources.deal.partition`) gives each of the `num_nodes` nodes a fixed share of the data.

    Args:
        rank: Global rank of this process.
        world_size: Number of ranks.
        local_rank: This rank's index on its node (torchrun's LOCAL_RANK).
        local_world_size: Ranks per node (torchrun's LOCAL_WORLD_SIZE).
        node_rank: The node this rank runs on (NODE_RANK).
        num_nodes: Number of nodes.
        worker_id: DataLoader worker index within this rank.
        num_workers: DataLoader workers per rank (1 when iterating in the main process).
        epoch: Epoch; shard orders and shuffles are deterministic from (seed, epoch).
        seed: Base seed of every shuffle.
        mesh: Optional data-parallel mesh; slots then count data-parallel ranks only.

    Raises:
        ConfigError: (a ValueError) a value out of range or a node layout that does not add up; the
            message names the field.

    Example:
        >>> RuntimeContext(rank=5, world_size=8, local_world_size=4).node_rank
        1
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    worker_id: int
    num_workers: int
    epoch: int
    seed: int
    mesh: DataLoadMesh | None

    def __init__(
        self,
        rank: int | None = None,
        world_size: int | None = None,
        local_rank: int | None = None,
        local_world_size: int | None = None,
        node_rank: int | None = None,
        num_nodes: int | None = None,
        worker_id: int | None = None,
        num_workers: int | None = None,
        epoch: int = 0,
        seed: int = 0,
        mesh: DataLoadMesh | None = None,
    ) -> None:
        # Whether this context names its reader (see `places_reader`); left out, the defaults below apply.
        placement = (rank, world_size, local_rank, local_world_size, node_rank, num_nodes)
        given = any(value is not None for value in (*placement, worker_id, num_workers))
        object.__setattr__(self, "_places_reader", given)
        rank = 0 if rank is None else _as_int("rank", rank)
        world_size = 1 if world_size is None else _as_int("world_size", world_size)
        worker_id = 0 if worker_id is None else _as_int("worker_id", worker_id)
        num_workers = 1 if num_workers is None else _as_int("num_workers", num_workers)
        epoch, seed = _as_int("epoch", epoch), _as_int("seed", seed)
        _check_range("world_size", world_size, 1)
        _check_range("rank", rank, 0, world_size, "world_size")
        _check_range("num_workers", num_workers, 1)
        _check_range("worker_id", worker_id, 0, num_workers, "num_workers")
        _check_range("epoch", epoch, 0)
        lws, nodes = _node_sizes(
            world_size,
            None if local_world_size is None else _as_int("local_world_size", local_world_size),
            None if num_nodes is None else _as_int("num_nodes", num_nodes),
        )
        local = rank % lws if local_rank is None else _as_int("local_rank", local_rank)
        node = rank // lws if node_rank is None else _as_int("node_rank", node_rank)
        _check_range("local_rank", local, 0, lws, "local_world_size")
        _check_range("node_rank", node, 0, nodes, "num_nodes")
        values = (rank, world_size, local, lws, node, nodes, worker_id, num_workers, epoch, seed)
        for name, value in zip(_INT_FIELDS, values, strict=True):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "mesh", mesh)

    def identity(self) -> dict[str, object]:
        """What names this reader across processes (mvp-dataset's): rank, world_size, seed and the mesh's
        dp_rank/dp_size (None without a mesh). Workers, epoch and the node layout are not part of it."""
        mesh = None if self.mesh is None else {"dp_rank": self.mesh.dp_rank, "dp_size": self.mesh.dp_size}
        return {"rank": self.rank, "world_size": self.world_size, "seed": self.seed, "mesh": mesh}

    @property
    def node(self) -> int:
        """The node this rank runs on (`node_rank`); balance's `topology="node"` prefers donors on it."""
        return self.node_rank

    @property
    def node_groups(self) -> int:
        """Groups of data-parallel ranks that node placement gives one fixed share each (see the module)."""
        return math.gcd(self.num_nodes, self.dp_size)

    @property
    def node_group(self) -> int:
        """This reader's node group: its data-parallel rank's block (see `node_groups`)."""
        return self.dp_rank // (self.dp_size // self.node_groups)

    @property
    def dp_rank(self) -> int:
        """Data-parallel rank: the mesh's when one is set, else the global rank."""
        return self.mesh.dp_rank if self.mesh is not None else self.rank

    @property
    def dp_size(self) -> int:
        """Data-parallel size: the mesh's when one is set, else the world size."""
        return self.mesh.dp_size if self.mesh is not None else self.world_size

    @property
    def slot(self) -> int:
        """This reader's slot: dp_rank × num_workers + worker_id."""
        return self.dp_rank * self.num_workers + self.worker_id

    @property
    def total_slots(self) -> int:
        """Number of slots: dp_size × num_workers."""
        return self.dp_size * self.num_workers

    @property
    def sample_shuffle_seed(self) -> int:
        """Seed of sample-level shuffles in this slot (TP co-members share it)."""
        return self.seed + self.slot

    @property
    def places_reader(self) -> bool:
        """Whether this context names its reader: any of rank, world_size, the node layout, worker_id or
        num_workers was given. One that gives only seed, epoch or mesh (`RuntimeContext(seed=7)`) leaves
        the reader to the runtime: `resolve()` takes rank and workers from torch and the environment at
        iteration, as mvp-dataset does, so a seeded context in a DDP job still shards across the ranks."""
        return bool(self.__dict__.get("_places_reader", True))

    def resolve(self) -> RuntimeContext:
        """The context a reader uses: this one (with the torch DataLoader worker running it) when it places
        its reader, else the runtime's rank and workers with this context's seed, epoch and mesh."""
        if self.places_reader:
            return self.in_current_worker()
        return RuntimeContext.from_runtime(base=self)

    def with_epoch(self, epoch: int) -> RuntimeContext:
        """The same context at another epoch (a seed-only context stays one: see `places_reader`)."""
        moved = replace(self, epoch=epoch)
        object.__setattr__(moved, "_places_reader", self.places_reader)
        return moved

    def in_current_worker(self) -> RuntimeContext:
        """This context with worker_id/num_workers from the torch DataLoader worker running it, if any.

        A context built in the main process says num_workers=1; inside a worker it must count workers.
        """
        info = _torch_worker_info()
        if info is None or self.num_workers != 1:
            return self
        return replace(self, worker_id=info[0], num_workers=info[1])

    @classmethod
    def from_runtime(
        cls,
        *,
        base: RuntimeContext | None = None,
        seed: int = 0,
        env: Mapping[str, str] | None = None,
        prefer_torch: bool = True,
        mesh: DataLoadMesh | None = None,
        device_mesh: Any = None,
        dp_dims: str | Sequence[str] | None = None,
    ) -> RuntimeContext:
        """A context from torch.distributed and DataLoader worker info, else the launcher's environment.

        Rank and world size: the process group's, else the launcher's (RANK and WORLD_SIZE, else Open MPI's
        OMPI_COMM_WORLD_RANK/_SIZE, else Slurm's SLURM_PROCID/SLURM_STEP_NUM_TASKS in an `srun` step).
        Workers: the DataLoader worker running this code, else WORKER and NUM_WORKERS. The node layout: the
        closest launcher's variables that describe this rank (torchrun's LOCAL_WORLD_SIZE, LOCAL_RANK,
        GROUP_RANK or NODE_RANK; Open MPI's; Slurm's tasks per node), else the hosts of the process group's
        ranks, exchanged once per group; else one node, with one warning per process naming what to set
        (`shardcache.topology`, docs/cluster.md "Launchers").

        Args:
            base: Inherit seed, epoch and mesh from this context.
            seed: Base seed (ignored when `base` is given).
            env: Environment to read (default `os.environ`).
            prefer_torch: Let live torch values (rank, world size, worker) override the environment.
            mesh: A ready `DataLoadMesh`.
            device_mesh: A torch `DeviceMesh`, wrapped with `dp_dims`.
            dp_dims: Data-parallel dimension names of `device_mesh`.

        Raises:
            ConfigError: a variable that is not an integer or out of range (named in the message), or
                `SHARDCACHE_LAYOUT_WAIT_S` that is not a positive number of seconds.
        """
        if mesh is not None and (device_mesh is not None or dp_dims is not None):
            raise ConfigError(
                "RuntimeContext.from_runtime: pass either mesh= or device_mesh=/dp_dims=, not both"
            )
        if (device_mesh is None) != (dp_dims is None):
            raise ConfigError("RuntimeContext.from_runtime: device_mesh= and dp_dims= go together")
        if device_mesh is not None and dp_dims is not None:
            mesh = DataLoadMesh(device_mesh, (dp_dims,) if isinstance(dp_dims, str) else tuple(dp_dims))
        epoch = 0
        if base is not None:
            seed, epoch = base.seed, base.epoch
            mesh = mesh if mesh is not None else base.mesh
        source = os.environ if env is None else env
        rank, world_size = rank_and_world(source)
        worker_id = _env_int(source, "WORKER", 0)
        num_workers = _env_int(source, "NUM_WORKERS", 1)
        dist = torch_distributed() if prefer_torch else None
        if dist is not None:
            rank, world_size = int(dist.get_rank()), int(dist.get_world_size())
        info = _torch_worker_info() if prefer_torch else None
        if info is not None:
            worker_id, num_workers = info
        layout = node_layout(source, rank, world_size, dist, owns_group=in_main_process())
        return cls(
            rank=rank,
            world_size=world_size,
            local_rank=None if layout is None else layout.local_rank,
            local_world_size=None if layout is None else layout.local_world_size,
            node_rank=None if layout is None else layout.node_rank,
            worker_id=worker_id,
            num_workers=num_workers,
            epoch=epoch,
            seed=seed,
            mesh=mesh,
        )
