"""The daemon's one settings object, built once at start-up from layers, each over the next.

Precedence, highest first: flags; `SHARDCACHE_*` environment variables; the TOML files given with
`--config`, the last one first (so an image's defaults file, given first, is overridden by a mounted file
given after it); the built-in defaults. `load_settings` builds the settings; `gather_layers` keeps each
layer apart so that `shardcached --print-config` can say where every value came from. Nothing reads the
environment after start-up.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from shardcache_protocol import DEFAULT_METRICS_ADDR, default_socket_path

PRODUCTION_CACHE_DIR = "/var/cache/shardcache"

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_SHARE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
_BARE = re.compile(r"^\s*\d+\s*$")
MIN_BARE_CAPACITY = 1024 * 1024  # `--capacity 90` is 90 bytes: almost surely meant as 90% or 90GiB
_URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def parse_size(text: str) -> int:
    """Bytes from `'500GiB'`, `'1.5 GB'`, `'4096'`.

    Raises:
        ValueError: the text is not a size; the message lists the accepted forms.
    """
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"invalid size {text!r}: use bytes (4096), a unit (500GiB, 2TB, 64MiB) or a share of the "
            f"cache filesystem (90%)"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def check_capacity(text: str) -> None:
    """Refuse a capacity that cannot be meant: malformed, zero, a bad share, or a bare number below 1 MiB.

    Raises:
        ValueError: the message says which forms are accepted.
    """
    share = _SHARE.match(text)
    if share is not None:
        if not 0 < float(share.group(1)) <= 100:
            raise ValueError(f"invalid capacity {text!r}: a share must lie in (0%, 100%]")
        return
    size = parse_size(text)
    if size <= 0:
        raise ValueError(f"invalid capacity {text!r}: must be larger than zero")
    if _BARE.match(text) and size < MIN_BARE_CAPACITY:
        number = text.strip()
        raise ValueError(
            f"capacity {number!r} is {size} bytes (a number without a unit counts bytes): write "
            f"{number}% for a share of the cache filesystem, or a unit such as {number}GiB"
        )


def parse_capacity(text: str, cache_dir: str | Path) -> int:
    """Capacity in bytes: a size, or a percentage of the filesystem that holds `cache_dir`.

    Raises:
        ValueError: malformed text, a share outside (0, 100], a capacity of zero, or a bare number
            below 1 MiB (`90` is 90 bytes, almost surely meant as `90%` or `90GiB`).
    """
    check_capacity(text)
    share = _SHARE.match(text)
    if share is not None:
        stat = os.statvfs(cache_dir)
        return int(stat.f_blocks * stat.f_frsize * float(share.group(1)) / 100)
    return parse_size(text)


def parse_min_free(text: str, cache_dir: str | Path) -> int:
    """The free-space floor in bytes: a size, or a percentage of the size of `cache_dir`'s filesystem.

    Raises:
        ValueError: malformed text or a share outside [0, 100).
    """
    share = _SHARE.match(text)
    if share is not None:
        percent = float(share.group(1))
        if not 0 <= percent < 100:
            raise ValueError(f"invalid min_free {text!r}: a share must lie in [0%, 100%)")
        stat = os.statvfs(cache_dir)
        return int(stat.f_blocks * stat.f_frsize * percent / 100)
    return parse_size(text)


def parse_host_port(text: str) -> tuple[str, int]:
    """`('127.0.0.1', 9464)` from `'127.0.0.1:9464'` (IPv6 as `[::1]:9464`)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"invalid address {text!r}: use HOST:PORT, e.g. 127.0.0.1:9464")
    return host.strip("[]"), int(port)


class Settings(BaseSettings):
    """Everything the daemon is configured with (see `shardcached --help`)."""

    model_config = SettingsConfigDict(env_prefix="SHARDCACHE_", frozen=True, extra="forbid")

    cache_dir: Path = Field(default=Path(PRODUCTION_CACHE_DIR), description="where shards are kept")
    require_mount: Path | None = Field(
        default=None,
        description="refuse to start unless a filesystem is mounted at this path and the cache directory "
        "is on it (so a missing disk never lets the cache fill the root filesystem)",
    )
    capacity: str = Field(default="90%", description="bytes (500GiB) or share of the cache filesystem (90%)")
    min_free: str = Field(
        default="5%",
        description="free space eviction keeps on the cache filesystem, whatever the capacity says: bytes "
        "(20GiB) or a share of the filesystem's size (5%); 0 turns the floor off",
    )
    socket: str = Field(default_factory=default_socket_path, description="Unix socket of the API")
    metrics_addr: str = Field(
        default=DEFAULT_METRICS_ADDR, description="HOST:PORT of /metrics and /v1/health"
    )
    allow: Annotated[list[str], NoDecode] = Field(default_factory=list, description="allowed URL prefixes")
    immutable: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="URL prefixes of datasets never rewritten in place: their cached copies are never "
        "checked against the remote again (neither when a job begins nor after --revalidate-after-s)",
    )
    prefetch_depth: int = Field(default=2, ge=0, description="shards prefetched ahead of each plan's cursor")
    max_fetches: int = Field(default=4, ge=1, description="concurrent downloads")
    policy: Literal["belady", "lru"] = "belady"
    retries: int = Field(default=4, ge=0, description="retries of a transient remote error")
    retry_backoff_s: float = Field(default=0.2, gt=0, description="first backoff; doubles, with jitter")
    retry_backoff_max_s: float = Field(default=5.0, gt=0)
    connect_timeout_s: float = Field(default=10.0, gt=0)
    read_timeout_s: float = Field(default=60.0, gt=0)
    lease_ttl_s: float = Field(
        default=300.0,
        gt=0,
        description="a lease not released by then expires (the last resort: a lease ends when its "
        "client's session closes, or an older client's process exits)",
    )
    plan_stale_s: float = Field(
        default=600.0, gt=0, description="a plan with no opens for this long is dropped"
    )
    max_plan_urls: int = Field(
        default=4_000_000,
        ge=1,
        description="the most urls one plan may name; a longer plan is refused with 413 plan_too_large",
    )
    evict_wait_s: float = Field(
        default=10.0, ge=0, description="how long an open waits for downloads in flight to give back room"
    )
    max_job_pinned: str = Field(
        default="50%",
        description="bytes one job's open shards may pin: a share of the capacity (50%) or bytes (100GiB); "
        "past it the job's opens get 507 cache_pinned and read directly",
    )
    revalidate_after_s: float = Field(
        default=3600.0,
        ge=0,
        description="within a running job, re-check on open the remote version of a cached copy confirmed "
        "longer ago than this (0: never); a job's first reads are checked when it registers its plans",
    )
    chunk_bytes: int = Field(default=8 * 1024 * 1024, ge=64 * 1024, description="download chunk size")
    log_level: str = Field(default="INFO")

    @field_validator("allow", "immutable", mode="before")
    @classmethod
    def _split_allow(cls, value: Any) -> Any:
        # SHARDCACHE_ALLOW (and _IMMUTABLE) may be a JSON list or comma-separated prefixes.
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                import json

                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @field_validator("allow", "immutable")
    @classmethod
    def _check_allow(cls, value: list[str], info: ValidationInfo) -> list[str]:
        # A relative prefix would be resolved against whatever directory the daemon was started in.
        for prefix in value:
            if not (_URL_SCHEME.match(prefix) or prefix.startswith("/")):
                raise ValueError(
                    f"--{info.field_name} {prefix}: give a URL with its scheme (s3://bucket/prefix) or an "
                    "absolute path (/abs/path)"
                )
        return value

    @field_validator("require_mount", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        # `SHARDCACHE_REQUIRE_MOUNT=` in an environment file turns the guard off instead of naming ".".
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("require_mount")
    @classmethod
    def _check_require_mount(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError(f"--require-mount {value}: give the absolute path of the mount point")
        return value

    @field_validator("capacity")
    @classmethod
    def _check_capacity(cls, value: str) -> str:
        check_capacity(value)
        return value

    @field_validator("min_free")
    @classmethod
    def _check_min_free(cls, value: str) -> str:
        share = _SHARE.match(value)
        if share is None:
            parse_size(value)
        elif not 0 <= float(share.group(1)) < 100:
            raise ValueError(f"invalid min_free {value!r}: a share must lie in [0%, 100%)")
        return value

    @field_validator("max_job_pinned")
    @classmethod
    def _check_max_job_pinned(cls, value: str) -> str:
        share = _SHARE.match(value)
        if share is None:
            if parse_size(value) <= 0:
                raise ValueError(f"invalid max_job_pinned {value!r}: must be larger than zero")
        elif not 0 < float(share.group(1)) <= 100:
            raise ValueError(f"invalid max_job_pinned {value!r}: a share must lie in (0%, 100%]")
        return value

    @field_validator("metrics_addr")
    @classmethod
    def _check_addr(cls, value: str) -> str:
        parse_host_port(value)
        return value

    def capacity_bytes(self) -> int:
        """The capacity in bytes (a share is resolved against the cache filesystem, which must exist)."""
        return parse_capacity(self.capacity, self.cache_dir)

    def max_job_pinned_bytes(self, capacity: int) -> int:
        """The bytes one job may pin (a share is resolved against `capacity`, in bytes)."""
        share = _SHARE.match(self.max_job_pinned)
        if share is not None:
            return int(capacity * float(share.group(1)) / 100)
        return parse_size(self.max_job_pinned)

    def min_free_bytes(self) -> int:
        """The free-space floor in bytes (a share is resolved against the cache filesystem)."""
        return parse_min_free(self.min_free, self.cache_dir)


ENV_PREFIX = "SHARDCACHE_"
DEFAULT_SOURCE = "default"


@dataclass(frozen=True)
class Layer:
    """One source of settings: `source` names it for people (`flag`, `env`, `file PATH`)."""

    source: str
    values: Mapping[str, Any]

    def describe(self, name: str) -> str:
        """Where `name`'s value in this layer came from, as `--print-config` shows it."""
        if self.source == "flag":
            return f"flag --{name.replace('_', '-')}"
        if self.source == "env":
            return f"env {ENV_PREFIX}{name.upper()}"
        return self.source


def gather_layers(
    overrides: Mapping[str, Any] | None = None, config_files: str | Path | Sequence[str | Path] | None = None
) -> list[Layer]:
    """The layers in precedence order, highest first: flags (`overrides`), env, then `config_files` from the
    last given to the first.

    Raises:
        FileNotFoundError: a config file does not exist.
        ValueError: a config file is not valid TOML (the message names the file).
    """
    if config_files is None:
        files: list[str | Path] = []
    elif isinstance(config_files, str | Path):
        files = [config_files]
    else:
        files = list(config_files)
    layers = [Layer("flag", dict(overrides or {})), Layer("env", EnvSettingsSource(Settings)())]
    for path in reversed(files):
        if not Path(path).is_file():
            raise FileNotFoundError(f"config file {path} does not exist")
        try:
            values = TomlConfigSettingsSource(Settings, toml_file=path)()
        except ValueError as exc:  # tomllib.TOMLDecodeError
            raise ValueError(f"config file {path} is not valid TOML: {exc}") from exc
        layers.append(Layer(f"file {path}", values))
    return layers


def settings_from(layers: Sequence[Layer]) -> Settings:
    """The settings the layers make, each value taken from the highest layer that has it.

    Raises:
        pydantic.ValidationError: a value is invalid or a key unknown (the message names the setting).
    """
    merged: dict[str, Any] = {}
    for layer in reversed(layers):
        merged.update(layer.values)
    # model_validate, not the constructor: BaseSettings' constructor would read the environment again.
    return Settings.model_validate(merged)


def source_of(name: str, layers: Sequence[Layer]) -> str:
    """Where the effective value of setting `name` comes from: a layer's description, or `default`."""
    for layer in layers:
        if name in layer.values:
            return layer.describe(name)
    return DEFAULT_SOURCE


def load_settings(
    overrides: Mapping[str, Any] | None = None, config_file: str | Path | Sequence[str | Path] | None = None
) -> Settings:
    """Settings from `overrides` (flags) over `SHARDCACHE_*` env over the TOML file(s), last file first.

    Raises:
        pydantic.ValidationError: a value is invalid (the message names the field).
        FileNotFoundError: a config file does not exist.
        ValueError: a config file is not valid TOML.
    """
    return settings_from(gather_layers(overrides, config_file))


def render_effective(settings: Settings, layers: Sequence[Layer]) -> str:
    """Every effective setting as a TOML line with its source in a comment (`shardcached --print-config`).

    The output is itself a valid config file. Values are written with `json.dumps`: for the strings,
    numbers and string lists the settings hold, JSON's notation is TOML's, and the standard library has a
    TOML reader but no writer.
    """
    lines = [
        "# shardcached effective settings; precedence, highest first: flags, SHARDCACHE_* environment",
        "# variables, --config files (the last given first), defaults",
    ]
    for name in Settings.model_fields:
        value = getattr(settings, name)
        source = source_of(name, layers)
        if value is None:
            lines.append(f"# {name} is not set  # {source}")
            continue
        text = json.dumps([str(v) for v in value] if isinstance(value, list) else value, default=str)
        lines.append(f"{name} = {text}  # {source}")
    return "\n".join(lines) + "\n"


def describe_sources(settings: Settings, layers: Sequence[Layer]) -> str:
    """One line for the start-up log: every setting not at its default, with its value and source."""
    shown = [
        f"{name}={getattr(settings, name)} ({source})"
        for name in Settings.model_fields
        if (source := source_of(name, layers)) != DEFAULT_SOURCE
    ]
    return ", ".join(shown) or "all defaults"
