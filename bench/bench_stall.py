"""Stall: time a consumer waits in `open`, as a share of epoch time, prefetch (belady, plans) against none.

The remote is moto's S3 server behind a throttling TCP proxy on loopback (one bandwidth budget shared by all
connections, so parallel downloads do not multiply it). The consumer is one slot that registers its plans
for epochs 0 and 1 like the client, opens each shard under its plan id, and spends `slowdown` times the
shard's transfer time on it, i.e. it reads slightly slower than the remote delivers. Without prefetch
(`--policy lru`, the baseline) every open waits for a whole download.

Target: waiting <= 1% of epoch time from the second shard on; the cache holds the epoch, so epoch 1 should
hit every open (client hit ratio >= 0.99).

    .venv/bin/python -m bench.bench_stall          # 12 x 1 MiB shards at 4 MiB/s, consumer 1.3x slower
    .venv/bin/python -m bench.bench_stall --shards 8 --rate-mib 8
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.bench_egress import daemon_running, uds_client, upload_shards
from harness.devservers import start_s3_server
from shardcache.daemon_access.daemon_client import DaemonClient

MIB = 1024 * 1024
_CHUNK = 16 * 1024


class ThrottlingProxy:
    """TCP proxy on 127.0.0.1 forwarding to `upstream`, downstream bytes limited to `rate` B/s in total."""

    def __init__(self, upstream: str, rate: float) -> None:
        host, port = upstream.rsplit("//", 1)[-1].split(":")
        self.upstream = (host, int(port))
        self.rate = rate
        self._lock = threading.Lock()
        self._free_at = 0.0  # when the shared link is next idle
        self._server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _wait_for_link(self, nbytes: int) -> None:
        with self._lock:
            now = time.monotonic()
            self._free_at = max(self._free_at, now) + nbytes / self.rate
            until = self._free_at
        delay = until - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # bandwidth shaping, not a readiness wait

    def _pipe(self, src: socket.socket, dst: socket.socket, throttled: bool) -> None:
        try:
            while data := src.recv(_CHUNK):
                if throttled:
                    self._wait_for_link(len(data))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._server.close()


@dataclass
class Epoch:
    seconds: float
    waits: list[float]
    hits: int

    @property
    def stall_after_first(self) -> float:
        return sum(self.waits[1:]) / self.seconds


def run(
    endpoint: str, urls: list[str], policy: str, consume_s: float, capacity: int, workdir: Path
) -> list[Epoch]:
    """Two epochs of one slot reading through the real client (`DaemonClient`, path handoff)."""
    allow = urls[0].rsplit("/", 1)[0]
    env = {"AWS_ENDPOINT_URL_S3": endpoint, "AWS_ENDPOINT_URL": endpoint}
    epochs = []
    with daemon_running(allow, capacity, policy, workdir, env) as daemon, uds_client(daemon) as http:
        client = DaemonClient(daemon.socket, required=True)
        plans = {epoch: client.register_plan("stall", 0, epoch, urls) for epoch in (0, 1)}
        for epoch in (0, 1):
            waits = []
            hits_before = http.get("/v1/stats").json()["hits"]
            started = time.perf_counter()
            for url in urls:
                before = time.perf_counter()
                with client.open(url, plan=plans[epoch]) as handle:
                    waits.append(time.perf_counter() - before)
                    while handle.read(MIB):
                        pass
                    # the consumer's remaining work on this shard (simulated), not a readiness wait
                    time.sleep(max(0.0, consume_s - (time.perf_counter() - before - waits[-1])))
            seconds = time.perf_counter() - started
            epochs.append(Epoch(seconds, waits, http.get("/v1/stats").json()["hits"] - hits_before))
        client.close()
    return epochs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", type=int, default=12)
    parser.add_argument("--shard-mib", type=float, default=1.0)
    parser.add_argument("--rate-mib", type=float, default=4.0, help="remote bandwidth, MiB/s")
    parser.add_argument("--slowdown", type=float, default=1.3, help="consumer time / shard transfer time")
    args = parser.parse_args()
    size = int(args.shard_mib * MIB)
    consume_s = args.slowdown * size / (args.rate_mib * MIB)
    server = start_s3_server()
    os.environ.update(server.env)
    proxy = ThrottlingProxy(server.endpoint, args.rate_mib * MIB)
    try:
        urls = upload_shards(server, args.shards, size)
        print(
            f"{args.shards} x {args.shard_mib:g} MiB shards, remote {args.rate_mib:g} MiB/s through a "
            f"throttling proxy, consumer {consume_s * 1000:.0f} ms per shard ({args.slowdown:g}x transfer)"
        )
        print(
            f"{'mode':<22}{'epoch0 s':>9}{'wait[0] s':>10}{'stall>1st':>11}{'max wait>1st':>14}"
            f"{'epoch1 s':>9}{'hits1':>7}"
        )
        results = {}
        with tempfile.TemporaryDirectory(prefix="stall-") as workdir:
            for policy, label in (("lru", "no prefetch (lru)"), ("belady", "prefetch (belady)")):
                first, second = run(
                    proxy.endpoint, urls, policy, consume_s, size * (args.shards + 1), Path(workdir)
                )
                results[policy] = first
                print(
                    f"{label:<22}{first.seconds:>9.2f}{first.waits[0]:>10.3f}{first.stall_after_first:>10.2%}"
                    f"{max(first.waits[1:]) * 1000:>11.1f} ms"
                    f"{second.seconds:>9.2f}{second.hits / len(urls):>7.2f}",
                    flush=True,
                )
        base, best = results["lru"], results["belady"]
        print(
            f"stall from the 2nd shard on: {best.stall_after_first:.2%} with prefetch vs "
            f"{base.stall_after_first:.2%} without; epoch time ratio {best.seconds / base.seconds:.3f}"
        )
    finally:
        proxy.close()
        server.stop()


if __name__ == "__main__":
    main()
