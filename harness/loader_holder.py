"""A trainer whose DataLoader workers hold shards open, run as its own process for the lease tests.

    python harness/loader_holder.py SOCKET READY_FILE URL... [--workers N]

The trainer opens the first URL through `DaemonClient` and keeps it open, then iterates a torch DataLoader
with N real worker processes (2 by default; torch's default start method, fork on Linux) over a dataset
whose workers each open their share of the other URLs through the same client (each worker gets its own
connection and session) and keep them open: a trainer killed in the middle of a step. Once it has an
item from every worker it writes READY_FILE, one line per process: `pid host` as each process sees
itself (the trainer first), and blocks until killed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from shardcache.daemon_access.daemon_client import DaemonClient


def whoami() -> str:
    return f"{os.getpid()} {socket.gethostname()}"


class HeldShards(IterableDataset[str]):
    """Each worker opens its share of `urls`, yields who it is, and then blocks holding them."""

    def __init__(self, client: DaemonClient, urls: list[str]) -> None:
        self.client = client
        self.urls = urls

    def __iter__(self) -> Iterator[str]:
        info = get_worker_info()
        assert info is not None, "iterated by DataLoader workers only"
        with contextlib.ExitStack() as stack:
            for url in self.urls[info.id :: info.num_workers]:
                stack.enter_context(self.client.open(url)).read(1)
            yield whoami()
            while True:
                time.sleep(60)  # a step that never ends: the worker dies holding its shards


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("socket")
    parser.add_argument("ready")
    parser.add_argument("urls", nargs="+")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    client = DaemonClient(args.socket, required=True)
    with client.open(args.urls[0]) as held:
        held.read(1)
        loader = DataLoader(HeldShards(client, args.urls[1:]), batch_size=None, num_workers=args.workers)
        batches = iter(loader)
        members = [whoami(), *(next(batches) for _ in range(args.workers))]
        written = Path(args.ready + ".tmp")
        written.write_text("".join(f"{member}\n" for member in members))
        written.replace(args.ready)  # whole when it appears
        while True:
            time.sleep(60)


if __name__ == "__main__":
    main()
