"""`shardcache manifest`: write a `.jsonl` manifest of shards with their sizes, checksums and sample counts.

Counting needs the shard formats (tar members, jsonl lines, parquet footers, compression), so this lives
with the sources; reading a manifest is the base layer's (`shardcache.shards.read_manifest`).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import secrets
from pathlib import Path

import fsspec

from shardcache.errors import ConfigError
from shardcache.node import JSONObject
from shardcache.shards import ShardSpec, expand_shards
from shardcache.sources.compression import decompress_all, plain_name
from shardcache.sources.tarfmt import iter_tar_samples, sample_index

logger = logging.getLogger(__name__)


def count_shard_samples(url: str, data: bytes) -> int | None:
    """Samples in a shard's bytes: tar samples, jsonl lines, parquet rows; None for other kinds.

    Compressed tar and jsonl shards (`.tar.gz`, `.tgz`, `.jsonl.gz`, `.tar.zst`, `.jsonl.zst`) are counted
    after decompression.
    """
    kind = plain_name(url)
    if kind != url and kind.endswith((".tar", ".jsonl")):
        data = decompress_all(data, url)
    if kind.endswith(".tar"):
        return sum(1 for _ in iter_tar_samples(data, url))
    if kind.endswith(".jsonl"):
        return sum(1 for line in data.splitlines() if line.strip())
    if url.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ConfigError(
                f"{url}: counting parquet rows needs pyarrow: pip install 'shardcache[parquet]'"
            ) from exc

        return int(pq.ParquetFile(io.BytesIO(data)).metadata.num_rows)
    return None


def write_manifest(pattern: ShardSpec, output: str | os.PathLike[str], *, count_samples: bool = True) -> int:
    """Write a `.jsonl` manifest of the shards `pattern` expands to; returns the number of shards.

    Each line holds `url`, `size`, `checksum` ("sha256:<hex>") and, when `count_samples`, `num_samples` for
    tar, jsonl and parquet shards (and `sample_offsets` for plain tars: see `ShardRef`). The file is written
    atomically (temporary name, then rename).
    """
    refs = expand_shards(pattern, data_suffix=".jsonl")
    out = Path(output)
    lines = []
    for ref in refs:
        with fsspec.open(ref.url, "rb") as f:
            data = f.read()
        row: JSONObject = {
            "url": ref.url,
            "size": len(data),
            "checksum": f"sha256:{hashlib.sha256(data).hexdigest()}",
        }
        if count_samples:
            row["num_samples"] = count_shard_samples(ref.url, data)
            if ref.url.endswith(".tar"):
                index = sample_index(data)
                if index is not None:
                    row["sample_offsets"] = list(index[1])
        lines.append(json.dumps(row) + "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    # Created 0o666 less the umask, as `open()` would (mkstemp's 0o600 would hide it from a trainer's group).
    tmp = str(out.parent / f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    logger.info("wrote manifest %s with %d shards", out, len(refs))
    return len(refs)
