"""Helpers of the hardening tests: an API client on the daemon's socket, scrapes, polling, cache checks."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from shardcache.devservers import Daemon

from .faultproxy import FaultProxy


def api(daemon: Daemon | str, timeout: float = 60.0) -> httpx.Client:
    """An httpx client speaking to the daemon's Unix socket."""
    socket = daemon if isinstance(daemon, str) else daemon.socket
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=socket), base_url="http://shardcached", timeout=timeout
    )


def metric(daemon: Daemon, name: str, labels: str = "") -> float:
    """One sample from a live scrape of the metrics listener (0 when absent)."""
    text = httpx.get(daemon.metrics_url, timeout=10).text
    pattern = re.escape(name) + (re.escape("{" + labels + "}") if labels else "") + r" ([0-9.e+-]+)"
    match = re.search(r"^" + pattern + r"$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def wait_for(check: Callable[[], bool], what: str, deadline_s: float = 30.0) -> None:
    """Poll `check` until it is true; fail after the deadline."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out after {deadline_s:.0f}s waiting for {what}")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def published_shards(cache_dir: Path) -> dict[str, Path]:
    """URL -> data file of every shard the cache directory publishes (a `.meta.json` beside its data)."""
    found = {}
    for meta in cache_dir.glob("*.meta.json"):
        try:
            info = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue  # removed while we looked
        found[str(info["url"])] = cache_dir / str(info["file"])
    return found


def assert_cache_intact(cache_dir: Path, originals: dict[str, Path]) -> int:
    """Every published shard is byte-identical to its original; no temp file is left. Returns the count."""
    shards = published_shards(cache_dir)
    for url, data in shards.items():
        assert url in originals, f"{url} published but never requested"
        assert data.stat().st_size == originals[url].stat().st_size, f"{data} ({url}) has the wrong size"
        assert sha256(data) == sha256(originals[url]), f"{data} ({url}) differs from the remote object"
    leftovers = [p.name for p in cache_dir.iterdir() if p.name.startswith(".tmp-")]
    assert leftovers == [], f"temp files left in the cache: {leftovers}"
    return len(shards)


def proxy_env(proxy: FaultProxy) -> dict[str, str]:
    """Environment that sends a daemon's S3 traffic through `proxy`."""
    return {"AWS_ENDPOINT_URL_S3": proxy.endpoint, "AWS_ENDPOINT_URL": proxy.endpoint}
