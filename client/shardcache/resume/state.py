"""What a resume state is: its one version number, its envelope, the layout of each kind, and the live slot
a facade answers `state_dict()` from.

Every state a trainer checkpoints is a JSON-serialisable dict that starts with the same envelope — the
format `version`, the `fingerprint` of what it was taken from, the short descriptions of that pipeline's
parts (`stages`, for a refusal that names what differs: `shardcache.resume.check`) and the `epoch` — and
then what its kind needs (`DatasetState`, `LoaderState`, `MergedState`). Each node's own position sits
under ``pipeline`` in the node's own format (its `state_dict()`); this package reads a node's keys only to
replay an elastic resume (`shardcache.resume.elastic`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypedDict

from shardcache.errors import StateError
from shardcache.resume.check import mismatch_message

# The one format version of every state (a reader's own, a TorchLoader's, merged, elastic). Raise it when
# a change makes older states unreadable, and refuse the old ones with a message (`check_version`).
STATE_VERSION = 1


class Envelope(TypedDict):
    """The keys every state starts with."""

    version: int
    fingerprint: str
    stages: list[str]
    epoch: int


class DatasetState(Envelope):
    """`Dataset.state_dict()`: one slot (rank × worker) of a pipeline."""

    slot: int
    total_slots: int
    pipeline: dict[str, Any]  # the top node's state, which holds the nodes below it under "up"
    skipped_shards: int  # a count carried across a resume, not a position


class LoaderState(Envelope):
    """`TorchLoader.state_dict()`: one data-parallel rank's loader, its workers under ``pipeline``."""

    kind: str  # "torch_loader"
    num_workers: int
    dp_rank: int
    dp_size: int
    node_groups: int
    partitioning: list[Any] | None  # what an elastic resume through a loader-side shuffle replays
    origin: dict[str, Any] | None  # where an elastic resume started this epoch
    pipeline: dict[str, Any]


class MergedState(TypedDict):
    """`merge_states(...)`: every rank's state, loadable on any layout (`shardcache.resume.elastic`)."""

    version: int
    kind: str  # "merged"
    of: str  # "dataset" | "torch_loader"
    fingerprint: str
    epoch: int
    states: list[dict[str, Any]]


def check_version(state: Mapping[str, Any], what: str) -> None:
    """Refuse a state of another format version; `what` names the state in the message."""
    version = state.get("version")
    if version != STATE_VERSION:
        raise StateError(f"{what} version {version!r} is not supported (expected {STATE_VERSION})")


def check_fingerprint(
    state: Mapping[str, Any],
    fingerprint: str,
    parts: Sequence[str],
    taken_from: str,
    described: Mapping[str, Any] | None = None,
) -> None:
    """Refuse a state taken from another pipeline, naming what differs (`described`: the state whose
    ``stages`` describe it, when `state` is a merged one)."""
    if state.get("fingerprint") != fingerprint:
        raise StateError(
            f"{taken_from}: {mismatch_message(described if described is not None else state, parts)} "
            f"(fingerprint {state.get('fingerprint')} != {fingerprint})"
        )


class Checkpointed(Protocol):
    """An iterator whose position is a state."""

    def state_dict(self) -> dict[str, Any]: ...


class LiveState:
    """What a facade's `state_dict()` answers from: its latest iterator, else a state loaded and not yet
    used. Pickled (a Dataset going to DataLoader workers) without the iterator."""

    __slots__ = ("iterator", "pending")

    def __init__(self) -> None:
        self.iterator: Checkpointed | None = None
        self.pending: dict[str, Any] | None = None

    def state_dict(self, not_iterated: str) -> dict[str, Any]:
        """The latest iterator's state, or the pending one; StateError(`not_iterated`) when neither."""
        if self.iterator is not None:
            return self.iterator.state_dict()
        if self.pending is not None:
            return self.pending
        raise StateError(not_iterated)

    def take_pending(self) -> dict[str, Any] | None:
        """The loaded state, once: the iteration starting now consumes it."""
        pending, self.pending = self.pending, None
        return pending

    def __getstate__(self) -> dict[str, Any]:
        return {"pending": self.pending}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.iterator, self.pending = None, state["pending"]
