"""Mini epochs through a real daemon: the whole epoch's order is planned, so the next chunk is prefetched."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest

from harness.pipelines import make_tars
from shardcache import Dataset, RuntimeContext
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.errors import ConfigError
from shardcache.sources.deal.schedule import slot_order
from shardcache.sources.options import PlanHints


def resident(client: DaemonClient) -> dict[str, float | None]:
    return {os.path.basename(s.url): s.next_use for s in client.shards()}


def test_next_chunk_is_planned_and_prefetched_while_the_current_one_is_read(
    tmp_path: Path, daemon_factory
) -> None:  # type: ignore[no-untyped-def]
    shards = make_tars(tmp_path / "tars", 8, 3)
    daemon = daemon_factory(allow=[str(tmp_path / "tars")])
    client = DaemonClient(str(daemon.socket), required=True)
    ctx = RuntimeContext(seed=5)
    ds = Dataset.from_source("tars", shards, daemon=client, context=ctx)
    first, second = ds.mini_epochs(4, num_workers=0)
    assert len(list(first)) == 12
    # What the second chunk opens first, in its own slot order; the daemon prefetches 2 ahead by default.
    urls = [ref.url for ref in second.source.shards]
    upcoming = [os.path.basename(urls[i]) for i in slot_order(len(urls), ctx, 0)][:2]
    deadline = time.monotonic() + 30
    while not set(upcoming) <= set(resident(client)) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the daemon's listing with a deadline, not waiting for readiness blindly
    listing = resident(client)
    assert set(upcoming) <= set(listing), f"chunk 2's first shards {upcoming} were not prefetched: {listing}"
    assert all(listing[name] is not None for name in upcoming), (
        "prefetched shards must have a planned next use"
    )
    hits = client.stats().hits
    assert len(list(second)) == 12
    assert client.stats().hits >= hits + 2  # the prefetched shards were served from the node cache


def test_chunks_share_one_job_and_keep_the_plain_fingerprint(tmp_path: Path) -> None:
    ds = Dataset.from_source("tars", make_tars(tmp_path / "tars", 6, 2), daemon=None)
    chunks = ds.mini_epochs(2, num_workers=0)
    assert len({c.source.hints.job for c in chunks}) == 1
    assert [len(c.source.hints.plan_following or ()) for c in chunks] == [5, 4, 3]  # rest + next epoch's 3
    plain = Dataset(chunks[0].spec.with_source(dataclasses.replace(chunks[0].source, hints=PlanHints())))
    assert chunks[0].fingerprint() == plain.fingerprint()  # planning hints are not part of the data


def test_bad_plan_following_is_refused_naming_the_option(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="plan_following=.*not an \\(epoch, \\[url, ...\\]\\) pair"):
        Dataset.from_source("tars", make_tars(tmp_path / "t", 1, 1), daemon=None, plan_following=[["a"]])
