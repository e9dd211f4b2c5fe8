"""Plans are soft state in the daemon: a slot registers its plans again when the daemon comes back."""

from __future__ import annotations

import time
from pathlib import Path

from harness.pipelines import keys, make_tars, plans_when
from shardcache import Dataset, RuntimeContext
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.sources.deal.schedule import slot_order

DEADLINE_S = 30.0


def wait_until_resident(observer: DaemonClient, urls: list[str]) -> set[str]:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        resident = {shard.url for shard in observer.shards()}
        if set(urls) <= resident or time.monotonic() > deadline:
            return resident
        time.sleep(0.05)  # polling the daemon with a deadline, not waiting for readiness blindly


def test_a_daemon_killed_and_restarted_mid_epoch_gets_the_remaining_plan_and_prefetches_it(  # type: ignore[no-untyped-def]
    tmp_path: Path, short_tmp: Path, daemon_factory
) -> None:
    shards = make_tars(tmp_path / "tars", 8, 3)
    socket = short_tmp / "node.sock"
    options = {
        "allow": [str(tmp_path / "tars")],
        "socket_path": socket,
        "extra_args": ["--prefetch-depth", "8"],
    }
    first = daemon_factory(cache_dir=tmp_path / "cache1", **options)
    ctx = RuntimeContext(seed=3)
    order = [shards[u] for u in slot_order(len(shards), ctx, 0)]
    ds = Dataset.from_source("tars", shards, daemon=DaemonClient(str(socket)), context=ctx)
    it = ds.iter_context()
    got = [next(it)["__key__"] for _ in range(4)]  # into the second shard of the order
    first.kill()
    # A fresh cache directory: the restarted daemon holds nothing, so what it fetches is what it was told.
    daemon_factory(cache_dir=tmp_path / "cache2", **options)
    observer = DaemonClient(str(socket), required=True)
    assert observer.plans() == []
    got += [next(it)["__key__"] for _ in range(3)]  # the open of the third shard reaches the new daemon

    plans = plans_when(observer, 2)
    assert [(p["slot"], p["epoch"], p["len"]) for p in plans] == [(0, 0, len(order) - 3), (0, 1, len(order))]
    assert set(order[3:]) <= wait_until_resident(observer, order[3:])
    got += [sample["__key__"] for sample in it]
    assert got == keys(Dataset.from_source("tars", shards, daemon=None, context=ctx).iter_context())


def test_a_client_that_fell_back_to_direct_reads_registers_its_plans_when_the_daemon_returns(  # type: ignore[no-untyped-def]
    tmp_path: Path, short_tmp: Path, daemon_factory
) -> None:
    shards = make_tars(tmp_path / "tars", 8, 3)
    socket = short_tmp / "node.sock"
    options = {
        "allow": [str(tmp_path / "tars")],
        "socket_path": socket,
        "extra_args": ["--prefetch-depth", "8"],
    }
    first = daemon_factory(cache_dir=tmp_path / "cache1", **options)
    ctx = RuntimeContext(seed=5)
    order = [shards[u] for u in slot_order(len(shards), ctx, 0)]
    ds = Dataset.from_source(
        # restart_wait_s=0: the killed daemon is not waited for; its shards are read directly at once
        "tars",
        shards,
        daemon=DaemonClient(str(socket), reprobe_interval=0.01, restart_wait_s=0),
        context=ctx,
    )
    it = ds.iter_context()
    got = [next(it)["__key__"] for _ in range(4)]
    first.kill()
    got += [next(it)["__key__"] for _ in range(3)]  # the third shard is read directly: no daemon answers
    daemon_factory(cache_dir=tmp_path / "cache2", **options)
    observer = DaemonClient(str(socket), required=True)
    got += [next(it)["__key__"] for _ in range(3)]  # the fourth shard's open reaches the daemon again

    plans = plans_when(observer, 2)
    assert [(p["epoch"], p["len"]) for p in plans] == [(0, len(order) - 4), (1, len(order))]
    assert set(order[4:]) <= wait_until_resident(observer, order[4:])
    got += [sample["__key__"] for sample in it]
    assert got == keys(Dataset.from_source("tars", shards, daemon=None, context=ctx).iter_context())
