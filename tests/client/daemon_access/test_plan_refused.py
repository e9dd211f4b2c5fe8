"""A plan the daemon refuses as too long (413): the slot reads on through the daemon, logged once."""

from __future__ import annotations

import logging

import pytest

from harness.shards import ShardSet
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.sources.deal.schedule import PlanTracker


def test_a_plan_over_the_daemons_bound_is_logged_once_and_reads_go_on(
    daemon_factory, local_shards: ShardSet, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)], extra_args=["--max-plan-urls", "2"])
    paths = local_shards.local_paths
    with DaemonClient(daemon.socket, required=True) as client:
        tracker = PlanTracker(client, "job", 0)
        with caplog.at_level(logging.WARNING, logger="shardcache.sources.deal.schedule"):
            assert tracker.start(0, paths, lambda: paths) is None
            assert not tracker.stale()  # no re-registration before every shard
            assert tracker.start(1, paths, lambda: paths) is None
            tracker.close()  # waits for the next epoch's registration, made in the background
        refusals = [r for r in caplog.records if "refused the plan" in r.getMessage()]
        assert len(refusals) == 1 and "--max-plan-urls" in refusals[0].getMessage()
        with client.open(paths[0]) as shard:
            assert shard.read()
        assert client.stats().plans == 0
