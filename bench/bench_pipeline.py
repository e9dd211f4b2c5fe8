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

    return wds.WebDataset(paths, shardshuffle=False, empty_check=False).map(touch)


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
            from shardcache.daemon_client import DaemonClient
            from tests.support.devservers import start_daemon

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
