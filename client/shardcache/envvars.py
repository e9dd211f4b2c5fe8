"""Environment variables that mvp-dataset 0.2.3 reads, honoured as aliases of ours.

A script written for mvp-dataset keeps working when it sets mvp's variable instead of ours:

- `SHARDCACHE_CACHE_DIR` <- `MVP_DATASET_CACHE_DIR`: the root of the `.cache()` / `snapshot()` entries;
- `SHARDCACHE_CACHE_TIMEOUT` <- `MVP_DATASET_CACHE_WAIT_TIMEOUT_SECONDS`: seconds to wait for a builder;
- `LOADER_TAR_KEY_DOT_LEVEL` <- `MVP_DATASET_TAR_KEY_DOT_LEVEL`: dots of a tar member name in the key;
- `LOADER_JSONL_TAR_CACHE_SIZE` <- `MVP_DATASET_TAR_MAX_OPEN_FILES`: tar shards a jsonl source keeps open.

Ours wins when both are set: it is the more specific choice (a deployment of shardcache sets it on
purpose, while the mvp name may linger in a shared environment file), and a value never changes meaning
because another variable appeared. An empty variable counts as unset. The variables are read when the
feature runs, never at import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

MVP_ALIASES: Mapping[str, str] = {
    "SHARDCACHE_CACHE_DIR": "MVP_DATASET_CACHE_DIR",
    "SHARDCACHE_CACHE_TIMEOUT": "MVP_DATASET_CACHE_WAIT_TIMEOUT_SECONDS",
    "LOADER_TAR_KEY_DOT_LEVEL": "MVP_DATASET_TAR_KEY_DOT_LEVEL",
    "LOADER_JSONL_TAR_CACHE_SIZE": "MVP_DATASET_TAR_MAX_OPEN_FILES",
}


def lookup(name: str, environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """The variable that sets `name`, and its value: `name` itself, else its mvp-dataset alias.

    Args:
        name: One of our variables (a key of `MVP_ALIASES`, or any other, which then has no alias).
        environ: The environment to read (default: `os.environ`).

    Returns:
        `(variable, value)` of the first of the two that is set and not empty, or None. Error messages
        name `variable`, so that a bad value points at the variable the user really set.

    Example:
        >>> lookup("SHARDCACHE_CACHE_DIR", {"MVP_DATASET_CACHE_DIR": "/mnt/cache"})
        ('MVP_DATASET_CACHE_DIR', '/mnt/cache')
    """
    env = os.environ if environ is None else environ
    alias = MVP_ALIASES.get(name)
    for variable in (name, alias) if alias else (name,):
        value = env.get(variable)
        if value:
            return variable, value
    return None


def get(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of `name`, else of its mvp-dataset alias, else None (see `lookup`)."""
    found = lookup(name, environ)
    return None if found is None else found[1]


DEFAULT_CACHE_DIR = ".cache"
CACHE_DIR_ENV = "SHARDCACHE_CACHE_DIR"


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The one cache root every derived artifact lives under (snapshots, Lance filter and reference indexes):
    `cache_dir`, else `$SHARDCACHE_CACHE_DIR` (else its alias `$MVP_DATASET_CACHE_DIR`), else `.cache` in the
    working directory; `~` is expanded.

    The environment variable also replaces the default `.cache` when that is passed explicitly (the
    signature of `Dataset.cache` spells the default out). It lives here, in the base layer, because the
    sources (which write the Lance indexes) sit below the snapshots.
    """
    if cache_dir is None or os.fspath(cache_dir) == DEFAULT_CACHE_DIR:
        cache_dir = get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR
    return Path(cache_dir).expanduser().absolute()
