"""What every source shares: the iterator over one slot's units in epoch order (its spec: `sources.spec`).

A source splits its shards into units (a tar shard, a slice of a jsonl file, a parquet row group), and a slot
reads its units in an order fixed by (seed, epoch, round). Position = (epoch, round, index in the slot's unit
order, index within the unit): the state a resume needs, with no sample data.

Shards that cannot be read: by default the error propagates, naming the URL. `on_error="skip"` (tars, jsonl,
parquet) instead skips the rest of the unit being read (a tar shard, a jsonl file's line range, a parquet
chunk of row groups, whose file's other chunks are still read) when its shard is corrupt or truncated
(`CorruptShardError`: a tar member, a jsonl line that is not JSON, a parquet row group's page pyarrow refuses;
a parquet file whose footer is unreadable is skipped whole), its remote object does not exist
(`RemoteNotFound`; `ShardNotFound` when reading directly) or its remote still failed after the daemon's
retries (`RemoteFailed`; `RemoteAccessDenied` when reading directly without credentials). The types are the
same through the daemon and directly. Each skip is logged once and counted in `skipped_shards` (surfaced as
`PipelineIterator.skipped_shards`, `TorchLoader`'s iterator, and the telemetry's corrupt count). The tars
source's older `on_corrupt="skip"` is the same mechanism limited to corrupt shards.
"""

from __future__ import annotations

import copy
import itertools
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import NotRequired, TypedDict

import numpy as np

from shardcache.context import RuntimeContext
from shardcache.errors import (
    CorruptShardError,
    LengthUnknown,
    RemoteFailed,
    RemoteNotFound,
    StateError,
)
from shardcache.memo import IdentityMemo
from shardcache.node import Node, State
from shardcache.shards import ListedUrls, ShardRef, ShardTuple
from shardcache.sources.corrupt import report_corrupt
from shardcache.sources.deal.counting import RunFacts, known_counts, unit_counts
from shardcache.sources.deal.order import ORDER_VERSION, check_order_version
from shardcache.sources.deal.partition import (
    Layout,
    Partitioning,
    Piece,
    ShardUnits,
    Unit,
    plan_epoch,
    resolve,
    weights_of,
)
from shardcache.sources.deal.pieces import ElasticOrigin, OriginState, needs_counts, remaining_pieces
from shardcache.sources.deal.schedule import (
    PlanTracker,
    slot_order,
    source_job,
)
from shardcache.sources.deal.share import slot_share
from shardcache.sources.deal.subset import select_units
from shardcache.sources.opener import ShardOpener
from shardcache.sources.options import SourceOptions
from shardcache.sources.spec import SourceSpec

logger = logging.getLogger(__name__)

# One sample as a source reads it: field name -> value (the user's data, passed on as read).
Sample = dict[str, object]

# What `on_error="skip"` skips: the shard is bad or unreachable for good. Not DaemonUnavailable (the client
# falls back to direct reads), NotAllowed, BadRequest or InsufficientCapacity (configuration to fix).
SKIPPABLE: tuple[type[Exception], ...] = (CorruptShardError, RemoteNotFound, RemoteFailed, FileNotFoundError)

_WEIGHTS: IdentityMemo[tuple[float, ...]] = IdentityMemo()


class SourceState(TypedDict):
    """A unit source's state (`SourceNode.state_dict`)."""

    kind: str
    epoch: int
    round: int  # the resample round
    pos: int  # the piece of the epoch's plan it reads
    index: int  # the sample within that piece
    # What an elastic resume on another layout needs to recompute this epoch's plan.
    layout: dict[str, int]
    partitioning: list[str | float | None]
    order: int  # `ORDER_KEY`: the epoch order that plan is dealt in (`sources.deal.order`)
    origin: NotRequired[OriginState]  # where an elastic resume started this epoch


class SourceNode(Node):
    """Iterates one slot's units in epoch order; subclasses say what the units are and how to read one."""

    uses_daemon = True
    # Whether `shardcache.sources.deal.partition` deals this kind's units (lance plans its own rows).
    partitionable = True
    # Whether every unit's sample count comes with its metadata (parquet footers): no counting pass.
    counted_by_metadata = False
    # The kind's options dataclass (`sources.options`); `self.options` is the spec's options as one.
    options_class: type[SourceOptions] = SourceOptions

    def __init__(self, spec: SourceSpec, ctx: RuntimeContext, facts: RunFacts | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.options = self.options_class.of(spec.options)
        self.ctx = ctx
        self.facts = facts if facts is not None else RunFacts()
        self.epoch = ctx.epoch
        self.round = 0
        self.pos = 0
        self.index = 0
        self.skipped_shards = 0  # shards skipped under on_error/on_corrupt="skip" (see the module)
        # Set by an elastic resume: what the epoch had left when it was checkpointed on another layout.
        self.origin: ElasticOrigin | None = None
        self._opener: ShardOpener | None = None
        self._tracker: PlanTracker | None = None
        self._partitioning: Partitioning | None = None

    # -- what subclasses provide ----------------------------------------------------------------------------

    def units(self) -> Sequence[Unit]:
        """Every unit of the source, in a fixed order."""
        raise NotImplementedError

    def order(self, units: Sequence[Unit], round_index: int) -> list[int]:
        """Indices of the units this slot reads in `round_index` of the current epoch."""
        return slot_order(len(units), self.ctx, self.epoch, round_index, self.spec.shuffles_units)

    def read(self, unit: Unit, plan: str | None, start: int) -> Iterator[Sample]:
        """The samples of `unit` from index `start` on."""
        raise NotImplementedError

    def part_of(self, unit: Unit) -> str:
        """What part of its shard `unit` is, as the skip log names it ("" for the whole shard; parquet
        names its row groups)."""
        return ""

    def opened_urls(self, unit: Unit) -> list[str]:
        """The shard urls reading `unit` opens, in opening order (the tars source adds its sidecars)."""
        return [unit.ref.url]

    # -- shared machinery -----------------------------------------------------------------------------------

    @property
    def opener(self) -> ShardOpener:
        if self._opener is None:
            self._opener = ShardOpener(self.spec.daemon)
        return self._opener

    def close(self) -> None:
        """Close the open shard and announced plans (the generator's cleanup), then the daemon connection."""
        super().close()
        if self._opener is not None:
            self._opener.close()
            self._opener = None

    @property
    def partitioning(self) -> Partitioning:
        """Placement and equal-work mode for this reader (`shardcache.sources.deal.partition`)."""
        if self._partitioning is None:
            self._partitioning = type(self).partitioning_for(self.spec, self.ctx, self.facts, self.options)
        return self._partitioning

    @classmethod
    def partitioning_for(
        cls, spec: SourceSpec, ctx: RuntimeContext, facts: RunFacts, options: SourceOptions | None = None
    ) -> Partitioning:
        """The partitioning a reader of this kind uses for `spec` in `ctx`, without building one."""
        opts = options if options is not None else cls.options_class.of(spec.options)
        resolved = resolve(opts.placement, opts.even, opts.exchange, ctx, facts.distributed())
        if spec.resample:  # an endless stream: every rank always has a next sample
            resolved = Partitioning(resolved.placement, None, resolved.exchange)
        if not cls.partitionable:  # the kind cuts its own rows evenly; placement is for shards
            resolved = Partitioning(even=resolved.even)
        return resolved

    @property
    def partitioned(self) -> bool:
        """Whether `shardcache.sources.deal.partition` plans this reader (else the kind's own `order`)."""
        return self.origin is not None or (self.partitionable and self.partitioning.layered)

    def slot_pieces(self, units: Sequence[Unit], round_index: int) -> list[Piece]:
        """What this slot reads in `round_index` of the current epoch, in reading order."""
        if not self.partitioned:
            return [Piece(u) for u in self.order(units, round_index)]
        if self.origin is None:
            # Whole units: this slot's share alone (`slot_share`: O(n / slots) without even=/exchange=,
            # array passes with them); an elastic replay's pieces need the whole deal.
            share = slot_share(
                len(units),
                lambda: self.weights(units),
                Layout.of(self.ctx),
                self.partitioning,
                self.ctx.seed,
                self.epoch,
                round_index,
                self.ctx.slot,
                shuffle=self.spec.shuffles_units,
                counts=lambda: unit_counts(self, units),
                fixed_owner=self.fixed_owner(units),
            )
            if share is not None:
                return share
        return self.plan(units, round_index)[self.ctx.slot]

    def plan(self, units: Sequence[Unit], round_index: int) -> list[list[Piece]]:
        """Every slot's pieces in this epoch and round under this reader's layout."""
        part = self.partitioning
        counts = unit_counts(self, units) if part.even is not None or needs_counts(self.origin) else None
        if self.origin is not None and round_index == 0:
            universe = remaining_pieces(self, units, self.origin, counts)
        else:
            universe = [Piece(i, 0, None if counts is None else counts[i]) for i in range(len(units))]
        return plan_epoch(
            universe,
            self.weights(units),
            Layout.of(self.ctx),
            part,
            self.ctx.seed,
            self.epoch,
            round_index,
            shuffle=self.spec.shuffles_units,
            fixed_owner=self.fixed_owner(units),
        )

    def fixed_owner(self, units: Sequence[Unit]) -> list[int] | None:
        """Each unit's node group when a larger dataset decided it (`node_owners`, set by mini_epochs)."""
        pairs = self.spec.hints.node_owners
        if not pairs:
            return None
        owner = dict(pairs)
        groups = max(owner.values()) + 1
        if groups != self.ctx.node_groups:
            return None  # decided for another layout: plan this dataset on its own
        return [owner.get(u.ref.url, 0) for u in units]

    def weights(self, units: Sequence[Unit]) -> tuple[float, ...]:
        """Node-placement weights of the units (metadata only: see `partition.weights_of`); whole shards'
        are computed once per process and shard list (no unit objects made)."""
        if isinstance(units, ShardUnits):
            shards = units.shards
            return _WEIGHTS.get(
                shards,
                "weights",
                lambda: weights_of([r.num_samples for r in shards], [r.size for r in shards]),
            )
        return weights_of([u.count for u in units], [u.ref.size for u in units])

    def slot_samples(self) -> int:
        """Samples this slot reads in the current epoch, from the units' known counts alone (`len()`:
        `shardcache.pipeline.length`); nothing is read but metadata.

        Raises:
            LengthUnknown: the source resamples (its passes never end), or a unit's count is not known
                without reading it.
        """
        if self.spec.resample:
            raise LengthUnknown("the source resamples (resample=True): its passes never end")
        units = select_units(self.spec.kind, self.units(), self.spec.hints.subset)
        unknown = LengthUnknown(
            f"the sample counts of this {self.spec.kind} source's shards are not known before reading "
            "them: give a manifest with num_samples (`shardcache manifest`), or call "
            "Dataset.count_samples(always=True) once on every rank before asking"
        )
        if known_counts(self, units) is None:  # before planning: the deal would count them by reading
            raise unknown
        pieces = self.slot_pieces(units, 0)
        counts = known_counts(self, units)  # as planning left them: a kind that cuts its own rows refills
        if counts is None:
            raise unknown
        return sum(counts[p.unit] - p.start if p.stop is None else p.stop - p.start for p in pieces)

    def count(self, unit: Unit) -> int:
        """Samples in `unit`, by reading it (the counting pass; sources with metadata never need it)."""
        return sum(1 for _ in self.read(unit, None, 0))

    def gen(self) -> Iterator[Sample]:
        # Subsets (split/sample) of unit-level kinds; sources.deal.subset says which kinds are cut here.
        units = select_units(self.spec.kind, self.units(), self.spec.hints.subset)
        resample = self.spec.resample
        # Pieces of the partition layer carry the pad mark; a kind that cuts its own rows marks them itself.
        pad_marks = self.partitioning.even == "pad" and self.partitioned
        job = source_job(self.spec.hints.job, self.spec.shards, self.ctx.seed)
        tracker = self._tracker = PlanTracker(
            self.opener.client if self.uses_daemon else None,
            job,
            self.ctx.slot,
            immutable=self.spec.hints.immutable,
        )
        empty_rounds = 0
        try:
            while True:
                pieces = self.slot_pieces(units, self.round)
                plan_epoch_index = self.epoch if not resample else self.epoch + self.round
                # The next plan is computed and announced in the background: the first sample waits for
                # this epoch's plan only (see PlanTracker.start).
                # Without a daemon there is no plan to announce: no URL list is made.
                urls = self._urls(units, pieces) if tracker.client is not None else []
                tracker.start(plan_epoch_index, urls, self._next_urls(units))

                def resync(after: int, pieces: list[Piece] = pieces, epoch: int = plan_epoch_index) -> None:
                    # The daemon may have lost the plans (see PlanTracker.stale): announce what is left.
                    if tracker.stale():
                        remaining = self._urls(units, pieces[after:])
                        tracker.resync(epoch, remaining, self._next_urls(units))

                # Checked again once a shard is open: the open that found a restarted daemon ran on a
                # new connection, and the shards after it are then announced before they are needed.
                self.opener.after_open = lambda: resync(self.pos + 1)
                while self.pos < len(pieces):
                    resync(self.pos)
                    i = self.index
                    piece = pieces[self.pos]
                    unit = units[piece.unit]
                    samples = self.read(unit, tracker.current, piece.start + i)
                    if piece.stop is not None:
                        samples = itertools.islice(samples, piece.stop - piece.start - i)
                    try:
                        for sample in samples:
                            i += 1
                            self.index = i
                            if pad_marks:
                                sample["__pad__"] = piece.pad
                            yield sample
                    except SKIPPABLE as exc:
                        error = report_corrupt(self.opener.client if self.uses_daemon else None, exc)
                        if not self.skips(exc):
                            if error is exc:
                                raise
                            raise error from exc
                        self._skipped(unit, error)
                    finally:
                        close = getattr(samples, "close", None)
                        if close is not None:
                            close()
                    self.pos += 1
                    self.index = 0
                tracker.finish()
                if not resample:
                    tracker.keep_following()
                    return
                empty_rounds = 0 if pieces else empty_rounds + 1
                if empty_rounds > self.ctx.total_slots:
                    return  # no unit can ever reach this slot
                self.round += 1
                self.pos = 0
        finally:
            tracker.close()

    def skips(self, exc: Exception) -> bool:
        """Whether reading a unit that raised `exc` goes on with the next unit (`on_error="skip"`; the
        tars source adds `on_corrupt="skip"`)."""
        return self.options.on_error == "skip"

    def _skipped(self, unit: Unit, exc: Exception) -> None:
        self.skipped_shards += 1
        what = "corrupt shard" if isinstance(exc, CorruptShardError) else "unreadable shard"
        part = self.part_of(unit)
        logger.warning(
            "skipping the rest of %s%s %s (%s); %d shard(s) skipped so far",
            f"{part} of " if part else "",
            what,
            unit.ref.url,
            exc,
            self.skipped_shards,
        )

    def opens_only_its_shard(self) -> bool:
        """Whether reading a unit opens its shard's url alone (`opened_urls`; tars with sidecars do not)."""
        return True

    def _urls(self, units: Sequence[Unit], pieces: Sequence[Piece]) -> Sequence[str]:
        shards = units.shards if isinstance(units, ShardUnits) else None
        if isinstance(shards, ShardTuple) and self.opens_only_its_shard():
            # Positions in the source's shard list: the daemon takes the plan in its compact form.
            positions = np.fromiter((p.unit for p in pieces), dtype=np.int32, count=len(pieces))
            return ListedUrls(shards, positions)
        return [url for p in pieces for url in self.opened_urls(units[p.unit])]

    def _next_urls(self, units: Sequence[Unit]) -> Callable[[], Sequence[str]]:
        """What this slot opens after the current epoch (or round), the daemon's "next" plan, as a function
        that computes it later (in PlanTracker's background thread): it reads a copy of this node's position
        taken now, never the node itself, which goes on iterating meanwhile."""
        ahead = copy.copy(self)
        ahead._it = None  # a snapshot of the position, never iterated
        if self.spec.resample:
            ahead.round = self.round + 1
            return lambda: ahead._urls(units, ahead.slot_pieces(units, ahead.round))
        following = self.spec.hints.plan_following
        if following is not None:
            return lambda: [url for epoch, urls in following for url in ahead.plan_urls(urls, epoch)]
        ahead.epoch, ahead.origin = self.epoch + 1, None
        return lambda: ahead._urls(units, ahead.slot_pieces(units, 0))

    def plan_urls(self, urls: Sequence[str], epoch: int) -> list[str]:
        """The urls this slot would open reading a dataset of the same kind over `urls` at `epoch`.

        Exact for sources whose units need no I/O to list (tars, jsonl); sources that must read shard
        metadata for their units override this with a shard-level estimate.
        """
        shards = tuple(ShardRef(url) for url in urls)
        spec = replace(self.spec, shards=shards, hints=self.spec.hints.without_plans())
        sibling = type(self)(spec, self.ctx.with_epoch(epoch), self.facts)
        units = sibling.units()
        return list(sibling._urls(units, sibling.slot_pieces(units, 0)))

    def state_dict(self) -> SourceState:
        part = self.partitioning
        state: SourceState = {
            "kind": self.spec.kind,
            "epoch": self.epoch,
            "round": self.round,
            "pos": self.pos,
            "index": self.index,
            # What an elastic resume on another layout needs to recompute this epoch's plan.
            "layout": Layout.of(self.ctx).as_dict(),
            "partitioning": part.as_list(),
            "order": ORDER_VERSION,  # ORDER_KEY
        }
        if self.origin is not None:
            state["origin"] = self.origin.as_state()
        return state

    def load_state_dict(self, state: State) -> None:
        self._check_not_started()
        if not isinstance(state, dict) or state.get("kind") != self.spec.kind:
            raise StateError(
                f"resume state is for source {state.get('kind')!r}, this pipeline reads {self.spec.kind!r}"
            )
        values: list[int] = []
        for name in ("epoch", "round", "pos", "index"):
            value = state.get(name)
            if not isinstance(value, int) or value < 0:
                raise StateError(f"resume state field {name!r}={value!r} must be a non-negative integer")
            values.append(value)
        epoch, round_, pos, index = values
        if round_ and not self.spec.resample:
            raise StateError("resume state has round > 0 but this source does not resample")
        check_order_version(state)
        self.epoch, self.round, self.pos, self.index = epoch, round_, pos, index
        origin = state.get("origin")
        if origin is not None and not isinstance(origin, dict):
            raise StateError(f"resume state field 'origin'={origin!r} must be an object")
        self.origin = None if origin is None else ElasticOrigin.of(origin)


def unit_position(state: object) -> tuple[int, int] | None:
    """(pos, index) of a unit source's state: the piece of the epoch's plan it reads and the sample within
    it; None for a state of something else (a mix's, a lance source's)."""
    if not isinstance(state, dict) or "pos" not in state:
        return None
    return int(state["pos"]), int(state["index"])


def unit_round(state: object) -> tuple[int, int] | None:
    """(epoch, round) of a source's state: the epoch and the resample round it reads; None for a state of
    something else."""
    if not isinstance(state, dict) or not isinstance(state.get("round"), int):
        return None
    return int(state["epoch"]), int(state["round"])


def source_below(node: Node) -> SourceNode | None:
    """The source node at the bottom of a stage chain (None for a composed root such as a mix, whose
    sources come and go)."""
    seen: Node | None = node
    while seen is not None and not isinstance(seen, SourceNode):
        seen = getattr(seen, "up", None)
    return seen
