"""Helpers shared by the pipeline tests: small shard sets, a duck-typed device mesh, the resume contract."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from shardcache import Dataset, RuntimeContext


def write_tar(path: Path, members: Iterable[tuple[str, bytes]], fmt: int = tarfile.USTAR_FORMAT) -> Path:
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def make_tars(root: Path, count: int, samples: int, prefix: str = "shard") -> list[str]:
    """`count` shards of `samples` samples each, keys `s{shard}_{i}`, fields `txt` and `json`."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(count):
        members = []
        for i in range(samples):
            key = f"s{s:03d}_{i:04d}"
            members.append((f"{key}.txt", f"{prefix}-{s}-{i}".encode()))
            members.append((f"{key}.json", json.dumps({"shard": s, "i": i}).encode()))
        paths.append(str(write_tar(root / f"{prefix}_{s:06d}.tar", members)))
    return paths


def keys(samples: Iterable[dict[str, Any]]) -> list[str]:
    return [s["__key__"] for s in samples]


def slot_contexts(total: int, workers: int = 1, **kw: Any) -> list[RuntimeContext]:
    """One context per slot: `total // workers` ranks of `workers` workers each."""
    ranks = total // workers
    return [
        RuntimeContext(rank=r, world_size=ranks, worker_id=w, num_workers=workers, **kw)
        for r in range(ranks)
        for w in range(workers)
    ]


class FakeDeviceMesh:
    """A stand-in for torch's DeviceMesh (size/get_local_rank per dim); a real one needs a process group."""

    def __init__(self, dims: dict[str, int], coords: dict[str, int]) -> None:
        self.dims = dims
        self.coords = coords
        self.mesh_dim_names = tuple(dims)

    def size(self, dim: str) -> int:
        return self.dims[dim]

    def get_local_rank(self, dim: str) -> int:
        return self.coords[dim]


def assert_resumes(
    make: Callable[[], Dataset], points: Iterable[int], context: RuntimeContext | None = None
) -> None:
    """The resume contract: a state taken after n items, loaded into a fresh pipeline, yields the rest."""
    full = list(make().iter_context(context))
    for n in sorted({min(n, len(full)) for n in points}):
        ds = make()
        it = ds.iter_context(context)
        head = [next(it) for _ in range(n)]
        state = json.loads(json.dumps(ds.state_dict()))
        resumed = make()
        resumed.load_state_dict(state)
        tail = list(resumed.iter_context(context))
        assert head + tail == full, f"resume after {n} items diverged"
