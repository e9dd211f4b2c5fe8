"""A source's options, typed: what every kind takes (`SourceOptions`, which each kind extends with its own
fields in its module), and the internal fields the pipeline's features set (`PlanHints`).

`Dataset.from_source(kind, shards, **options)` keeps its keyword signature and its error messages: the
keywords are checked by the kind (`sources.check_options`), then split into the user's options (kept as
the mapping `SourceSpec.options`, which the fingerprint describes as given) and the hints. A source node
reads its options as its kind's dataclass (`SourceNode.options`, built by `options_class.of`), never by
key.

Why the user's options stay a mapping in the spec as well: the pipeline fingerprint (resume states, `.cache()`
entries) describes the arguments as they were written, leaving out only those that read the same data as
leaving them out (`schedule.order_neutral`). A dataclass fills every default in, so it could not tell
`shuffle_mode="none"` written from the default left out, and every saved fingerprint would change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

# `Dataset.from_source` also takes these keywords; they become hints, never the kind's options.
HINT_KEYWORDS = ("job", "plan_following", "node_owners", "subset", "filter", "row_metadata", "immutable")


@dataclass(frozen=True)
class PlanHints:
    """The internal fields of a source, set by features rather than by the user's reading options.

    Attributes:
        job: The daemon job id (`mini_epochs` gives every chunk of an epoch one); None: derived from the
            shards and seed (`schedule.source_job`).
        plan_following: (epoch, urls) groups read after this dataset, announced to the daemon as the "next"
            plan (`mini_epochs`).
        node_owners: (url, node group) pairs a larger dataset decided under node placement (`mini_epochs`).
        subset: The split/sample steps (`sources.deal.subset`); part of the data, so of the fingerprint.
        filter: Lance predicates, alternatives of conjunctions (`Dataset.filter`); part of the fingerprint.
        row_metadata: Whether lance rows get `__key__`/`__file__`/... (False: a `.cache()` read-back, whose
            rows keep the metadata they were written with).
        versions: (url, version) of each Lance dataset, discovered by `from_source` (as mvp-dataset 0.2.3
            does): the source reads those versions, so rows appended later are not read. Part of the
            fingerprint (mvp's resume identity holds each dataset's version too): a state saved on one
            version does not resume on another, whose rows differ.
        immutable: The user's word that the shards are never rewritten in place (`immutable=True`): the
            plans say so, and the daemon serves its cached copies without checking them against the remote.
    """

    job: str | None = None
    plan_following: tuple[tuple[int, tuple[str, ...]], ...] | None = None
    node_owners: tuple[tuple[str, int], ...] | None = None
    subset: tuple[tuple[Any, ...], ...] | None = None
    filter: tuple[tuple[str, ...], ...] | None = None
    row_metadata: bool = True
    versions: tuple[tuple[str, int], ...] | None = None
    immutable: bool = False

    @classmethod
    def split(cls, options: Mapping[str, Any]) -> tuple[dict[str, Any], PlanHints]:
        """The user's options without the hint keywords, and the hints those keywords give."""
        given = {k: v for k, v in options.items() if k in HINT_KEYWORDS}
        rest = {k: v for k, v in options.items() if k not in HINT_KEYWORDS}
        if given.get("plan_following") is not None:
            given["plan_following"] = tuple((int(e), tuple(urls)) for e, urls in given["plan_following"])
        return rest, cls(**given)

    def described(self) -> dict[str, object]:
        """The hints that change which samples are read (subset, filter, a Lance source's pinned versions):
        what the fingerprint shows."""
        shown = {"subset": self.subset, "filter": self.filter, "versions": self.versions}
        return {name: value for name, value in shown.items() if value is not None}

    def without_plans(self) -> PlanHints:
        """The same data (subset, filter, placement decided elsewhere) without this dataset's own plans."""
        return dataclasses.replace(self, job=None, plan_following=None)


@dataclass(frozen=True)
class SourceOptions:
    """What every kind reads: resampling, errors, partitioning (`sources.deal.partition`)."""

    resample: bool = False
    on_error: str = "raise"
    placement: str = "auto"
    even: str | None = "auto"
    exchange: float = 0.0

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> Self:
        """This kind's options from the checked keyword mapping (absent keywords take the defaults)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in options.items() if k in names})
