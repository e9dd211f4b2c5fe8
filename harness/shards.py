"""Generated tar shards for tests: one shard's bytes, and a set of them on disk and in a bucket."""

from __future__ import annotations

import io
import json
import tarfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path


def make_tar_shard(path: Path, shard_index: int, samples: int, payload_bytes: int = 1024) -> list[str]:
    """Write a tar shard of `samples` samples (`<key>.bin` + `<key>.json`); return the sample keys."""
    keys = []
    with tarfile.open(path, "w") as tar:
        for i in range(samples):
            key = f"s{shard_index:04d}_{i:05d}"
            keys.append(key)
            body = bytes((shard_index * 31 + i + j) % 256 for j in range(payload_bytes))
            meta = json.dumps({"shard": shard_index, "index": i}).encode()
            for field, data in (("bin", body), ("json", meta)):
                info = tarfile.TarInfo(f"{key}.{field}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return keys


# A small dataset of unequal tar shards, for placement and elastic-resume tests.
UNEQUAL_SHARDS = 24


def unequal_samples(shard_index: int) -> int:
    return 3 + (shard_index * 5) % 7  # 3..9 samples: shards of unequal size


def unequal_keys() -> Counter[str]:
    """Every sample key of `write_unequal_tars`, once."""
    return Counter(f"s{i:04d}_{j:05d}" for i in range(UNEQUAL_SHARDS) for j in range(unequal_samples(i)))


def write_unequal_tars(root: Path) -> list[str]:
    """UNEQUAL_SHARDS tar shards of 3..9 tiny samples each under `root`; their paths in order."""
    paths = []
    for i in range(UNEQUAL_SHARDS):
        path = root / f"shard_{i:04d}.tar"
        make_tar_shard(path, i, unequal_samples(i), payload_bytes=16)
        paths.append(str(path))
    return paths


@dataclass
class ShardSet:
    """Generated tar shards, both on local disk and (when uploaded) in an S3 bucket."""

    local_dir: Path
    names: list[str]
    bucket: str | None = None

    @property
    def local_paths(self) -> list[str]:
        return [str(self.local_dir / name) for name in self.names]

    @property
    def s3_urls(self) -> list[str]:
        assert self.bucket is not None
        return [f"s3://{self.bucket}/shards/{name}" for name in self.names]

    def size_of(self, name: str) -> int:
        return (self.local_dir / name).stat().st_size

    @property
    def total_bytes(self) -> int:
        return sum(self.size_of(name) for name in self.names)
