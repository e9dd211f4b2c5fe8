"""The tars pipeline against WebDataset and Python's tarfile on the same shards, in one run.

Shards: N shards x M samples, each sample a 4 KB `.bin` and a small `.json` (issue 3's benchmark). Each
contender reads every sample and applies the same trivial map; rounds are interleaved and the best of the
repeats is kept (the machine is shared and noisy). Ratios are ours / baseline.

Single process: `Dataset.from_source("tars", ...).map(f)` (no daemon, and through a real daemon on a local
allow prefix with `--daemon`), `webdataset.WebDataset(...).map(f)`, and a `tarfile` loop grouping members.
TorchLoader with 2 workers: ours with worker micro-batches + loader-side `unbatch()`, against WebDataset in
a DataLoader with the same batching.

    .venv/bin/python -m bench.bench_pipeline                       # 16 shards x 1000 samples
    .venv/bin/python -m bench.bench_pipeline --shards 4 --samples 200 --repeats 1 --no-loader   # quick
    .venv/bin/python -m bench.bench_pipeline --compressed --no-loader  # .tar.gz/.tar.zst against .tar
    .venv/bin/python -m bench.bench_pipeline --balance --no-loader     # even="drop" against no balancing
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def make_shards(root: Path, shards: int, samples: int, payload: int) -> list[str]:
    paths = []
    body = os.urandom(payload)
    for s in range(shards):
        path = root / f"shard_{s:06d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(samples):
                key = f"{s:04d}_{i:06d}"
                meta = json.dumps({"shard": s, "index": i, "label": i % 10}).encode()
                for field, data in (("bin", body), ("json", meta)):
                    info = tarfile.TarInfo(f"{key}.{field}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    return paths


def touch(sample: dict[str, Any]) -> dict[str, Any]:
    sample["n"] = len(sample["bin"])
    return sample


def identity(batch: list[Any]) -> list[Any]:
    return batch


def run_ours(paths: list[str], daemon: Any = None) -> Iterable[Any]:
    from shardcache import Dataset

    return Dataset.from_source("tars", paths, daemon=daemon).map(touch)


def run_wds(paths: list[str]) -> Iterable[Any]:
    import webdataset as wds

    pipeline: Iterable[Any] = wds.WebDataset(paths, shardshuffle=False, empty_check=False).map(touch)
    return pipeline


def run_tarfile(paths: list[str]) -> Iterable[Any]:
    for path in paths:
        sample: dict[str, Any] | None = None
        with tarfile.open(path, "r") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                key, _, field = member.name.partition(".")
                f = tar.extractfile(member)
                assert f is not None
                if sample is None or sample["__key__"] != key:
                    if sample is not None:
                        yield touch(sample)
                    sample = {"__key__": key}
                sample[field] = f.read()
        if sample is not None:
            yield touch(sample)


def compressed_contenders(root: Path, paths: list[str]) -> dict[str, Callable[[], Iterable[Any]]]:
    """The same shards compressed as other tools write them, read by us and by WebDataset: what the
    compressed path costs against the plain tar, in the same run. gzip at tar's default level (`tar czf`);
    `.tar.zst` too when zstandard is installed (the `zstd` extra)."""
    import gzip

    folder = root / "compressed"
    folder.mkdir()
    gz = []
    for path in paths:
        out = folder / (Path(path).name + ".gz")
        with open(path, "rb") as src, gzip.open(out, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        gz.append(str(out))
    contenders: dict[str, Callable[[], Iterable[Any]]] = {
        "shardcache .tar.gz": lambda: run_ours(gz),
        "webdataset .tar.gz": lambda: run_wds(gz),
    }
    try:
        import zstandard
    except ImportError:
        return contenders
    zst = []
    for path in paths:
        out = folder / (Path(path).name + ".zst")
        out.write_bytes(zstandard.ZstdCompressor().compress(Path(path).read_bytes()))
        zst.append(str(out))
    contenders["shardcache .tar.zst"] = lambda: run_ours(zst)
    return contenders


def print_compressed(best: dict[str, float]) -> None:
    for name in ("shardcache .tar.gz", "shardcache .tar.zst"):
        if name in best:
            print(f"  ratio {name} / shardcache .tar   {best[name] / best['shardcache']:.2f}x")
    ours, theirs = best["shardcache .tar.gz"], best["webdataset .tar.gz"]
    print(f"  ratio shardcache .tar.gz / webdataset .tar.gz {ours / theirs:.2f}x")


def stepped_over(counts: list[int], ranks: int) -> int:
    """Samples the `even="drop"` readers step over to reach the pieces that start mid-shard (epoch 0)."""
    from shardcache.sources.deal.partition import Layout, Partitioning, Piece, plan_epoch

    universe = [Piece(u, 0, n) for u, n in enumerate(counts)]
    weights = tuple(float(n) for n in counts)
    plan = plan_epoch(universe, weights, Layout(1, ranks, 1), Partitioning("global", "drop"), 0, 0)
    return sum(piece.start for slot in plan for piece in slot)


def compare_balance(root: Path, paths: list[str], samples: int, ranks: list[int], repeats: int) -> None:
    """Equal work per rank against the unbalanced pipeline, in the same run: every rank of an R-way job
    read in turn (explicit RuntimeContexts, one process), with `even="drop"` and with `even=None`.

    Both read the same manifest, written here with `num_samples` (outside the timed part, as a job would
    ship it), so the balanced run has no counting pass: what is timed is the sample-level plan and the
    reads that start in the middle of the shards it cuts (a reader parses the headers of the samples
    before its piece to find it). Rounds alternate; the best of `repeats` is kept, by wall clock and by
    this process's CPU time (steadier on a shared machine: the reads are single-threaded).
    """
    from shardcache import Dataset, RuntimeContext
    from shardcache.sources.manifests import write_manifest

    manifest = str(root / "shards.manifest.jsonl")
    write_manifest(paths, manifest)
    total = samples * len(paths)
    modes: tuple[str | None, ...] = (None, "drop")
    pipelines = {e: Dataset.from_source("tars", manifest, daemon=None, even=e).map(touch) for e in modes}
    print(f"balancing: R ranks read in turn, counts from a manifest, best of {repeats} (target >= 0.97x)")
    for r in ranks:
        contexts = [RuntimeContext(rank=rank, world_size=r) for rank in range(r)]
        expected = {None: total, "drop": total - total % r}
        best = {even: [0.0, 0.0] for even in pipelines}  # samples/s by wall clock, by CPU time
        for _ in range(repeats + 1):  # the first round warms the page cache
            for even, ds in pipelines.items():
                wall, cpu = time.perf_counter(), time.process_time()
                count = sum(1 for ctx in contexts for _ in ds.iter_context(ctx))
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                if count != expected[even]:
                    raise SystemExit(f"even={even}: read {count} samples, expected {expected[even]}")
                best[even] = [max(best[even][0], count / wall), max(best[even][1], count / cpu)]
        (none_wall, none_cpu), (drop_wall, drop_cpu) = best[None], best["drop"]
        skipped = stepped_over([samples] * len(paths), r)
        print(
            f"  R={r}: even=None {none_wall:>9,.0f}/s wall {none_cpu:>9,.0f}/s CPU; even=drop "
            f"{drop_wall:>9,.0f}/s wall {drop_cpu:>9,.0f}/s CPU; ratio {drop_wall / none_wall:.3f}x wall "
            f"{drop_cpu / none_cpu:.3f}x CPU; stepped over {skipped} samples ({skipped / total:.1%})"
        )


def loader_ours(paths: list[str], workers: int, batch: int) -> Iterable[Any]:
    from shardcache import Dataset, TorchLoader

    ds = Dataset.from_source("tars", paths, daemon=None).map(touch)
    return TorchLoader(ds, num_workers=workers, batch_size=batch, collate_fn=identity).unbatch()


def loader_wds(paths: list[str], workers: int, batch: int) -> Iterable[Any]:
    import torch.utils.data as data
    import webdataset as wds

    ds = wds.WebDataset(paths, shardshuffle=False, empty_check=False, nodesplitter=None).map(touch)
    loader = data.DataLoader(ds, num_workers=workers, batch_size=batch, collate_fn=identity)
    return (s for b in loader for s in b)


def rate(make: Callable[[], Iterable[Any]], expected: int) -> float:
    start = time.perf_counter()
    count = sum(1 for _ in make())
    elapsed = time.perf_counter() - start
    if count != expected:
        raise SystemExit(f"read {count} samples, expected {expected}")
    return count / elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--payload", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--no-loader", action="store_true", help="skip the TorchLoader comparison")
    parser.add_argument("--daemon", action="store_true", help="also read through a real daemon (local allow)")
    parser.add_argument("--compressed", action="store_true", help="also read .tar.gz (and .tar.zst) copies")
    parser.add_argument("--balance", action="store_true", help="also read with even='drop' against even=None")
    parser.add_argument("--balance-ranks", default="2,3,4,6", help="rank counts for --balance")
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    daemon = None
    try:
        paths = make_shards(root, args.shards, args.samples, args.payload)
        total = args.shards * args.samples
        contenders: dict[str, Callable[[], Iterable[Any]]] = {
            "shardcache": lambda: run_ours(paths),
            "webdataset": lambda: run_wds(paths),
            "tarfile": lambda: run_tarfile(paths),
        }
        if args.compressed:
            contenders.update(compressed_contenders(root, paths))
        if args.daemon:
            from harness.devservers import start_daemon
            from shardcache.daemon_access.daemon_client import DaemonClient

            daemon = start_daemon(root / "d.sock", root / "cache", [str(root)], capacity="4GiB")
            client = DaemonClient(str(daemon.socket), required=True)
            contenders["shardcache+daemon"] = lambda: run_ours(paths, client)
        if not args.no_loader:
            contenders[f"shardcache TorchLoader({args.workers})"] = lambda: loader_ours(
                paths, args.workers, args.batch
            )
            contenders[f"webdataset DataLoader({args.workers})"] = lambda: loader_wds(
                paths, args.workers, args.batch
            )
        for make in contenders.values():  # warm the page cache and imports
            rate(make, total)
        best = {name: 0.0 for name in contenders}
        for _ in range(args.repeats):
            for name, make in contenders.items():
                best[name] = max(best[name], rate(make, total))
        print(
            f"{args.shards} shards x {args.samples} samples ({args.payload} B + json), best of {args.repeats}"
        )
        for name, value in best.items():
            print(f"  {name:32s} {value:>10,.0f} samples/s")
        ours, wds = best["shardcache"], best["webdataset"]
        print(f"  ratio shardcache / webdataset      {ours / wds:.2f}x  (target >= 4x)")
        print(f"  ratio shardcache / tarfile         {best['shardcache'] / best['tarfile']:.2f}x")
        print(f"  ratio tarfile / webdataset         {best['tarfile'] / best['webdataset']:.2f}x")
        if args.daemon:
            print(f"  ratio shardcache+daemon / webdataset {best['shardcache+daemon'] / wds:.2f}x")
        if args.compressed:
            print_compressed(best)
        if args.balance:
            ranks = [int(r) for r in args.balance_ranks.split(",")]
            compare_balance(root, paths, args.samples, ranks, args.repeats)
        if not args.no_loader:
            ours = best[f"shardcache TorchLoader({args.workers})"]
            theirs = best[f"webdataset DataLoader({args.workers})"]
            print(
                f"  ratio TorchLoader / webdataset DataLoader ({args.workers} workers) {ours / theirs:.2f}x"
            )
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
