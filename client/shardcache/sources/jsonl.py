"""The "jsonl" source: JSON lines, split into slot-aligned logical shards by line ranges (no copies written).

Every file is cut into `total_slots` contiguous line ranges and slot s reads range s of every file, in a file
order fixed by (seed, epoch), or source order under `shuffle_mode="none"`: each line is read once per epoch
across slots, whatever the number of files.
Fields named in `ref_fields` may hold `tar://<shard>#<key>.<field>` references, resolved to member bytes.
Files may be compressed (`.jsonl.gz`; `.jsonl.zst` with the `zstd` extra), and so may referenced tars.
"""

from __future__ import annotations

import json
import mmap
import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import IO

from shardcache import envvars
from shardcache.errors import ConfigError, CorruptShardError, ShardError
from shardcache.shards import ShardRef, has_protocol
from shardcache.sources.base import Sample, SourceNode
from shardcache.sources.compression import compression_of, decompress_all, decompressed_stream, warn_empty
from shardcache.sources.deal.order import permutation
from shardcache.sources.deal.partition import Unit
from shardcache.sources.kinds import SourceKind
from shardcache.sources.opener import ShardOpener
from shardcache.sources.options import SourceOptions
from shardcache.sources.tarfmt import iter_members, iter_members_stream

# A tar's members by name: bytes (a compressed tar, read whole) or (offset, size) in its mmap.
Members = dict[str, bytes | tuple[int, int]]

TAR_CACHE_SIZE_ENV = "LOADER_JSONL_TAR_CACHE_SIZE"


def check_options(options: Mapping[str, object]) -> None:
    """Validate the jsonl keyword arguments."""
    refs = options.get("ref_fields")
    if refs is None:
        return
    if not isinstance(refs, Sequence) or isinstance(refs, str):
        raise ConfigError("ref_fields=: expected a list of (field_name, base_dir) pairs")
    for entry in refs:
        if not (
            isinstance(entry, tuple | list) and len(entry) == 2 and all(isinstance(x, str) for x in entry)
        ):
            raise ConfigError(f"ref_fields=: entry {entry!r} is not a (field_name, base_dir) pair of strings")


def read_lines(data: bytes) -> list[bytes]:
    """The non-blank lines of a jsonl file."""
    return [line for line in data.splitlines() if line.strip()]


@dataclass(frozen=True)
class JsonlOptions(SourceOptions):
    """The jsonl source's options (`check_options` checks the keywords)."""

    ref_fields: Sequence[tuple[str, str]] | None = None  # (field name, base directory) pairs
    shuffle_mode: str = "shard_aware"


class JsonlSource(SourceNode):
    options_class = JsonlOptions
    options: JsonlOptions

    def units(self) -> list[Unit]:
        if self.partitioned:  # whole files, cut by `shardcache.sources.deal.partition`
            return [Unit(ref, count=ref.num_samples) for ref in self.spec.shards]
        total = self.ctx.total_slots
        return [Unit(ref, part) for ref in self.spec.shards for part in range(total)]

    def order(self, units: Sequence[Unit], round_index: int) -> list[int]:
        total = self.ctx.total_slots
        n = len(self.spec.shards)
        shuffled = self.spec.shuffles_units  # shuffle_mode="none": files in source order
        files = permutation(n, self.ctx.seed, self.epoch, round_index) if shuffled else list(range(n))
        # Resampling rotates the line range a slot reads, so successive rounds see other lines.
        part = (self.ctx.slot + round_index) % total
        return [f * total + part for f in files]

    def read(self, unit: Unit, plan: str | None, start: int) -> Iterator[Sample]:
        with self.opener.open(unit.ref, plan) as f:
            data = f.read()
        if not data:
            warn_empty(unit.ref.url)
            return
        lines = read_lines(decompress_all(data, unit.ref.url))  # `.jsonl.gz`, `.jsonl.zst`
        total = 1 if self.partitioned else self.ctx.total_slots
        first = unit.part * len(lines) // total
        last = (unit.part + 1) * len(lines) // total
        refs = self.options.ref_fields or ()
        resolver = TarRefResolver(self.opener) if refs else None
        url = unit.ref.url
        stem = os.path.basename(url)
        try:
            for i in range(first + start, last):
                try:
                    row = json.loads(lines[i])
                except ValueError as exc:  # also UnicodeDecodeError
                    raise CorruptShardError(url, f"not valid JSON ({exc})", line=i + 1) from exc
                if not isinstance(row, dict):
                    row = {"json": row}
                row.setdefault("__key__", f"{stem}:{i}")
                row["__file__"] = url
                row["__index_in_file__"] = i
                if resolver is not None:
                    for name, base in refs:
                        if name in row:
                            row[name] = resolver.resolve(row[name], base, url)
                yield row
        finally:
            if resolver is not None:
                resolver.close()


class TarRefResolver:
    """Resolves `tar://<shard>#<key>.<field>` references, keeping an LRU of open, indexed tar shards."""

    def __init__(self, opener: ShardOpener, capacity: int | None = None) -> None:
        self.opener = opener
        # LOADER_JSONL_TAR_CACHE_SIZE, else mvp-dataset's MVP_DATASET_TAR_MAX_OPEN_FILES, else 16.
        found = envvars.lookup(TAR_CACHE_SIZE_ENV) if capacity is None else ("capacity", str(capacity))
        variable, raw = found or (TAR_CACHE_SIZE_ENV, "16")
        try:
            self.capacity = max(1, int(raw))
        except ValueError as exc:
            raise ConfigError(f"{variable}={raw!r}: must be a positive integer") from exc
        self._open: OrderedDict[str, tuple[ExitStack, mmap.mmap | IO[bytes] | None, Members]] = OrderedDict()

    def resolve(self, value: object, base: str, where: str) -> bytes | list[bytes]:
        if isinstance(value, list):
            return [self.resolve_one(v, base, where) for v in value]
        return self.resolve_one(value, base, where)

    def resolve_one(self, ref: object, base: str, where: str) -> bytes:
        if not isinstance(ref, str) or "#" not in ref:
            raise ShardError(f"{where}: reference {ref!r} is not of the form tar://<shard>#<key>.<field>")
        shard, _, member = ref.removeprefix("tar://").partition("#")
        if not has_protocol(shard) and not shard.startswith("/"):
            shard = f"{base.rstrip('/')}/{shard}"
        buf, index = self._tar(shard)
        entry = index.get(member)
        if entry is None:
            raise ShardError(f"{where}: reference {ref!r}: no member {member!r} in {shard}")
        if isinstance(entry, bytes):
            return entry
        offset, size = entry
        assert isinstance(buf, mmap.mmap)  # members are (offset, size) only in an mmapped tar
        return bytes(buf[offset : offset + size])

    def _tar(self, shard: str) -> tuple[mmap.mmap | IO[bytes] | None, Members]:
        hit = self._open.get(shard)
        if hit is not None:
            self._open.move_to_end(shard)
            return hit[1], hit[2]
        stack = ExitStack()
        try:
            buf: mmap.mmap | IO[bytes] | None = None
            index: Members
            if compression_of(shard) is not None:  # decompressed once; its members are kept as bytes
                raw = stack.enter_context(self.opener.open(ShardRef(shard)))
                index = dict(iter_members_stream(decompressed_stream(raw, shard)[0], shard))
            else:
                buf = stack.enter_context(self.opener.open_buffer(ShardRef(shard)))
                if isinstance(buf, mmap.mmap):
                    index = {name: (offset, size) for name, offset, size in iter_members(buf, shard)}
                else:
                    index = dict(iter_members_stream(buf, shard))
        except BaseException:
            stack.close()
            raise
        self._open[shard] = (stack, buf, index)
        while len(self._open) > self.capacity:
            _, (old, _, _) = self._open.popitem(last=False)
            old.close()
        return buf, index

    def close(self) -> None:
        while self._open:
            _, (stack, _, _) = self._open.popitem()
            stack.close()


KIND = SourceKind(
    "jsonl",
    options=("resample", "ref_fields", "on_error", "shuffle_mode"),
    check_options=check_options,
    data_suffix=".jsonl",
    unit_shuffle_modes=("shard_aware", "none"),
    shuffle_mode_code="UnsupportedJsonlShuffleMode",
    subset_level="shard",
)
