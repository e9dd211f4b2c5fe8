"""Time per stage, measured where it is spent: reading, each stage, and collation, per pass.

A `StageClock` belongs to one pass of one pipeline (a DataLoader worker's, or the trainer's own). `build`
puts a `TimedNode` after the source and after every stage: the one place items pass between stages. A
timed node adds, to its part's total, the time each `next()` of the node below it took — inclusive of
everything further down. A stage's own (exclusive) time is then its inclusive total less the inclusive
total of the node it pulls from, so the parts add up to the time the pass spent producing items, with no
bookkeeping between neighbours in the hot loop: two `perf_counter_ns` reads and one addition per item per
stage. Collation (TorchLoader's worker-side collate) runs outside the chain's `next()` and is timed on its
own (`StageClock.flat`).

Parts are named by the stage's own kind and its position among stages of that kind: `read` (the source:
opening shards and reading their bytes), `map[0]`, `map[1]`, `shuffle`, `batch`, ..., `collate`. A kind
that occurs once is named by its kind alone. The names are the label values of the daemon's
`shardcache_client_stage_seconds_total` and of `stats()`; a stage that runs a user's function also carries
that function's name for people (`map[0] decode`), never as a label.

A TorchLoader's loader-side stages (`.unbatch()`, `.shuffle()`, `.batch()` after the workers' merge) run in
the trainer's own process, inside the wait the trainer measures; they are timed by a second clock of the
same kind, above a hidden part for the merge (waiting for the workers), and named with the `loader.` prefix
(`loader.shuffle`): their seconds are the trainer's, not the workers', so `StageStats` keeps them apart.

`SHARDCACHE_STAGE_TIMES=0` turns the accounting off (read when a pass starts, in every worker: they inherit
the trainer's environment); `bench/bench_stage_time.py` measures what it costs with and without.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardcache.context import RuntimeContext
from shardcache.node import Node, State
from shardcache.stages import Stage

STAGE_TIMES_ENV = "SHARDCACHE_STAGE_TIMES"
READ = "read"
COLLATE = "collate"
LOADER_PREFIX = "loader."  # loader-side stages, in the trainer's process
_OFF = ("0", "false", "no", "off")


def stage_times_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether passes time their stages: on unless `SHARDCACHE_STAGE_TIMES` is 0/false/no/off."""
    value = (os.environ if environ is None else environ).get(STAGE_TIMES_ENV, "")
    return value.strip().lower() not in _OFF


def stage_names(stages: Sequence[Stage]) -> list[str]:
    """The part name of each stage: its kind, with its position among stages of that kind when repeated."""
    kinds = Counter(stage.kind for stage in stages)
    seen: Counter[str] = Counter()
    names = []
    for stage in stages:
        kind = stage.kind
        names.append(f"{kind}[{seen[kind]}]" if kinds[kind] > 1 else kind)
        seen[kind] += 1
    return names


def stage_title(name: str, stage: Stage) -> str:
    """`name` and, for a stage that runs a user's function, that function's name: what people read."""
    fn = stage.user_callable
    if fn is None:
        return name
    return f"{name} {getattr(fn, '__name__', type(fn).__name__)}"


@dataclass(frozen=True)
class StageTimes:
    """Cumulative seconds per part of one pass, exclusive (they add up), in pipeline order.

    Picklable and small: what a DataLoader worker sends to the trainer with its items.

    Attributes:
        names: Part names (`read`, `map[0]`, ..., `collate`): the metric's label values.
        seconds: Exclusive seconds of each part, in the same order.
        titles: The names people read (`map[0] decode`), in the same order.
    """

    names: tuple[str, ...] = ()
    seconds: tuple[float, ...] = ()
    titles: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, float]:
        """Seconds by part name."""
        return dict(zip(self.names, self.seconds, strict=True))


def add_times(times: Sequence[StageTimes]) -> StageTimes:
    """The sum of several passes' times (the workers of one loader), parts in first-seen order."""
    seconds: dict[str, float] = {}
    titles: dict[str, str] = {}
    for part in times:
        for name, value, title in zip(part.names, part.seconds, part.titles, strict=True):
            seconds[name] = seconds.get(name, 0.0) + value
            titles.setdefault(name, title)
    return StageTimes(tuple(seconds), tuple(seconds.values()), tuple(titles.values()))


class StageClock:
    """The running totals of one pass (see the module); `times()` reads them from any thread."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.titles: list[str] = []
        # Nanoseconds per part: inclusive for chained parts, own time for flat ones (`_chained`).
        self.totals: list[int] = []
        self._chained: list[bool] = []
        self._shown: list[bool] = []

    def _part(self, name: str, title: str, chained: bool, shown: bool = True) -> int:
        self.names.append(name)
        self.titles.append(title)
        self.totals.append(0)
        self._chained.append(chained)
        self._shown.append(shown)
        return len(self.totals) - 1

    def timed(self, node: Node, name: str, title: str | None = None, shown: bool = True) -> Node:
        """`node` behind a `TimedNode` counting into the part `name` (chained: the next stage pulls it).

        `shown=False`: a part only the next one's exclusive time is taken from, left out of `times()`
        (the merge under loader-side stages: that time is the trainer's wait for its workers)."""
        return TimedNode(node, self.totals, self._part(name, title or name, chained=True, shown=shown))

    def flat(self, name: str) -> int:
        """A part timed by its caller outside the chain (collation): add ns to `totals[index]`."""
        return self._part(name, name, chained=False)

    def times(self) -> StageTimes:
        """Exclusive seconds per part so far (a chained part less the inclusive time of the one below)."""
        names: list[str] = []
        seconds: list[float] = []
        titles: list[str] = []
        below = 0
        parts = zip(self.names, list(self.totals), self._chained, self._shown, self.titles, strict=True)
        for name, total, chained, shown, title in parts:
            own = total - below if chained else total
            if chained:
                below = total
            if shown:
                names.append(name)
                titles.append(title)
                # A stage that pulls from upstream outside its own next() (a thread) could go below zero.
                seconds.append(max(own, 0) / 1e9)
        return StageTimes(tuple(names), tuple(seconds), tuple(titles))


def part_seconds(workers: StageTimes, loader: StageClock | None) -> dict[str, float]:
    """Seconds by metric label: the workers' parts, then the loader-side ones of `loader`."""
    return workers.as_dict() if loader is None else {**workers.as_dict(), **loader.times().as_dict()}


def timed_stages(
    node: Node, stages: Sequence[Stage], ctx: RuntimeContext, clock: StageClock | None, prefix: str = ""
) -> Node:
    """`stages` built on `node`, each behind a timed part named by its kind and position (with `prefix`);
    untimed when `clock` is None."""
    if clock is None:
        for stage in stages:
            node = stage.node(node, ctx)
        return node
    for stage, name in zip(stages, stage_names(stages), strict=True):
        node = clock.timed(stage.node(node, ctx), prefix + name, prefix + stage_title(name, stage))
    return node


class TimedNode(Node):
    """A node as it is, counting the time each of its `next()` calls takes; transparent to resume state
    and to code that walks a chain by `.up` (`source_below`, `merge_of`)."""

    def __init__(self, up: Node, totals: list[int], index: int) -> None:
        super().__init__()
        self.up = up
        self._totals = totals
        self._index = index

    def gen(self) -> Iterator[Any]:
        clock, totals, index = time.perf_counter_ns, self._totals, self._index
        started = clock()
        for item in self.up.iterator():
            totals[index] += clock() - started
            yield item
            started = clock()
        totals[index] += clock() - started

    def state_dict(self) -> State:
        return self.up.state_dict()

    def load_state_dict(self, state: State) -> None:
        self._check_not_started()
        self.up.load_state_dict(state)

    def close(self) -> None:
        super().close()
        self.up.close()


@dataclass(frozen=True)
class StageStats:
    """Where one iteration's time went: `TorchLoader.stats()` and `Dataset.stats()`.

    Attributes:
        times: Seconds per part, summed over the workers (the trainer's own pass without workers).
        waited_s: Seconds the trainer waited for its next item (in its own process: the pipeline's time).
        elapsed_s: Seconds since the iteration began, in the trainer.
        workers: DataLoader workers whose times are summed (0: the pipeline ran in the trainer's process).
        loader: Seconds of a TorchLoader's loader-side stages (`loader.shuffle`, ...), spent in the trainer's
            own process and part of `waited_s`; kept apart from `times`, whose seconds are the workers'.

    Example:
        >>> stats = StageStats(StageTimes(("read", "map"), (1.0, 3.0), ("read", "map decode")), 2.0, 4.0)
        >>> str(stats)
        'read 25%, map decode 75%; trainer waited 50%'
        >>> loader = StageTimes(("loader.shuffle",), (0.4,), ("loader.shuffle",))
        >>> str(StageStats(stats.times, 2.0, 4.0, loader=loader))
        'read 25%, map decode 75%; trainer waited 50% (loader.shuffle 10%)'
    """

    times: StageTimes = StageTimes()
    waited_s: float = 0.0
    elapsed_s: float = 0.0
    workers: int = 0
    loader: StageTimes = StageTimes()

    @property
    def busy_s(self) -> float:
        """Seconds the pipeline's workers spent producing items: the sum of their parts."""
        return sum(self.times.seconds)

    @property
    def seconds(self) -> dict[str, float]:
        """Seconds by part name (`read`, `map[0]`, ..., `collate`)."""
        return self.times.as_dict()

    @property
    def fractions(self) -> dict[str, float]:
        """Each part's share of the pipeline's busy time (they add up to 1; empty before any item)."""
        busy = self.busy_s
        return {name: s / busy for name, s in self.seconds.items()} if busy > 0 else {}

    @property
    def waited_fraction(self) -> float:
        """The share of the trainer's time it spent waiting for data (0 before the iteration began)."""
        return min(1.0, self.waited_s / self.elapsed_s) if self.elapsed_s > 0 else 0.0

    @property
    def loader_fractions(self) -> dict[str, float]:
        """Each loader-side stage's share of the trainer's time (inside `waited_fraction`)."""
        elapsed = self.elapsed_s
        if elapsed <= 0:
            return {}
        return {name: min(1.0, s / elapsed) for name, s in self.loader.as_dict().items()}

    def __str__(self) -> str:
        busy = self.busy_s
        parts = ", ".join(
            f"{title} {s / busy:.0%}" for title, s in zip(self.times.titles, self.times.seconds, strict=True)
        )
        waited = f"trainer waited {self.waited_fraction:.0%}"
        shares = self.loader_fractions
        if shares:
            titles = dict(zip(self.loader.names, self.loader.titles, strict=True))
            waited += " (" + ", ".join(f"{titles[name]} {share:.0%}" for name, share in shares.items()) + ")"
        return f"{parts}; {waited}" if busy > 0 else f"no stage times; {waited}"


# How often a DataLoader worker sends its running times with an item: often enough for `stats()` and the
# telemetry's 5 s reports, rarely enough that items of single samples do not each carry them.
SEND_EVERY_NS = 100_000_000


class TimesOutbox:
    """What a worker attaches to its items: its pass's times when `SEND_EVERY_NS` passed, else None."""

    def __init__(self, clock: StageClock | None) -> None:
        self.clock = clock
        self._due_ns = 0

    def due(self) -> StageTimes | None:
        """The times to send with this item (None: nothing new to say yet, or times are off)."""
        clock = self.clock
        if clock is None:
            return None
        now = time.perf_counter_ns()
        if now < self._due_ns:
            return None
        self._due_ns = now + SEND_EVERY_NS
        return clock.times()

    def last(self) -> StageTimes | None:
        """The final times, sent with the worker's end marker."""
        return None if self.clock is None else self.clock.times()


def timed_collate(clock: StageClock | None, collate: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`collate`, its time counted as the part `collate` of `clock` (as it is when `clock` is None)."""
    if clock is None:
        return collate
    index, totals, now = clock.flat(COLLATE), clock.totals, time.perf_counter_ns

    def timed(batch: Any) -> Any:
        started = now()
        try:
            return collate(batch)
        finally:
            totals[index] += now() - started

    return timed
