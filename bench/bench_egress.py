"""Egress: remote fetches of the real daemon (Belady over plans, and --policy lru) against offline MIN.

Shards live in a moto S3 server; the daemon runs on a Unix socket; a driver opens shards over HTTP the way the
client does: when a slot starts epoch e it registers its plans for e and e + 1 and deletes e - 1, then opens
each shard with its plan id, "reads" it for a fixed time and releases the lease. Slots take turns (one open
per step), so the recorded trace is the global order the offline simulators replay.

Scenarios (equal-sized shards, so fetches = bytes fetched / shard size):
  A: one node reads the whole dataset with 4 slots, cache = 3/4 of the data, 3 reshuffled epochs.
  B: the node holds 4 of 16 global slots (a different random quarter each epoch), cache = one epoch's share,
     4 epochs.
Target: Belady <= 1.05x the MIN of what the plans tell (current and next epoch); full-knowledge MIN and LRU
are printed beside it.

    .venv/bin/python -m bench.bench_egress                    # 64 x 256 KiB shards, seeds 0..2
    .venv/bin/python -m bench.bench_egress --seeds 1 --shards 32
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import boto3
import httpx

from harness.belady_sim import Access, lru_fetches, min_fetches
from harness.devservers import Daemon, S3Server, start_daemon, start_s3_server

KIB = 1024


@dataclass
class Scenario:
    """What each local slot reads per epoch: orders[epoch][slot] -> urls."""

    name: str
    orders: list[list[list[str]]]
    capacity_shards: int


def scenario_a(urls: list[str], seed: int, slots: int = 4, epochs: int = 3) -> Scenario:
    rng = random.Random(seed)
    orders = []
    for _ in range(epochs):
        perm = rng.sample(urls, len(urls))
        orders.append([perm[s::slots] for s in range(slots)])
    return Scenario("A: 4 slots, whole dataset, cache 3/4, 3 epochs", orders, len(urls) * 3 // 4)


def scenario_b(urls: list[str], seed: int, local: int = 4, total: int = 16, epochs: int = 4) -> Scenario:
    rng = random.Random(seed)
    orders = []
    for _ in range(epochs):
        perm = rng.sample(urls, len(urls))
        mine = rng.sample(range(total), local)  # the global slots this node runs this epoch
        orders.append([perm[g::total] for g in mine])
    share = sum(len(slot) for slot in orders[0])
    return Scenario("B: 4 of 16 slots, new quarter each epoch, cache = epoch share, 4 epochs", orders, share)


def trace_of(scenario: Scenario) -> list[Access]:
    """Round-robin over the slots within each epoch: the order the driver opens in."""
    trace = []
    for epoch, per_slot in enumerate(scenario.orders):
        for i in range(max(len(urls) for urls in per_slot)):
            for slot, urls in enumerate(per_slot):
                if i < len(urls):
                    trace.append(Access(slot, epoch, urls[i]))
    return trace


def upload_shards(server: S3Server, count: int, size: int) -> list[str]:
    s3 = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
    bucket = f"bench-{os.getpid()}"
    s3.create_bucket(Bucket=bucket)
    for i in range(count):
        s3.put_object(Bucket=bucket, Key=f"shards/{i:06d}.tar", Body=os.urandom(size))
    return [f"s3://{bucket}/shards/{i:06d}.tar" for i in range(count)]


@contextmanager
def daemon_running(
    allow: str, capacity: int, policy: str, workdir: Path, env: dict[str, str]
) -> Iterator[Daemon]:
    run = Path(tempfile.mkdtemp(prefix="scb-", dir="/tmp"))  # short: Unix socket paths are limited
    daemon = start_daemon(
        run / "d.sock",
        workdir / f"cache-{policy}-{time.monotonic_ns()}",
        [allow],
        capacity=f"{capacity}B",
        extra_args=[
            "--policy",
            policy,
            "--prefetch-depth",
            "2",
            "--max-fetches",
            "4",
            "--log-level",
            "WARNING",
        ],
        env=env,
    )
    try:
        yield daemon
    finally:
        daemon.stop()
        shutil.rmtree(run, ignore_errors=True)


def uds_client(daemon: Daemon) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=daemon.socket), base_url="http://d", timeout=120)


def drive(http: httpx.Client, scenario: Scenario, step_s: float, job: str = "bench") -> None:
    """Open every shard of the trace like the client: plans per slot and epoch, opens under the plan id."""
    plans: dict[tuple[int, int], str] = {}

    def register(slot: int, epoch: int) -> None:
        if epoch < len(scenario.orders) and (slot, epoch) not in plans:
            body = {"job": job, "slot": slot, "epoch": epoch, "urls": scenario.orders[epoch][slot]}
            plans[(slot, epoch)] = http.post("/v1/plans", json=body).raise_for_status().json()["plan"]

    started: set[tuple[int, int]] = set()
    for access in trace_of(scenario):
        slot, epoch = int(access.slot), access.epoch  # type: ignore[call-overload]
        if (slot, epoch) not in started:
            started.add((slot, epoch))
            register(slot, epoch)
            register(slot, epoch + 1)
            old = plans.pop((slot, epoch - 1), None)
            if old is not None:
                http.delete(f"/v1/plans/{old}")
        body = {"url": access.url, "plan": plans[(slot, epoch)]}
        lease = http.post("/v1/shards/open", json=body).raise_for_status().json()["lease"]
        time.sleep(step_s)  # the consumer's compute on this shard (simulated), not a readiness wait
        http.post("/v1/shards/release", json={"lease": lease}).raise_for_status()


def measure(
    server: S3Server, urls: list[str], scenario: Scenario, policy: str, size: int, step_s: float
) -> int:
    """Remote fetches the daemon made for the scenario under `policy`."""
    allow = urls[0].rsplit("/", 1)[0]
    capacity = scenario.capacity_shards * size + size // 2  # room for k shards, not k + 1
    with tempfile.TemporaryDirectory(prefix="egress-") as workdir:
        with (
            daemon_running(allow, capacity, policy, Path(workdir), server.env) as daemon,
            uds_client(daemon) as http,
        ):
            drive(http, scenario, step_s)
            fetched = int(http.get("/v1/stats").json()["bytes_fetched"])
    if fetched % size:
        raise RuntimeError(f"fetched {fetched} bytes, not a whole number of {size}-byte shards")
    return fetched // size


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--shard-kib", type=int, default=256)
    parser.add_argument("--seeds", type=int, default=3, help="runs per scenario with seeds 0..N-1")
    parser.add_argument("--step-ms", type=float, default=15.0, help="simulated compute per shard")
    args = parser.parse_args()
    size = args.shard_kib * KIB
    server = start_s3_server()
    os.environ.update(server.env)  # boto3 here and the daemon's s3fs read the endpoint and credentials
    try:
        urls = upload_shards(server, args.shards, size)
        print(
            f"{'scenario':<9}{'seed':>5}{'opens':>7}{'belady':>8}{'lru':>6}{'lru(sim)':>9}{'MIN(plans)':>12}"
            f"{'MIN(full)':>11}{'belady/MINp':>13}{'belady/MINf':>13}{'lru/MINp':>10}"
        )
        for make in (scenario_a, scenario_b):
            for seed in range(args.seeds):
                scenario = make(urls, seed)
                trace = trace_of(scenario)
                cap = scenario.capacity_shards
                plans_min = min_fetches(trace, cap, lookahead_epochs=1)
                full_min = min_fetches(trace, cap)
                lru_sim = lru_fetches(trace, cap)
                belady = measure(server, urls, scenario, "belady", size, args.step_ms / 1000)
                lru = measure(server, urls, scenario, "lru", size, args.step_ms / 1000)
                print(
                    f"{scenario.name[:1]:<9}{seed:>5}{len(trace):>7}{belady:>8}{lru:>6}{lru_sim:>9}{plans_min:>12}{full_min:>11}"
                    f"{belady / plans_min:>13.3f}{belady / full_min:>13.3f}{lru / plans_min:>10.3f}",
                    flush=True,
                )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
