"""A graceful daemon restart (SIGTERM, then a new daemon on the same socket) never fails a trainer.

The remote is throttled, so downloads are in flight when the daemon stops: opens then get 503 shutting_down
or find the socket gone, wait for the daemon to come back and open again. Three restarts in one epoch, with
`daemon="required"` (no direct-read escape), in the trainer's process and through DataLoader workers (forked,
torch's default, and from the forkserver); the samples are exactly those of an uninterrupted epoch, in the
same order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from harness.daemon_api import api
from harness.polling import wait_for
from harness.start_methods import worker_context
from shardcache import Dataset, RuntimeContext
from shardcache.daemon_access.daemon_client import DaemonClient
from tests.hardening.faultproxy import proxy_env

RESTARTS = 3
SHARDS, SAMPLES = 16, 4
DEADLINE_S = 120.0


class Restarter:
    """Restarts the daemon (SIGTERM, wait for exit, start again) when the reader reaches given samples."""

    def __init__(self, start: Callable[[], Any], at: list[int]) -> None:
        self.start = start
        self.daemon = start()
        self.at = at
        self.consumed = 0
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.in_flight_at_stop: list[int] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for threshold in self.at:
                deadline = time.monotonic() + DEADLINE_S
                while self.consumed < threshold and time.monotonic() < deadline:
                    time.sleep(0.01)  # polling the reader's progress with a deadline
                with api(self.daemon) as http:
                    self.in_flight_at_stop.append(http.get("/v1/stats").json()["fetches_in_flight"])
                self.daemon.stop()  # SIGTERM; returns once the process has exited
                self.daemon = self.start()  # same socket and cache; returns once it answers
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.done.set()

    def read(self, items: Iterable[Any], key: Callable[[Any], list[str]], last: int) -> list[str]:
        """The keys of `items`; before the last `last` samples, waits until every restart has happened."""
        got: list[str] = []
        total = SHARDS * SAMPLES
        for item in items:
            got += key(item)
            self.consumed = len(got)
            if len(got) >= total - last and not self.done.is_set():
                wait_for(self.done.is_set, "the daemon restarts to finish", DEADLINE_S)
        return got


def throttled_daemon(make_bucket, fault_proxy, daemon_factory, short_tmp: Path):  # type: ignore[no-untyped-def]
    shards = make_bucket(count=SHARDS, samples=SAMPLES, payload_bytes=16 * 1024)
    proxy = fault_proxy(trickle_bytes=4096, trickle_pause_s=0.01)
    proxy.always("trickle", lambda key: key.endswith(".tar"))
    socket = short_tmp / "restart.sock"

    def start() -> Any:
        return daemon_factory(
            allow=[f"s3://{shards.bucket}"],
            socket_path=socket,
            env=proxy_env(proxy),
            extra_args=["--prefetch-depth", "2"],
        )

    return shards, str(socket), start


def uninterrupted(urls: list[str], ctx: RuntimeContext) -> list[str]:
    return [s["__key__"] for s in Dataset.from_source("tars", urls, daemon=None, context=ctx).iter_context()]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_three_graceful_restarts_in_an_epoch_yield_the_uninterrupted_samples(  # type: ignore[no-untyped-def]
    make_bucket, fault_proxy, daemon_factory, short_tmp
) -> None:
    shards, socket, start = throttled_daemon(make_bucket, fault_proxy, daemon_factory, short_tmp)
    ctx = RuntimeContext(seed=11)
    client = DaemonClient(socket, required=True, restart_wait_s=60)
    ds = Dataset.from_source("tars", shards.s3_urls, daemon=client, context=ctx)
    restarter = Restarter(start, at=[2 * SAMPLES + 1, 6 * SAMPLES + 1, 10 * SAMPLES + 1])

    got = restarter.read(ds.iter_context(), lambda sample: [sample["__key__"]], last=2 * SAMPLES)

    assert restarter.error is None, restarter.error
    assert len(restarter.in_flight_at_stop) == RESTARTS
    assert got == uninterrupted(shards.s3_urls, ctx)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_three_graceful_restarts_under_dataloader_workers_yield_the_uninterrupted_samples(  # type: ignore[no-untyped-def]
    make_bucket, fault_proxy, daemon_factory, short_tmp, start_method
) -> None:
    pytest.importorskip("torch")
    from shardcache import TorchLoader

    shards, socket, start = throttled_daemon(make_bucket, fault_proxy, daemon_factory, short_tmp)
    ctx = RuntimeContext(seed=12)
    client = DaemonClient(socket, required=True, restart_wait_s=60)
    ds = Dataset.from_source("tars", shards.s3_urls, daemon=client, context=ctx)
    loader = TorchLoader(
        ds, num_workers=2, batch_size=2, collate_fn=list, multiprocessing_context=worker_context(start_method)
    )
    restarter = Restarter(start, at=[2 * SAMPLES + 1, 6 * SAMPLES + 1, 10 * SAMPLES + 1])

    got = restarter.read(iter(loader), lambda batch: [s["__key__"] for s in batch], last=2 * SAMPLES)

    assert restarter.error is None, restarter.error
    assert len(restarter.in_flight_at_stop) == RESTARTS
    direct = TorchLoader(
        Dataset.from_source("tars", shards.s3_urls, daemon=None, context=ctx),
        num_workers=2,
        batch_size=2,
        collate_fn=list,
        # Not the session's forkserver: that server may have started before this session's S3 credentials
        # were in the environment, and these direct reads need them. Forked workers inherit them.
        multiprocessing_context="spawn" if start_method == "forkserver" else worker_context(start_method),
    )
    assert got == [s["__key__"] for batch in direct for s in batch]
