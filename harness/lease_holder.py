"""A trainer that holds shards open and then blocks, run as its own process for the lease-owner tests.

    python lease_holder.py SOCKET READY_FILE URL... [--plan JOB] [--fork-half] [--without-session]

Opens every URL through `DaemonClient` and keeps each file open (as a trainer that was OOM-killed
mid-read, or a user loop that never closes what it opens). With `--plan JOB` it first registers a plan of
the URLs for job JOB and opens under it. With `--fork-half` a forked child opens the second half of the
URLs (a DataLoader worker in the same process group). With `--without-session` it speaks the HTTP API
as a client from before sessions did (no `session` in its requests: the daemon knows it by its pid
only). Writes READY_FILE (the pids, one a line) once every process holds its shards, then sleeps until
killed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path

import httpx

from shardcache.daemon_access.daemon_client import DaemonClient


def hold(socket: str, urls: list[str], job: str | None, stack: contextlib.ExitStack) -> None:
    client = DaemonClient(socket)
    plan = client.register_plan(job, 0, 0, urls) if job else None
    for url in urls:
        handle = stack.enter_context(client.open(url, plan=plan))
        handle.read(1)  # opened and reading: the shard is in use


def hold_without_session(socket: str, urls: list[str], job: str | None, stack: contextlib.ExitStack) -> None:
    http = stack.enter_context(
        httpx.Client(transport=httpx.HTTPTransport(uds=socket), base_url="http://shardcached")
    )
    plan = None
    if job:
        plan = http.post("/v1/plans", json={"job": job, "slot": 0, "epoch": 0, "urls": urls}).json()["plan"]
    for url in urls:
        http.post("/v1/shards/open", json={"url": url, "plan": plan}).raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("socket")
    parser.add_argument("ready")
    parser.add_argument("urls", nargs="+")
    parser.add_argument("--plan", default=None)
    parser.add_argument("--fork-half", action="store_true")
    parser.add_argument("--without-session", action="store_true")
    args = parser.parse_args()
    holding = hold_without_session if args.without_session else hold
    stack = contextlib.ExitStack()  # never closed: the process dies holding everything
    urls: list[str] = args.urls
    pids = [os.getpid()]
    if args.fork_half:
        half = len(urls) // 2
        child_ready = Path(args.ready + ".child")
        child = os.fork()
        if child == 0:
            holding(args.socket, urls[half:], args.plan, stack)
            child_ready.write_text("ok")
            while True:
                time.sleep(60)
        urls = urls[:half]
        pids.append(child)
        while not child_ready.exists():
            time.sleep(0.01)
    holding(args.socket, urls, args.plan, stack)
    Path(args.ready).write_text("".join(f"{pid}\n" for pid in pids))
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
