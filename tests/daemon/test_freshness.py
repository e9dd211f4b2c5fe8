"""Freshness in-process: when a job begins (its copies must be confirmed since) or goes on, and what an open
waits for. A fake HEAD stands in for the remote; the store, planner and space are real."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from shardcached.fetching.fetcher import Fetcher, RemoteInfo
from shardcached.freshness import Freshness
from shardcached.keys import cache_key
from shardcached.metrics import Metrics
from shardcached.planning.planner import Planner
from shardcached.planning.plans import Plan
from shardcached.storage.layout import Entry
from shardcached.storage.space import Space
from shardcached.storage.store import Store
from shardcached.versions import Page, RemoteVersions


def entry(url: str, validated_at: float, cache_dir: Path = Path("/nonexistent")) -> Entry:
    key = cache_key(url, "v1")
    return Entry(key=key, url=url, version="v1", size=1, path=cache_dir / key, validated_at=validated_at)


# -- when a job begins --------------------------------------------------------------------------------------


@dataclass
class Rig:
    """A Freshness over a real store, planner and space, a clock the test moves and a HEAD that counts."""

    tmp_path: Path
    versions: RemoteVersions | None = None
    now: list[float] = field(default_factory=lambda: [10.0])
    heads: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        clock: Callable[[], float] = lambda: self.now[0]  # noqa: E731
        self.store = Store(self.tmp_path, capacity=1 << 30, clock=clock)
        self.planner = Planner(prefetch_depth=0, clock=clock)
        metrics = Metrics(CollectorRegistry())
        space = Space(self.store, self.planner, metrics, evict_wait_s=1.0, clock=clock, closing=lambda: False)

        async def head(url: str) -> tuple[float, RemoteInfo]:
            self.heads.append(url)
            return clock(), RemoteInfo(1, "v1")

        async def blocking(fn: Callable[..., Any], *args: Any) -> Any:
            return await asyncio.to_thread(fn, *args)

        def spawn(coro: Awaitable[Any]) -> asyncio.Task[Any]:
            return asyncio.ensure_future(coro)

        self.freshness = Freshness(
            self.store,
            space,
            self.planner,
            self.versions or RemoteVersions(Fetcher()),
            metrics,
            head=head,
            learned=lambda url, asked, info: None,
            blocking=blocking,
            spawn=spawn,
            changed=lambda: None,
            clock=clock,
            revalidate_after_s=3600.0,
            immutable=None,
            cancel=threading.Event(),
        )

    def register(self, job: str, epoch: int, urls: list[str]) -> Plan:
        ended = self.freshness.ended(job)
        plan, _ = self.planner.begin_plan(job, 0, epoch, list(urls))  # the plan takes its list over
        self.freshness.plan_registered(plan, job_ended=ended)
        return plan

    def cached(self, url: str, validated_at: float) -> Entry:
        copy = entry(url, validated_at, self.tmp_path)
        self.store.add(copy)
        return copy

    async def checked(self, copy: Entry, plan: Plan) -> bool:
        """Whether serving `copy` under `plan` sent a HEAD first."""
        before = len(self.heads)
        assert await self.freshness.servable(copy, plan.id, plan.chain.job)
        return len(self.heads) > before


# https urls: gathered into chunks of their own, which the rig runs only when a test starts its workers
# (`bulk.run`): otherwise every check a test sees is the open's own HEAD.
URLS = ["https://h/a.tar", "https://h/b.tar"]


def test_a_plan_of_a_job_with_no_plan_begins_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        rig = Rig(tmp_path)
        copy = rig.cached(URLS[0], validated_at=5.0)
        plan = rig.register("job", 0, URLS)
        assert await rig.checked(copy, plan)  # confirmed at 5, the job began at 10
        assert not await rig.checked(copy, plan)  # confirmed at 10 by that HEAD

    asyncio.run(scenario())


def test_the_next_epochs_plan_of_a_running_job_goes_on_with_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        rig = Rig(tmp_path)
        rig.register("job", 0, URLS)
        copy = rig.cached(URLS[0], validated_at=12.0)
        rig.now[0] = 20.0
        later = rig.register("job", 1, URLS)
        assert not await rig.checked(copy, later)

    asyncio.run(scenario())


def test_a_job_whose_plans_were_deleted_begins_anew(tmp_path: Path) -> None:
    async def scenario() -> None:
        rig = Rig(tmp_path)
        first = rig.register("job", 0, URLS)
        copy = rig.cached(URLS[0], validated_at=12.0)
        rig.planner.delete_plan(first.id)
        rig.now[0] = 20.0
        again = rig.register("job", 0, URLS)
        assert await rig.checked(copy, again)

    asyncio.run(scenario())


def test_a_job_whose_plans_were_left_by_exited_processes_begins_anew(tmp_path: Path) -> None:
    async def scenario() -> None:
        rig = Rig(tmp_path)
        left = rig.register("job", 1, URLS)  # a finished run leaves its next epoch's plan
        copy = rig.cached(URLS[0], validated_at=12.0)
        rig.planner.orphan(left.id, 5.0)  # its process exited
        rig.now[0] = 13.0
        rerun = rig.register("job", 0, URLS)
        assert await rig.checked(copy, rerun)

    asyncio.run(scenario())


def test_a_plan_left_by_an_exited_process_and_registered_again_goes_on_with_its_job(tmp_path: Path) -> None:
    async def scenario() -> None:
        rig = Rig(tmp_path)
        following = rig.register("job", 1, URLS)  # the epoch's workers announced the next epoch
        copy = rig.cached(URLS[0], validated_at=11.0)
        rig.planner.orphan(following.id, 5.0)  # the workers exited at the epoch's end
        rig.now[0] = 12.0
        again = rig.register("job", 1, URLS)  # the next epoch's workers register it again
        assert again is following
        assert not await rig.checked(copy, again)

    asyncio.run(scenario())


def test_an_immutable_plan_serves_its_copies_unchecked(tmp_path: Path) -> None:
    async def scenario() -> None:
        rig = Rig(tmp_path)
        copy = rig.cached(URLS[0], validated_at=5.0)
        plan, _ = rig.planner.begin_plan("job", 0, 0, list(URLS))
        rig.freshness.plan_registered(plan, job_ended=rig.freshness.ended("job"), immutable=True)
        assert not await rig.checked(copy, plan)

    asyncio.run(scenario())


def test_an_open_does_not_wait_for_a_page_in_flight_before_any_page_showed_its_time(tmp_path: Path) -> None:
    release = threading.Event()

    class HeldPages(RemoteVersions):
        def page(self, pending: Sequence[str], after: str | None, cancel: threading.Event) -> Page:
            release.wait(30)
            return Page({pending[0]: RemoteInfo(1, "v1")}, 1)

    async def scenario() -> None:
        rig = Rig(tmp_path, versions=HeldPages(Fetcher()))
        workers = asyncio.ensure_future(rig.freshness.bulk.run())
        copies = [rig.cached(url, validated_at=5.0) for url in URLS]
        plan = rig.register("job", 0, URLS)
        deadline = time.monotonic() + 10
        while rig.freshness.bulk.in_flight(URLS[1]) is None:  # polled with a deadline
            assert time.monotonic() < deadline, "the chunk's first page never went out"
            await asyncio.sleep(0.01)
        assert await rig.checked(copies[1], plan)  # a HEAD of its own, the held page still out
        release.set()
        workers.cancel()

    asyncio.run(scenario())
