"""`DataLoadMesh`: the data-parallel dimensions of a device mesh, read once where it is built.

A `RuntimeContext` with a mesh counts slots over data-parallel ranks only (`shardcache.context`), so
tensor-parallel co-members read identical data. A real `torch.distributed.device_mesh.DeviceMesh` is read by
dimension name through `mesh_dim_names` (its `size()` takes an index) when the mesh is built, in the
trainer's process, and only names, shape and coordinate travel to DataLoader workers (a DeviceMesh holds
process groups and does not pickle).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shardcache.errors import ConfigError


@dataclass(frozen=True)
class DataLoadMesh:
    """The data-parallel dimensions of a device mesh.

    Ranks that share `dp_rank` read identical data (tensor-parallel co-members); ranks with different
    `dp_rank` read disjoint data.

    The mesh is read once, here, in the process that builds it (the trainer's main process): its dimension
    names, shape and this rank's coordinate. Only those travel when the object is pickled (to DataLoader
    workers under spawn or forkserver), since a torch `DeviceMesh` holds process groups; a copy's
    `device_mesh` is None. Two meshes are equal when they name the same data-parallel dimensions of the same
    shape at the same coordinate.

    Args:
        device_mesh: A `torch.distributed.device_mesh.DeviceMesh` with named dimensions
            (`init_device_mesh(..., mesh_dim_names=...)`). A stand-in (tests, simulations) needs
            `mesh_dim_names`, and `size(name)` and `get_local_rank(name)` by dimension name.
        dp_dims: Names of the data-parallel dimensions, outermost first.

    Example:
        >>> mesh = init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))  # doctest: +SKIP
        >>> ctx = RuntimeContext.from_runtime(mesh=DataLoadMesh(mesh, ("dp",)))  # doctest: +SKIP
    """

    device_mesh: Any = field(compare=False, repr=False)
    dp_dims: tuple[str, ...]
    mesh_dim_names: tuple[str, ...] = field(init=False)
    mesh_shape: tuple[int, ...] = field(init=False)
    coordinate: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        dims = (self.dp_dims,) if isinstance(self.dp_dims, str) else tuple(self.dp_dims)
        if not dims:
            raise ConfigError("DataLoadMesh(dp_dims=...): give at least one data-parallel dimension name")
        names, shape, coordinate = _read_device_mesh(self.device_mesh)
        unknown = [dim for dim in dims if dim not in names]
        if unknown:
            raise ConfigError(
                f"DataLoadMesh(dp_dims={dims!r}): the device mesh has no dimension named "
                f"{', '.join(map(repr, unknown))}; its dimensions are {names!r}"
            )
        object.__setattr__(self, "dp_dims", dims)
        object.__setattr__(self, "mesh_dim_names", names)
        object.__setattr__(self, "mesh_shape", shape)
        object.__setattr__(self, "coordinate", coordinate)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "device_mesh": None}

    def _sizes_and_ranks(self, dims: Sequence[str]) -> list[tuple[int, int]]:
        index = {name: i for i, name in enumerate(self.mesh_dim_names)}
        return [(self.mesh_shape[index[d]], self.coordinate[index[d]]) for d in dims]

    @property
    def dp_rank(self) -> int:
        """This rank's index flattened over the data-parallel dimensions (row-major)."""
        rank = 0
        for size, local in self._sizes_and_ranks(self.dp_dims):
            rank = rank * size + local
        return rank

    @property
    def dp_size(self) -> int:
        """The product of the data-parallel dimension sizes."""
        return math.prod(size for size, _ in self._sizes_and_ranks(self.dp_dims))

    @property
    def is_dp_leader(self) -> bool:
        """Whether this rank is local rank 0 on every non-data-parallel dimension (writes shared outputs)."""
        others = [d for d in self.mesh_dim_names if d not in self.dp_dims]
        return all(local == 0 for _, local in self._sizes_and_ranks(others))


def _is_torch_device_mesh(device_mesh: object) -> bool:
    # A real DeviceMesh means its module is imported already: never import torch here for the check.
    module = sys.modules.get("torch.distributed.device_mesh")
    return module is not None and isinstance(device_mesh, module.DeviceMesh)


def _read_device_mesh(device_mesh: Any) -> tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]]:
    """The dimension names, shape and this rank's coordinate of a device mesh."""
    names = tuple(getattr(device_mesh, "mesh_dim_names", None) or ())
    if not names:
        raise ConfigError(
            f"DataLoadMesh: the device mesh {device_mesh!r} has no dimension names; build it with "
            "init_device_mesh(..., mesh_dim_names=(...)) and pass the data-parallel names as dp_dims"
        )
    # torch's DeviceMesh.size() takes a dimension index (get_local_rank takes either); stand-ins take names.
    dims: Sequence[int | str] = range(len(names)) if _is_torch_device_mesh(device_mesh) else names
    shape = tuple(int(device_mesh.size(d)) for d in dims)
    coordinate = tuple(int(device_mesh.get_local_rank(d)) for d in dims)
    return names, shape, coordinate
