"""`CacheConfig`: mvp-dataset 0.2.3's resolved cache settings, over the `.cache()` store's own resolution.

`CacheConfig.resolve()` answers what a `.cache()` or `snapshot()` with default options would use: the root
(`cache_dir`, else `$SHARDCACHE_CACHE_DIR`, else its alias `$MVP_DATASET_CACHE_DIR`, else `.cache` in the
working directory) and the time to wait for another process's build (`$SHARDCACHE_CACHE_TIMEOUT`, else
`$MVP_DATASET_CACHE_WAIT_TIMEOUT_SECONDS`, else 6 hours). Both come from the functions the build itself
calls, so the answer cannot drift from what the build does.

Two differences from mvp-dataset: the default root is `./.cache`, not `~/.cache/mvp-dataset`; and local
files are fingerprinted by size and modification time (mvp's `"metadata"` mode) only: a content hash is
refused rather than silently ignored. mvp's `poll_interval_seconds` has no counterpart (waiters back off
from 10 ms to 0.5 s on the entry's lock) and is not a field.

Example:
    >>> from shardcache import CacheConfig
    >>> CacheConfig.resolve("/tmp/cache").root
    PosixPath('/tmp/cache')
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from shardcache import envvars
from shardcache.errors import ConfigError
from shardcache.snapshots.store import resolve_cache_root

TIMEOUT_ENV = "SHARDCACHE_CACHE_TIMEOUT"
DEFAULT_TIMEOUT_S = 6 * 3600.0
FingerprintMode = Literal["metadata", "content"]
FINGERPRINT_MODE_ENV = "MVP_DATASET_CACHE_FINGERPRINT_MODE"
_SUPPORTED_MODES = ("metadata",)


def resolve_timeout_s() -> float:
    """`$SHARDCACHE_CACHE_TIMEOUT`, else `$MVP_DATASET_CACHE_WAIT_TIMEOUT_SECONDS`, else 6 hours.

    Raises:
        ConfigError: the variable set is not a number of seconds > 0 (the message names it).
    """
    found = envvars.lookup(TIMEOUT_ENV)
    if found is None:
        return DEFAULT_TIMEOUT_S
    variable, raw = found
    try:
        seconds = float(raw)
    except ValueError as exc:
        raise ConfigError(f"{variable}={raw!r} is not a number of seconds") from exc
    if not seconds > 0:
        raise ConfigError(f"{variable}={raw!r}: the timeout must be a number of seconds > 0")
    return seconds


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Where `.cache()` entries live and how long a process waits for another one's build.

    Args:
        root: The cache root; made absolute (`~` expanded).
        fingerprint_mode: How local source files are identified: `"metadata"` (size and mtime) only.
        wait_timeout_seconds: Seconds to wait for parts another process is building (> 0).

    Raises:
        ConfigError: a mode other than `"metadata"`, or a timeout that is not > 0.
    """

    root: Path
    fingerprint_mode: FingerprintMode = "metadata"
    wait_timeout_seconds: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(os.path.abspath(Path(self.root).expanduser())))
        if self.fingerprint_mode not in _SUPPORTED_MODES:
            raise ConfigError(
                f"CacheConfig(fingerprint_mode={self.fingerprint_mode!r}): shardcache identifies local "
                "files by size and modification time only; use 'metadata'"
            )
        if not self.wait_timeout_seconds > 0:
            raise ConfigError(
                f"CacheConfig(wait_timeout_seconds={self.wait_timeout_seconds!r}): must be a number of "
                "seconds > 0"
            )

    @classmethod
    def resolve(
        cls,
        cache_dir: str | os.PathLike[str] | None = None,
        *,
        fingerprint_mode: FingerprintMode | None = None,
    ) -> CacheConfig:
        """The settings `.cache()` uses: explicit arguments, else the environment, else the defaults.

        Args:
            cache_dir: The cache root (None: `$SHARDCACHE_CACHE_DIR`, `$MVP_DATASET_CACHE_DIR`, `.cache`).
            fingerprint_mode: None: `$MVP_DATASET_CACHE_FINGERPRINT_MODE`, else `"metadata"`.
        """
        mode = fingerprint_mode or os.environ.get(FINGERPRINT_MODE_ENV) or "metadata"
        return cls(
            root=resolve_cache_root(cache_dir),
            fingerprint_mode=mode,  # type: ignore[arg-type]  # checked in __post_init__
            wait_timeout_seconds=resolve_timeout_s(),
        )
