"""What a resume state is: its one version number, its envelope, the layout of each kind, and the live slot
a facade answers `state_dict()` from.

A state a trainer checkpoints is mvp-dataset 0.2.3's envelope, JSON-serialisable (`wrap`):

    {"version": 2,
     "identity": {"runtime": ..., "source": {...}, "stages": [{"kind": ...}, ...], "loader": {...} | None,
                  "shardcache": {"fingerprint": ..., "stages": [...], ...}},
     "state": {...} | None}

``state`` is None where the pass starts from the beginning: before any iteration, and once the iterator is
exhausted (the next pass starts anew; the end position stays under ``end``, for `merge_states`).
``identity`` is what a state must match to load (`check_identity`, `check_seed`); its ``shardcache`` part
holds this package's own identity keys (`IDENTITY_KEYS`: the `fingerprint`, the short descriptions of the
pipeline's parts for a refusal that names what differs, `shardcache.resume.check`, the seed and a loader's
layout); ``source``/``stages``/``loader`` are read-only views of those descriptions, for code that reads
mvp's keys. Inside, every reader works on the *flat* layout — version 1's, one dict: the identity keys then
what each kind needs (`DatasetState`, `LoaderState`, `MergedState`) — which `unwrap` returns; a TorchLoader
hands its workers flat states, and version-1 checkpoints are flat states that still load. Each node's own
position sits under ``pipeline`` in the node's own format (its `state_dict()`); this package reads a node's
keys only to replay an elastic resume (`shardcache.resume.elastic`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, Protocol, TypedDict, cast

from shardcache.errors import StateError
from shardcache.node import Node, State
from shardcache.resume.check import identity_views, mismatch_message
from shardcache.sources.base import unit_round
from shardcache.sources.deal.pieces import OriginState

logger = logging.getLogger(__name__)

# The one format version of every state (a reader's own, a TorchLoader's, merged, elastic). Raise it when
# a change makes older states unreadable, and refuse the old ones with a message (`check_version`).
# 2: mvp-dataset's envelope (version, identity, state). Version 1 was the flat layout alone, which `unwrap`
# still reads (`FLAT_VERSION`), so checkpoints taken before keep their meaning.
STATE_VERSION = 2
FLAT_VERSION = 1
# The flat layout's keys that name what a state was taken from (the envelope's identity), not a position.
IDENTITY_KEYS = ("kind", "of", "fingerprint", "stages", "seed", "num_workers", "dp_rank", "dp_size")


# The flat layout as loaded (`unwrap`): a JSON object whose keys its kind's reader checks before use
# (`check_version`, `check_fingerprint`, the readers' `check_state`), then reads as one of the layouts below.
Flat = dict[str, object]


class OwnIdentity(TypedDict, total=False):
    """The envelope's ``identity.shardcache``: the flat layout's `IDENTITY_KEYS` a state has."""

    kind: str
    of: str
    fingerprint: str
    stages: list[str]
    seed: int
    num_workers: int
    dp_rank: int
    dp_size: int


class Identity(TypedDict):
    """The envelope's ``identity``: the reader's runtime, mvp-dataset's views (`identity_views`) and this
    package's own keys."""

    runtime: object  # `RuntimeContext.identity()`; for a merged state, its first rank's seed or None
    source: object
    stages: object
    loader: object
    shardcache: OwnIdentity


class Envelope(TypedDict):
    """A state as `state_dict()` returns it and a checkpoint holds it (`wrap`)."""

    version: int
    identity: Identity
    state: Flat | None  # the position (`live_of`); None: the pass starts from the beginning
    end: NotRequired[Flat]  # an ended pass's position, for `merge_states`


# A state as the public API hands it over and takes it back (`Dataset.state_dict()`, `TorchLoader`'s,
# `merge_states`): the `Envelope` as a plain JSON dict, the type a trainer's checkpoint code (and torch's
# own `state_dict()`) gives it, which it may edit and store as it likes. Inside, states are the TypedDicts
# here; `public` is the one place they turn into this.
StateDict = dict[str, Any]


def public(state: Mapping[str, object]) -> StateDict:
    """`state` (an `Envelope`, or the position `live_of` gives) as the public API returns it: the same
    object, typed as the JSON dict trainers handle."""
    return cast(StateDict, state)


class Header(TypedDict):
    """The keys every flat state starts with."""

    version: int
    fingerprint: str
    stages: list[str]
    seed: int  # the context's seed (`check_seed`); version-1 states lack it
    epoch: int


class DatasetState(Header):
    """`Dataset.state_dict()`: one slot (rank × worker) of a pipeline."""

    slot: int
    total_slots: int
    pipeline: State  # the top node's state, which holds the nodes below it under "up"
    skipped_shards: int  # a count carried across a resume, not a position


class LoaderHeader(Header):
    """What a TorchLoader's state holds besides the nodes' positions (`shardcache.loader.resume.header`)."""

    kind: str  # "torch_loader"
    num_workers: int
    dp_rank: int
    dp_size: int
    node_groups: int
    # What an elastic resume through a loader-side shuffle replays: the partitioning and the epoch order
    # (`ORDER_KEY`, `sources.deal.order`) its plan was dealt in.
    partitioning: list[str | float | None] | None
    order: int
    origin: OriginState | None  # where an elastic resume started this epoch


class LoaderState(LoaderHeader):
    """`TorchLoader.state_dict()`: one data-parallel rank's loader, its workers under ``pipeline``."""

    pipeline: State  # the MergeNode's state, or the top loader-side stage's above it
    # Items the loader yielded in this epoch before this position, kept by a pass of known length (absent:
    # none known, or not known, as after an elastic resume): it ends when it reaches that length
    # (`LoaderIterator.expect`), and so does the pass resumed from it.
    items: NotRequired[int]


class MergedState(TypedDict):
    """`merge_states(...)`: every rank's state, loadable on any layout (`shardcache.resume.elastic`)."""

    version: int
    kind: str  # "merged"
    of: str  # "dataset" | "torch_loader"
    fingerprint: str
    stages: list[str]  # the first rank's, what the envelope's identity views show
    epoch: int
    states: list[Flat]  # every rank's flat state, by rank (`DatasetState` or `LoaderState`)


class ElasticState(TypedDict):
    """`resume.elastic.elastic_state`: a Dataset state that starts a reader of a new layout where an
    elastic resume's `origin` says the old layout had left off (a TorchLoader hands it to its workers)."""

    version: int
    kind: str  # "elastic"
    fingerprint: str
    origin: OriginState


def check_version(state: Mapping[str, object], what: str) -> None:
    """Refuse a flat state of another format version; `what` names the state in the message."""
    version = state.get("version")
    if version not in (STATE_VERSION, FLAT_VERSION):
        raise StateError(
            f"{what} version {version!r} is not supported (expected {STATE_VERSION})",
            code="InvalidResumeStateVersion",
        )


def wrap(flat: Mapping[str, object], runtime: object, ended: bool = False) -> Envelope:
    """The envelope of the flat state `flat` (`runtime`: the reader's `RuntimeContext.identity()`, None for
    a merged state). `ended`: the pass is over, so ``state`` is None and the next one starts anew; the end
    position stays under ``end``, for `merge_states` (a rank that finished is not one that has not begun)."""
    own = own_identity(flat)
    inner = live_of(flat)
    views = identity_views(own.get("stages") or [])
    identity: Identity = {
        "runtime": runtime,
        "source": views["source"],
        "stages": views["stages"],
        "loader": views["loader"],
        "shardcache": own,
    }
    envelope: Envelope = {"version": STATE_VERSION, "identity": identity, "state": None if ended else inner}
    if ended:
        envelope["end"] = inner
    return envelope


def own_identity(flat: Mapping[str, object]) -> OwnIdentity:
    """The identity keys of the flat state `flat` (`IDENTITY_KEYS`), as its writer put them."""
    own = {key: flat[key] for key in IDENTITY_KEYS if key in flat}
    return own  # type: ignore[return-value]  # the values are the writer's own, of OwnIdentity's types


def ended_epoch(blob: object) -> int | None:
    """The epoch of the pass an envelope says had ended (`wrap`'s ``end``), else None."""
    if not isinstance(blob, dict) or blob.get("state") is not None:
        return None
    end = blob.get("end")
    epoch = end.get("epoch") if isinstance(end, dict) else None
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None


def position_of(flat: Mapping[str, object]) -> Flat:
    """What the envelope's ``state`` holds of the flat state `flat`: all but version and identity keys."""
    return {key: value for key, value in flat.items() if key not in IDENTITY_KEYS and key != "version"}


def live_of(flat: Mapping[str, object]) -> Flat:
    """The envelope's ``state`` of the flat state `flat`: its position (`position_of`), with mvp-dataset's
    ``source`` view where there is one (`_source_view`)."""
    inner = position_of(flat)
    source = _source_view(flat.get("pipeline"))
    return inner if source is None else {**inner, "source": source}


def _source_view(pipeline: object) -> dict[str, int] | None:
    """mvp-dataset's ``state["source"]`` view (its documented checkpoint shape), read from the source at the
    bottom of a Dataset state's node chain: the epoch and ``round_index`` (the resample round). None for a
    TorchLoader's state (its workers' sources are under their own states) or a mix."""
    state = pipeline
    while isinstance(state, Mapping) and isinstance(state.get("up"), dict):
        state = Node.state_below(state)
    found = unit_round(state)
    return None if found is None else {"epoch": found[0], "round_index": found[1]}


def initial(own: Mapping[str, object], runtime: object) -> Envelope:
    """The envelope of a reader that has not begun: its identity keys `own`, ``state`` None."""
    envelope = wrap(own, runtime)
    envelope["state"] = None
    return envelope


@dataclass(frozen=True)
class Loaded:
    """A loaded state read by `unwrap`: the flat layout (identity keys only when `fresh`), whether the pass
    starts from the beginning (``state`` None), and the envelope's identity (None for a flat state)."""

    flat: Flat
    fresh: bool
    identity: Mapping[str, object] | None


def unwrap(blob: object, what: str, keep_end: bool = False) -> Loaded:
    """Read `blob`: an envelope of this version, or a flat state (version 1's checkpoints, or a TorchLoader's
    hand-off to its workers). `keep_end`: an ended envelope gives its end position (`merge_states`).

    Raises:
        StateError: [InvalidResumeState] not a state; [InvalidResumeStateVersion] another version.
    """
    if not isinstance(blob, dict):
        raise StateError(
            f"{what} {blob!r} is not a state dict; pass what state_dict() returned", code="InvalidResumeState"
        )
    if "identity" not in blob and "state" not in blob and "fingerprint" in blob:
        check_version(blob, what)
        return Loaded({**blob, "version": STATE_VERSION}, False, None)
    if blob.get("version") != STATE_VERSION:
        raise StateError(
            f"{what} version {blob.get('version')!r} is not supported (expected {STATE_VERSION})",
            code="InvalidResumeStateVersion",
        )
    identity, inner = blob.get("identity"), blob.get("state", ())
    own = identity.get("shardcache") if isinstance(identity, dict) else None
    if not isinstance(own, dict) or not (inner is None or isinstance(inner, dict)):
        raise StateError(
            f"{what} lacks its identity or state (keys {sorted(blob)}); pass what state_dict() returned",
            code="InvalidResumeState",
        )
    fresh = inner is None
    if fresh and keep_end and isinstance(blob.get("end"), dict):
        inner = blob["end"]
    # ``source`` is a view (`_source_view`), never read back: the position is the rest.
    position = {key: value for key, value in (inner or {}).items() if key != "source"}
    flat: Flat = {"version": STATE_VERSION, **own, **position}
    return Loaded(flat, fresh, identity)


def check_identity(saved: Mapping[str, object] | None, current: Mapping[str, object]) -> None:
    """Refuse an envelope whose identity differs from `current` (what this reader's states carry) where the
    fingerprint check cannot see it: the views (``source``, ``stages``, ``loader``). The runtime is checked
    against the context that iterates (`check_seed`, the slot), which an explicit context may set later.
    """
    if saved is None:
        return
    for key in ("source", "stages", "loader"):
        found = _diff(saved.get(key), current.get(key), f"identity.{key}")
        if found is not None:
            path, before, now = found
            raise StateError(
                f"path={path} expected={before!r} actual={now!r}: the state was taken from another pipeline",
                code="ResumeIdentityMismatch",
            )


def check_seed(state: Mapping[str, object], seed: int) -> None:
    """Refuse a flat state taken with another seed (version-1 states do not say theirs)."""
    saved = state.get("seed", seed)
    if saved != seed:
        raise StateError(
            f"path=identity.shardcache.seed expected={saved!r} actual={seed!r}: the state was taken with "
            "another seed; resume with the same RuntimeContext seed",
            code="ResumeIdentityMismatch",
        )


def _diff(left: object, right: object, path: str) -> tuple[str, object, object] | None:
    """The first place two JSON trees differ: (path, left value, right value), or None."""
    if isinstance(left, dict) and isinstance(right, dict):
        for key in sorted(set(left) | set(right), key=str):
            found = _diff(left.get(key), right.get(key), f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(left, list) and isinstance(right, list) and len(left) == len(right):
        for i, (a, b) in enumerate(zip(left, right, strict=True)):
            found = _diff(a, b, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    return None if left == right else (path, left, right)


def check_fingerprint(
    state: Mapping[str, object],
    fingerprint: str,
    parts: Sequence[str],
    taken_from: str,
    described: Mapping[str, object] | None = None,
) -> None:
    """Refuse a state taken from another pipeline, naming what differs (`described`: the state whose
    ``stages`` describe it, when `state` is a merged one)."""
    if state.get("fingerprint") != fingerprint:
        raise StateError(
            f"{taken_from}: {mismatch_message(described if described is not None else state, parts)} "
            f"(fingerprint {state.get('fingerprint')} != {fingerprint})",
            code="ResumeIdentityMismatch",
        )


class Checkpointed(Protocol):
    """An iterator whose position is a state."""

    exhausted: bool  # it raised StopIteration: its state is None, the next pass starts anew
    started: bool  # it yielded an item

    def state_dict(self) -> StateDict: ...


# mvp-dataset's words, which its users' log filters may match.
REPLACED_WARNING = (
    "iter() called while a previous iterator is still active; state_dict() on this handle will follow the "
    "new iterator."
)


class LiveState:
    """What a facade's `state_dict()` answers from: its latest iterator, else a state loaded and not yet
    used, else the facade's initial state. Pickled (a Dataset going to DataLoader workers) without the
    iterator."""

    __slots__ = ("iterator", "loaded", "pending")

    def __init__(self) -> None:
        self.iterator: Checkpointed | None = None
        self.loaded: StateDict | None = None  # the envelope load_state_dict took, until used
        self.pending: Flat | None = None  # its flat layout (None: start from the beginning)

    def state_dict(self, initial: Callable[[], StateDict]) -> StateDict:
        """The latest iterator's state (``state`` None once it is exhausted), else the loaded one, else
        `initial()`: the pass starts from the beginning (mvp-dataset answers so before any iteration)."""
        if self.iterator is not None:
            return self.iterator.state_dict()
        if self.loaded is not None:
            return self.loaded
        return initial()

    def load(self, blob: Mapping[str, object], pending: Flat | None) -> None:
        """Keep a checked state for the next iteration (`pending` None: it starts from the beginning); a
        version-1 state is answered by state_dict() in this version's envelope."""
        # An envelope is kept as given (checked by `unwrap`), so state_dict() answers it unchanged.
        self.loaded = public(blob if "identity" in blob else wrap(blob, None))
        self.pending = pending

    def start(self, iterator: Checkpointed, warn: bool) -> None:
        """Make `iterator` the latest, warning (`warn`: in the trainer's process) when the one it replaces
        had not ended: state_dict() no longer follows that one."""
        previous = self.iterator
        # One that never yielded (a framework's iter() only checking that the loader iterates) replaced
        # nothing the trainer could have saved.
        if warn and previous is not None and previous.started and not previous.exhausted:
            logger.warning(REPLACED_WARNING)
        self.iterator = iterator

    def take_pending(self) -> Flat | None:
        """The loaded state, once: the iteration starting now consumes it."""
        pending, self.pending, self.loaded = self.pending, None, None
        return pending

    def __getstate__(self) -> _Pickled:
        return {"pending": self.pending, "loaded": self.loaded}

    def __setstate__(self, state: _Pickled) -> None:
        self.iterator, self.pending, self.loaded = None, state["pending"], state.get("loaded")


class _Pickled(TypedDict):
    """A `LiveState` as it is pickled (without its iterator)."""

    pending: Flat | None
    loaded: StateDict | None
