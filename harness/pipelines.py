"""Helpers shared by the pipeline tests: small shard sets, a duck-typed device mesh, the resume contract."""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from shardcache import Dataset, RuntimeContext

PLANS_DEADLINE_S = 30.0


def plans_when(client: Any, count: int) -> list[dict[str, Any]]:
    """The daemon's plans, by epoch, once it holds `count` of them (or the deadline passed): a slot
    registers its next epoch's plan from a background thread, shortly after its first sample."""
    deadline = time.monotonic() + PLANS_DEADLINE_S
    while True:
        plans = sorted(client.plans(), key=lambda plan: plan["epoch"])
        if len(plans) >= count or time.monotonic() > deadline:
            return plans
        time.sleep(0.02)  # polling the daemon with a deadline, not waiting for readiness blindly


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


class Resumable(Protocol):
    """A Dataset or a TorchLoader: iterable, with the state contract."""

    def __iter__(self) -> Iterator[Any]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _iterate(obj: Resumable, context: RuntimeContext | None) -> Iterator[Any]:
    return obj.iter_context(context) if isinstance(obj, Dataset) else iter(obj)


def _close(it: Iterator[Any]) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()


# States hold positions, never samples: a few hundred bytes per stage and worker.
MAX_STATE_BYTES = 4096


def _round_trip(state: dict[str, Any]) -> dict[str, Any]:
    """The state as a checkpoint stores it: through JSON, so a non-serialisable or tuple-keyed state fails."""
    text = json.dumps(state)
    assert len(text) <= MAX_STATE_BYTES, f"a resume state of {len(text)} bytes is not small: {text[:200]}..."
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _resumed_tail(
    make: Callable[[], Resumable], state: dict[str, Any], context: RuntimeContext | None
) -> list[Any]:
    resumed = make()
    resumed.load_state_dict(_round_trip(state))
    return list(_iterate(resumed, context))


def assert_resumes(
    make: Callable[[], Resumable],
    points: Iterable[int],
    context: RuntimeContext | None = None,
    *,
    hop: bool = True,
) -> None:
    """The resume contract (torchdata's `run_test_save_load_state`), for any Dataset or TorchLoader.

    For each n in `points`: iterate a fresh pipeline n items, take `state_dict()`, round-trip it through
    JSON, load it into ANOTHER fresh pipeline from `make()`, and check that the head plus the resumed tail
    equals the uninterrupted run: nothing lost, nothing repeated, same order. With `hop`, the resumed run
    is itself interrupted halfway and resumed once more (a state taken after a resume is as good), and a
    state loaded but not yet iterated is returned unchanged by `state_dict()`.
    """
    full = list(_iterate(make(), context))
    for n in sorted({min(n, len(full)) for n in points}):
        first = make()
        it = _iterate(first, context)
        head = [next(it) for _ in range(n)]
        state = _round_trip(first.state_dict())
        _close(it)
        if not hop:
            assert head + _resumed_tail(make, state, context) == full, f"resume after {n} items diverged"
            continue
        second = make()
        second.load_state_dict(state)
        assert _round_trip(second.state_dict()) == state, "a loaded, unused state must read back unchanged"
        it = _iterate(second, context)
        middle = [next(it) for _ in range((len(full) - n) // 2)]
        again = _round_trip(second.state_dict())
        _close(it)
        tail = _resumed_tail(make, again, context)
        assert head + middle + tail == full, f"resume after {n} then {len(middle)} more items diverged"
