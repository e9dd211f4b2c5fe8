"""What code outside a stage's own module may ask of its kind: each stage spec declares its answers.

Resume, mixing, the cache boundary and telemetry decide by these traits, never by a stage's `kind` string,
so a new stage is one module (its spec with these class attributes, and its node) plus one line in
`shardcache.stages.Stage`. The defaults are the cautious answers: a stage that declares nothing holds items
back, changes their count, cannot go before `.cache()` and leaves batching as it found it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class Count:
    """How many items one pass yields (`len()`; `shardcache.pipeline.length`), and the samples they hold:
    equal to `items` while the items are samples, the samples inside the batches once they are batched,
    None where that is not known (a map over batches may change what a batch holds)."""

    items: int
    samples: int | None

    @staticmethod
    def of_samples(samples: int) -> Count:
        return Count(samples, samples)

    def batched(self, size: int, drop_last: bool) -> Count:
        """The count after grouping the items into batches of `size` (the last one short, or dropped)."""
        if drop_last:
            items = self.items // size
            return Count(items, items * size if self.samples == self.items else None)
        return Count(-(-self.items // size), self.samples)

    def __add__(self, other: Count) -> Count:
        samples = None if self.samples is None or other.samples is None else self.samples + other.samples
        return Count(self.items + other.items, samples)


class StageTraits:
    """Base of every stage spec (frozen dataclasses); the class attributes below are its kind's traits."""

    kind: ClassVar[str]
    # Its state is its upstream's position: it holds nothing back, so an elastic resume reads through it.
    passes_position: ClassVar[bool] = False
    # Exactly one output per input, in order: it may run below a shuffle that an elastic resume replays.
    one_to_one: ClassVar[bool] = False
    # As many outputs as inputs (in any order): a mixed member's size is then its manifest's.
    keeps_count: ClassVar[bool] = False
    # May run before `.cache()`: the cache stores what it yields.
    before_cache: ClassVar[bool] = False
    # True: its items are batches; False: it splits batches into samples; None: it leaves items as they come.
    batches: ClassVar[bool | None] = None
    # The names of the positional arguments of its `describe()`, for the messages of a refused resume.
    described_args: ClassVar[tuple[str, ...]] = ()

    def count_after(self, count: Count) -> Count | None:
        """What a pass of `count` yields after this stage, when the count alone decides it (None: it depends
        on the data, as an assembler's output does). The default reads the traits above."""
        if self.one_to_one:  # one output per item: still samples if they were, unknown inside batches
            return Count(count.items, count.samples if count.samples == count.items else None)
        if self.keeps_count:  # the same items in another order
            return count
        return None

    def cache_identity(self, frozen: str | None = None) -> tuple[object, ...] | None:
        """What of this stage names a `.cache()` entry (None: nothing; `frozen`: its callable's fingerprint
        taken when `.cache()` was called, for lambdas and closures)."""
        return None

    @property
    def user_callable(self) -> Callable[..., object] | None:
        """The user's function this stage runs, whose code fingerprints a cache entry (None: none)."""
        return None

    def before_cache_warning(self) -> str | None:
        """What to tell a user who puts this stage before `.cache()` (None: nothing)."""
        return None
