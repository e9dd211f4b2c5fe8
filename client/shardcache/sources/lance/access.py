"""How the client reaches Lance: the package itself (an optional dependency) and the storage options of a URI.

Shared by the lance source (`sources.lance`) and the reference columns (`sources.lance.refs`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from types import ModuleType

from shardcache.errors import ConfigError

_AWS_KEYS = {
    "AWS_ACCESS_KEY_ID": "aws_access_key_id",
    "AWS_SECRET_ACCESS_KEY": "aws_secret_access_key",
    "AWS_SESSION_TOKEN": "aws_session_token",
}


def aws_storage_options(env: Mapping[str, str]) -> dict[str, str]:
    """Lance storage options from the AWS environment the rest of the client uses.

    The endpoint is `AWS_ENDPOINT_URL_S3`, else `AWS_ENDPOINT_URL` (an `http://` endpoint also sets
    `allow_http`, which Lance otherwise refuses with "builder error"); the region `AWS_REGION`, else
    `AWS_DEFAULT_REGION`; and the keys `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`.
    Lance itself also reads `AWS_ENDPOINT_URL_S3` from the environment, ahead of a given `aws_endpoint`.
    """
    options: dict[str, str] = {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        options["aws_endpoint"] = endpoint
        if endpoint.startswith("http://"):
            options["allow_http"] = "true"
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        options["aws_region"] = region
    for variable, name in _AWS_KEYS.items():
        if env.get(variable):
            options[name] = env[variable]
    return options


def storage_options_for(url: str, given: Mapping[str, str] | None) -> dict[str, str] | None:
    """What `lance.dataset(url, storage_options=...)` gets: `given` over those derived for s3:// URLs."""
    derived = aws_storage_options(os.environ) if url.startswith(("s3://", "s3a://")) else {}
    merged = {**derived, **(given or {})}
    return merged or None


def lance_module() -> ModuleType:
    """The `lance` package, or a ConfigError naming the extra that installs it."""
    try:
        import lance
    except ImportError as exc:
        raise ConfigError("the lance source needs pylance: pip install 'shardcache[lance]'") from exc
    return lance


def discover_versions(urls: Sequence[str], given: Mapping[str, str] | None) -> tuple[tuple[str, int], ...]:
    """(url, current version) of each dataset that opens now, as the pipeline pins them (mvp-dataset 0.2.3
    does so when a source is listed).

    A dataset that does not open yet (or any, without pylance) is left unpinned (read at its latest version
    when the source starts), so that a missing dataset keeps failing where it always did: when it is read.
    """
    try:
        lance = lance_module()
    except ConfigError:
        return ()  # without pylance the source itself names the extra to install, when it is read
    pinned = []
    for url in dict.fromkeys(urls):
        try:
            ds = lance.dataset(url, storage_options=storage_options_for(url, given))
        except (ValueError, OSError, RuntimeError):  # lance's "not found" / object-store errors
            continue
        pinned.append((url, int(ds.version)))
    return tuple(pinned)
