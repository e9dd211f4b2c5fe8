"""The "tars" source: WebDataset-style tar shards, samples grouped by key, optional sidecar shards.

Shards may be plain (`.tar`) or compressed as WebDataset and tar write them (`.tar.gz`, `.tgz`; `.tar.zst`
with the `zstd` extra): see `shardcache.sources.compression`.
"""

from __future__ import annotations

import itertools
import logging
import mmap
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import IO

from shardcache import envvars
from shardcache.errors import ConfigError, CorruptShardError
from shardcache.shards import ShardRef
from shardcache.sources.base import Sample, SourceNode
from shardcache.sources.compression import compression_of, decompressed_stream, warn_if_nothing_read
from shardcache.sources.deal.counting import unit_key
from shardcache.sources.deal.partition import ShardUnits, Unit
from shardcache.sources.kinds import SourceKind
from shardcache.sources.options import SourceOptions
from shardcache.sources.tarfmt import iter_tar_samples, iter_tar_samples_stream, sample_index

logger = logging.getLogger(__name__)

KEY_DOT_LEVEL_ENV = "LOADER_TAR_KEY_DOT_LEVEL"
ON_CORRUPT = ("raise", "skip")
_END: Sample = {}  # the fill of a sidecar that ran out (compared by identity)


def key_dot_level() -> int:
    """`LOADER_TAR_KEY_DOT_LEVEL`, else mvp-dataset's `MVP_DATASET_TAR_KEY_DOT_LEVEL`, else 1."""
    variable, raw = envvars.lookup(KEY_DOT_LEVEL_ENV) or (KEY_DOT_LEVEL_ENV, "1")
    try:
        level = int(raw)
    except ValueError:
        level = 0
    if level < 1:
        raise ConfigError(f"{variable}={raw!r}: must be an integer >= 1")
    return level


def check_options(options: Mapping[str, object]) -> None:
    """Validate the tars keyword arguments."""
    if options.get("on_corrupt", "raise") not in ON_CORRUPT:
        raise ConfigError(f"on_corrupt={options['on_corrupt']!r}: expected one of {ON_CORRUPT}")
    sidecars = options.get("sidecars")
    if sidecars is not None:
        if not isinstance(sidecars, Sequence) or isinstance(sidecars, str):
            raise ConfigError("sidecars=: expected a list of (name, shard -> sidecar shard function) pairs")
        for entry in sidecars:
            if not (isinstance(entry, tuple | list) and len(entry) == 2 and callable(entry[1])):
                raise ConfigError(f"sidecars=: entry {entry!r} is not a (name, function) pair")


@dataclass(frozen=True)
class TarsOptions(SourceOptions):
    """The tars source's options (`check_options` checks the keywords)."""

    sidecars: Sequence[tuple[str, Callable[[str], str]]] | None = None
    on_corrupt: str = "raise"
    shuffle_mode: str = "shard_aware"


class TarsSource(SourceNode):
    options_class = TarsOptions
    options: TarsOptions

    def skips(self, exc: Exception) -> bool:
        return super().skips(exc) or (
            isinstance(exc, CorruptShardError) and self.options.on_corrupt == "skip"
        )

    def units(self) -> Sequence[Unit]:
        shards = self.spec.shards
        if len(shards) < self.ctx.total_slots and not self.partitioned:
            raise ConfigError(
                f"shards: {len(shards)} tar shards cannot feed {self.ctx.total_slots} slots "
                f"(ranks x workers); give at least one shard per slot or use fewer workers"
            )
        return ShardUnits(shards)

    def read(self, unit: Unit, plan: str | None, start: int) -> Iterator[Sample]:
        level = key_dot_level()
        sidecars = self.options.sidecars or ()
        url = unit.ref.url
        # A corrupt shard raises CorruptShardError; the base class skips it under on_corrupt/on_error="skip".
        with ExitStack() as stack:
            if sidecars:
                samples = self._open(stack, unit.ref, plan, level)
                samples = self._zip_sidecars(stack, samples, url, sidecars, level, plan)
                samples = itertools.islice(samples, start, None) if start else samples
            else:  # the mmap path seeks to sample `start` (tarfmt.sample_offset)
                samples = self._open(stack, unit.ref, plan, level, start)
            yield from samples

    def count(self, unit: Unit) -> int:
        """Samples in `unit` by walking its headers, recording sample offsets for readers that start
        inside it; a shard the walk cannot read (compressed, pax names, ...) is counted by reading."""
        if compression_of(unit.ref.url) is None and not self.options.sidecars:
            with self.opener.open_buffer(unit.ref, None) as buf:
                index = sample_index(buf, key_dot_level()) if isinstance(buf, mmap.mmap) else None
            if index is not None:
                self.facts.offsets[unit_key(unit)] = index[1]
                return index[0]
        return super().count(unit)

    def opens_only_its_shard(self) -> bool:
        return not self.options.sidecars

    def opened_urls(self, unit: Unit) -> list[str]:
        sidecars = self.options.sidecars or ()
        return [unit.ref.url, *(fn(unit.ref.url) for _, fn in sidecars)]

    def _open(
        self, stack: ExitStack, ref: ShardRef, plan: str | None, level: int, start: int = 0
    ) -> Iterator[Sample]:
        raw: IO[bytes]
        if compression_of(ref.url) is None:
            buf = stack.enter_context(self.opener.open_buffer(ref, plan))
            if isinstance(buf, mmap.mmap):  # the fast path; never empty (an empty file cannot be mapped)
                offsets = ref.sample_offsets or self.facts.offsets.get(ref.url)
                return iter_tar_samples(buf, ref.url, level, start, offsets)
            raw = buf
        else:  # streamed through the decompressor (see `sources.compression` for why)
            raw = stack.enter_context(self.opener.open(ref, plan))
        stream, source = decompressed_stream(raw, ref.url)
        samples = warn_if_nothing_read(iter_tar_samples_stream(stream, ref.url, level), source, ref.url)
        return itertools.islice(samples, start, None) if start else samples

    def _zip_sidecars(
        self,
        stack: ExitStack,
        main: Iterator[Sample],
        url: str,
        sidecars: Sequence[tuple[str, Callable[[str], str]]],
        level: int,
        plan: str | None,
    ) -> Iterator[Sample]:
        # Sidecars are opened under the slot's plan too (they are in it, after their main shard).
        others = [(name, self._open(stack, ShardRef(fn(url)), plan, level)) for name, fn in sidecars]
        for group in itertools.zip_longest(main, *(it for _, it in others), fillvalue=_END):
            if any(s is _END for s in group):
                raise ConfigError(
                    f"sidecars: shard {url} and its sidecar shards hold different numbers of samples "
                    f"({', '.join(name for name, _ in others)})"
                )
            sample = group[0]
            key = sample["__key__"]
            for (name, _), extra in zip(others, group[1:], strict=True):
                if extra["__key__"] != key:
                    raise ConfigError(
                        f"sidecars: sidecar {name!r} of shard {url} has key {extra['__key__']!r} "
                        f"where the shard has {key!r}; sidecars must list the same keys in the same order"
                    )
                for k, v in extra.items():
                    if k[:2] == "__" and k[-2:] == "__":
                        continue
                    if k in sample:
                        raise ConfigError(
                            f"sidecars: field {k!r} of sidecar {name!r} also exists in {url} (key {key!r})"
                        )
                    sample[k] = v
            yield sample


KIND = SourceKind(
    "tars",
    options=("resample", "sidecars", "on_corrupt", "on_error", "shuffle_mode"),
    check_options=check_options,
    data_suffix=".tar",
    unit_shuffle_modes=("shard_aware", "none"),
    shuffle_mode_code="UnsupportedTarShuffleMode",
    subset_level="shard",
)
