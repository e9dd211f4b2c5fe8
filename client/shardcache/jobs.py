"""The default job name: what the daemon's plans and the `job` label of the client metrics are called.

`SHARDCACHE_JOB` wins. Otherwise the name is the training script's name and a short hash of the shard list
and seed, e.g. `train-3f9a1c2e` for `torchrun train.py` reading some shards with seed 0:

- the script is `sys.argv[0]` without its folder and suffix (`python -m pkg.train` gives `train`; a
  package's `__main__.py` gives the package's folder name; `python -c` and an interactive session give
  `python`), reduced to letters, digits, `.`, `_` and `-`;
- the hash is the first 8 hex digits of the SHA-256 of the seed and the shard URLs, one per line.

Every rank of a job runs the same script over the same shards with the same seed, so every rank (and every
DataLoader worker, which inherits `sys.argv`) derives the same name without talking to the others; two
datasets of one script get two names.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Sequence
from pathlib import PurePath

JOB_ENV = "SHARDCACHE_JOB"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_SCRIPT = 64


def script_name(argv0: str | None = None) -> str:
    """The running script's short name (see the module docstring); `argv0` defaults to `sys.argv[0]`."""
    raw = sys.argv[0] if argv0 is None and sys.argv else argv0 or ""
    if raw in ("", "-", "-c"):
        return "python"
    path = PurePath(raw)
    stem = path.parent.name if path.stem == "__main__" else path.stem
    cleaned = _UNSAFE.sub("-", stem).strip("-.")[:_MAX_SCRIPT]
    return cleaned or "python"


def shards_hash(urls: Sequence[str], seed: int) -> str:
    """A short stable hash of the shard list and seed (the same on every rank)."""
    return blob_hash("\n".join(urls).encode(), len(urls), seed)


def blob_hash(blob: bytes, count: int, seed: int) -> str:
    """`shards_hash` of `count` URLs given as one buffer, joined by newlines and UTF-8 encoded
    (`shards.urls_blob`): hashed as it is, with no copy of it."""
    digest = hashlib.sha256(f"{seed}\n".encode())
    if count:  # the same bytes as url + "\n" per url
        digest.update(blob)
        digest.update(b"\n")
    return digest.hexdigest()[:8]


def default_job(urls: Sequence[str], seed: int) -> str:
    """`SHARDCACHE_JOB`, else `<script>-<hash>` (see the module docstring)."""
    return job_named(shards_hash(urls, seed))


def job_named(digest: str) -> str:
    """`SHARDCACHE_JOB`, else `<script>-<digest>`: `default_job` for a `shards_hash` computed already."""
    return os.environ.get(JOB_ENV) or f"{script_name()}-{digest}"
