"""One process of the load test: `--threads` client threads, each one slot of `--slots`, reading its shards
through one shared DaemonClient for `--epochs` epochs with plans registered (current and next epoch) as the
pipeline does. Writes per-open latencies and errors as JSON to --out. Starts when `<out>.go` appears."""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from pathlib import Path

from shardcache.daemon_access.daemon_client import DaemonClient


def order(urls: list[str], slots: int, slot: int, epoch: int) -> list[str]:
    mine = urls[slot::slots]
    random.Random(f"{slot}:{epoch}").shuffle(mine)
    return mine


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--urls", required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--process", type=int, required=True)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    urls = json.loads(Path(args.urls).read_text())
    client = DaemonClient(args.socket, required=True, timeout=120)
    latencies: list[float] = []
    errors: list[str] = []
    read_bytes = [0]
    lock = threading.Lock()

    def run(slot: int) -> None:
        try:
            plans: dict[int, str | None] = {}
            for epoch in range(args.epochs):
                # The current and the next epoch, as the pipeline announces them, but no epoch past the last:
                # the fetch bound the test checks is one download per shard and epoch read.
                for e in (epoch, epoch + 1):
                    if e not in plans and e < args.epochs:
                        plans[e] = client.register_plan("load", slot, e, order(urls, args.slots, slot, e))
                for url in order(urls, args.slots, slot, epoch):
                    started = time.perf_counter()
                    with client.open(url, plan=plans[epoch]) as f:
                        waited = time.perf_counter() - started
                        size = len(f.read())
                    with lock:
                        latencies.append(waited)
                        read_bytes[0] += size
        except Exception as exc:  # reported to the test, which fails on any
            with lock:
                errors.append(f"slot {slot}: {type(exc).__name__}: {exc}")

    go = Path(f"{args.out}.go")
    Path(f"{args.out}.ready").touch()
    deadline = time.monotonic() + 120
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.perf_counter()
    first = args.process * args.threads
    threads = [threading.Thread(target=run, args=(first + t,)) for t in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    result = {"latencies": latencies, "errors": errors, "elapsed": elapsed, "bytes": read_bytes[0]}
    Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
