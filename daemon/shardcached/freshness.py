"""Which cached copy may be served to which open, and validating copies against the remote in bulk.

Two bounds (docs/reliability.md, "Changed remote object"):

- A job never reads a copy older than the remote was when the job began. A job begins when a plan arrives
  and no plan of its job id is live and held: none was registered (every job after a daemon restart), or
  all were deleted, expired, or left by processes that exited (owners.py drops those within seconds). A
  rerun of a script under the same job id therefore begins anew, while a plan left by an exited process
  and registered again (the next epoch's DataLoader workers, an elastic restart) continues its job. That
  moment is the job's *since*: a copy is served under any plan of the job only once the remote confirmed
  its version at or after it (the copy's `validated_at`).
- Within a running job `--revalidate-after-s` bounds staleness: a copy confirmed longer ago is checked on
  open. Opens without a plan get this bound only.

Checking a plan's resident shards one HEAD each would cost 10^5 requests for a 10^5-shard plan. Instead,
when a plan is registered, its resident copies confirmed before *since* are checked in the background by
listing pages, in plan order (bulkcheck.py, versions.py: one request per 1,000 objects on S3). A changed
object's copy is dropped (evicted `stale`; readers that have it open keep their file) and fetched again
when needed; an unchanged one is confirmed.

An open never waits for a whole plan's validation: a copy confirmed since the job began is served at once;
one whose chunk has a request in flight waits for that page if it should answer no later than a HEAD
would (from the durations seen so far: a page of 1,000 objects takes several HEADs' time on S3, and far
more on slow listings such as moto's); any other is checked by a HEAD of its own (concurrent opens of one
url share it), and so is the shard a reader opens next when its plan arrives. A registration is answered
before any of this runs.

Datasets declared immutable skip all of it: urls under `--immutable` prefixes, and every open under a plan
registered with `"immutable": true`.

After a restart a recovered copy counts as never confirmed (layout.NEVER_VALIDATED): the daemon cannot tell
what changed while it was down, and the monotonic clock it confirms with starts again with the node.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from shardcached.bulkcheck import BulkCheck, Chunk, smoothed
from shardcached.errors import NotFound
from shardcached.fetching.fetcher import RemoteInfo
from shardcached.keys import AllowList
from shardcached.metrics import Metrics
from shardcached.owners import PLAN_ORPHAN_GRACE_S
from shardcached.planning.planner import Planner
from shardcached.planning.plans import Plan
from shardcached.storage.layout import NEVER_VALIDATED, Entry
from shardcached.storage.space import Space
from shardcached.storage.store import Store
from shardcached.versions import RemoteVersions

logger = logging.getLogger(__name__)

JOBS_SWEPT = 64  # jobs looked at per housekeeping tick, for those whose plans are all gone

# One HEAD of a url: (when it was asked, the remote's answer).
Head = Callable[[str], Awaitable[tuple[float, RemoteInfo]]]


@dataclass(eq=False)
class _Job:
    since: float  # when the job began: a copy served to it must have been confirmed at or after this
    plans: set[str] = field(default_factory=set)  # its plan ids, some perhaps dropped since


class Freshness:
    """Decides whether a resident copy may be served, and validates plans' copies in the background.

    Args:
        head: one HEAD of a url (shared with downloads, which reuse its answer).
        learned: told what a listing said of a changed or gone object, as of when it was asked (None:
            gone), so that a download reuses nothing older.
        blocking: runs a blocking call in the service's thread pool.
        spawn: starts a task the service waits for at shutdown.
        changed: called when a copy was dropped (the prefetcher may fetch it again).
        immutable: prefixes of urls never checked; None: none.
        cancel: set at shutdown; stops the retries of a listing.
    """

    def __init__(
        self,
        store: Store,
        space: Space,
        planner: Planner,
        versions: RemoteVersions,
        metrics: Metrics,
        *,
        head: Head,
        learned: Callable[[str, float, RemoteInfo | None], None],
        blocking: Callable[..., Awaitable[object]],
        spawn: Callable[[Awaitable[object]], asyncio.Task[None]],
        changed: Callable[[], None],
        clock: Callable[[], float],
        revalidate_after_s: float,
        immutable: AllowList | None,
        cancel: threading.Event,
    ) -> None:
        self._store = store
        self._space = space
        self._planner = planner
        self._metrics = metrics
        self._head_request = head
        self._learned = learned
        self._spawn = spawn
        self._changed = changed
        self._clock = clock
        self.revalidate_after_s = revalidate_after_s
        self._immutable = immutable
        self._jobs: dict[str, _Job] = {}
        self._immutable_plans: set[str] = set()
        self._heads: dict[str, tuple[float, asyncio.Task[None]]] = {}  # url -> (asked at, the HEAD)
        self._head_s: float | None = None  # how long a HEAD takes, smoothed; None: none seen yet
        self.bulk = BulkCheck(
            store,
            versions,
            settle=self._settle,
            gone=self._gone,
            head=lambda url, not_before: asyncio.shield(self._heading(url, not_before)),
            blocking=blocking,
            clock=clock,
            immutable=immutable,
            cancel=cancel,
        )

    # -- opens ------------------------------------------------------------------------------------------
    async def servable(self, entry: Entry, plan: str | None = None, job: str | None = None) -> bool:
        """Whether resident `entry` may be served to an open under `plan` (of `job`), after checking it
        against the remote when it must be; False once it was dropped (changed, gone or evicted meanwhile).

        Raises:
            NotFound, RemoteError: the HEAD of the copy's object failed, as a fetch would.
        """
        since = self._since(plan, job)
        if not self._stale(entry, plan, since):
            return True
        url = entry.url
        not_before = NEVER_VALIDATED if since is None else since
        held = self._heads.get(url)
        chunk = self.bulk.in_flight(url)
        if (held is None or held[0] < not_before) and chunk is not None and self._page_sooner(chunk):
            assert chunk.page is not None
            await asyncio.shield(chunk.page)
            if self._store.by_url.get(url) is not entry:
                return False
            if not self._stale(entry, plan, since):
                return True
        await asyncio.shield(self._heading(url, not_before))
        return self._store.by_url.get(url) is entry

    def _page_sooner(self, chunk: Chunk) -> bool:
        """Whether `chunk`'s page in flight is expected to answer no later than a HEAD sent now would."""
        page_s, head_s = self.bulk.page_s, self._head_s
        if page_s is None or head_s is None:
            return False  # no idea yet how long a page takes: a HEAD is bounded
        return chunk.page_asked + page_s - self._clock() <= head_s

    def _since(self, plan: str | None, job: str | None) -> float | None:
        """When the job of an open under `plan` began; None without a plan registered here."""
        if plan is None or job is None:
            return None
        state = self._jobs.get(job)
        return state.since if state is not None and plan in state.plans else None

    def _stale(self, entry: Entry, plan: str | None, since: float | None) -> bool:
        if entry.suspect:  # a client found it corrupt: every open checks the remote until it changes
            return True
        if plan in self._immutable_plans or self._declared_immutable(entry.url):
            return False
        if since is not None and entry.validated_at < since:
            return True
        after = self.revalidate_after_s
        return after > 0 and self._clock() - entry.validated_at > after

    def _declared_immutable(self, url: str) -> bool:
        return self._immutable is not None and self._immutable.allows(url)

    def _heading(self, url: str, not_before: float) -> asyncio.Task[None]:
        """The HEAD checking `url`'s copy: one in flight asked at or after `not_before`, else a new one. Its
        errors are the remote's (a gone object's copy is dropped first)."""
        held = self._heads.get(url)
        if held is None or held[0] < not_before:
            task = self._spawn(self._check(url))
            task.add_done_callback(lambda done: done.cancelled() or done.exception())  # waiters may be gone
            held = self._heads[url] = (self._clock(), task)
        return held[1]

    async def _check(self, url: str) -> None:
        asked = self._clock()
        try:
            asked, info = await self._head_request(url)
            self._head_s = smoothed(self._head_s, self._clock() - asked)
        except NotFound:
            self._gone(url, asked)
            raise
        finally:
            held = self._heads.get(url)
            if held is not None and held[1] is asyncio.current_task():
                del self._heads[url]
        entry = self._store.by_url.get(url)
        if entry is not None:
            self._settle(entry, info, asked)

    # -- plans ------------------------------------------------------------------------------------------
    def ended(self, job: str) -> bool:
        """Whether no plan of `job` is live and held (each is gone, or left by an exited process). Asked
        before a plan of the job is registered: registering touches the slot, which holds the plan off."""
        state = self._jobs.get(job)
        if state is None:
            return True
        live = self._prune(state)
        return all(self._planner.ending(plan_id, PLAN_ORPHAN_GRACE_S) for plan_id in live)

    def plan_registered(self, plan: Plan, *, job_ended: bool, immutable: bool = False) -> None:
        """A plan was registered (`POST /v1/plans`; `job_ended`: what `ended` said of its job just before):
        note its job, and validate the plan's resident copies in the background unless it reads an
        immutable dataset. O(1) on the loop."""
        since = self._join(plan, job_ended)
        if immutable:
            self._immutable_plans.add(plan.id)
            return
        self._immutable_plans.discard(plan.id)
        self._check_next(plan, since)
        self._spawn(self.bulk.plan(plan.urls, since))

    def _check_next(self, plan: Plan, since: float) -> None:
        """HEAD now the shard the slot opens next, if its copy needs a check: its open comes at once, and a
        HEAD answers sooner than the listing page that would cover it (a page of 1,000 objects takes
        several HEADs' time). Only for the slot's current plan (its lowest epoch): one request per reader."""
        if plan is not plan.chain.plans[0] or plan.cursor >= len(plan.urls):
            return
        entry = self._store.by_url.get(plan.urls[plan.cursor])
        if entry is not None and self._stale(entry, plan.id, since):
            self._heading(entry.url, since)

    def _join(self, plan: Plan, job_ended: bool) -> float:
        """File `plan` under its job, which begins now if it had ended, unless the plan is one it left,
        registered again; the job's since."""
        job = plan.chain.job
        state = self._jobs.get(job)
        if state is None or (job_ended and plan.id not in state.plans):
            if state is not None:
                self._immutable_plans.difference_update(state.plans)
            state = self._jobs[job] = _Job(self._clock())
            logger.info("job %s begins: its plans' cached shards are checked against the remote", job)
        state.plans.add(plan.id)
        return state.since

    def _prune(self, state: _Job) -> set[str]:
        """Forget `state`'s plans that are no longer live; the live ones."""
        live = {plan_id for plan_id in state.plans if self._planner.has_plan(plan_id)}
        self._immutable_plans.difference_update(state.plans - live)
        state.plans = live
        return live

    def forget_ended(self) -> None:
        """Forget jobs whose plans are all gone, looking at `JOBS_SWEPT` of them (housekeeping, each tick)."""
        for job in list(itertools.islice(self._jobs, JOBS_SWEPT)):
            state = self._jobs.pop(job)
            if self._prune(state):
                self._jobs[job] = state  # to the end: the next tick looks at others

    # -- results ----------------------------------------------------------------------------------------
    def _settle(self, entry: Entry, info: RemoteInfo, asked: float) -> None:
        """Confirm `entry` as of `asked` (when the request that answered `info` was sent), or drop it."""
        if info.version == entry.version:
            entry.validated_at = max(entry.validated_at, asked)
            self._metrics.validations_by["unchanged"].inc()
            return
        logger.warning("%s changed on the remote; dropping its cached copy (fetched when needed)", entry.url)
        self._learned(entry.url, asked, info)
        self._space.evict(entry.url, "stale")
        self._metrics.validations_by["changed"].inc()
        self._changed()

    def _gone(self, url: str, asked: float) -> None:
        self._learned(url, asked, None)
        if url in self._store.by_url:
            logger.warning("%s is gone from the remote; dropping its cached copy", url)
            self._space.evict(url, "stale")
            self._metrics.validations_by["missing"].inc()
            self._changed()
