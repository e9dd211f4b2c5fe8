"""The sizing rule: capacity >= readers x largest shard x (prefetch depth + 1), warned once per shortfall."""

from __future__ import annotations

import logging

import pytest

from harness.daemon_api import api
from harness.polling import wait_for
from harness.shards import make_tar_shard
from shardcached.storage import SizingCheck, required_capacity


def test_the_required_capacity_is_readers_times_largest_shard_times_depth_plus_one() -> None:
    assert required_capacity(readers=8, largest_shard=100, prefetch_depth=2) == 2400


def test_a_capacity_below_the_rule_for_the_registered_readers_is_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    check = SizingCheck(capacity=1000, prefetch_depth=2)
    check.saw_shard(100)
    with caplog.at_level(logging.WARNING, logger="shardcached.storage.sizing"):
        assert check.check(readers=3)  # 900 bytes: fits
        assert not check.check(readers=4)  # 1200 bytes
        assert not check.check(readers=4)
        check.saw_shard(200)
        assert not check.check(readers=4)  # 2400 bytes: a larger shortfall, warned again
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert "1200 bytes" in warnings[0] and "--capacity" in warnings[0]
    assert "2400 bytes" in warnings[1]


def test_the_daemon_warns_when_registered_plans_need_more_than_its_capacity(daemon_factory, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    urls = []
    for i in range(2):
        make_tar_shard(data / f"big_{i}.tar", i, samples=4, payload_bytes=100 * 1024)  # ~400 KiB each
        urls.append(str(data / f"big_{i}.tar"))
    daemon = daemon_factory(allow=[str(data)], capacity="2MiB", extra_args=["--prefetch-depth", "1"])
    log = tmp_path / "daemon0.log"
    with api(daemon) as http:
        http.post("/v1/shards/open", json={"url": urls[0]}).raise_for_status()
        for slot in range(2):  # 2 readers x ~400 KiB x 2 fits in 2 MiB
            http.post(
                "/v1/plans", json={"job": "j", "slot": slot, "epoch": 0, "urls": urls}
            ).raise_for_status()
        assert "readers x largest shard" not in log.read_text()
        for slot in range(2, 4):  # 4 readers x ~400 KiB x 2 = ~3.2 MiB does not
            http.post(
                "/v1/plans", json={"job": "j", "slot": slot, "epoch": 0, "urls": urls}
            ).raise_for_status()
    wait_for(lambda: "readers x largest shard" in log.read_text(), "the sizing warning in the daemon's log")
    assert "4 readers" in log.read_text()
