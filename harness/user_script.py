"""The first training script a user writes, run by the tests in a fresh interpreter (`test_user_path`).

Tar shards, the daemon (or none), `TorchLoader(ds, num_workers=2, batch_size=8)` with pin_memory, several
epochs, the start method and persistent_workers as given (default: what torch and TorchLoader choose).
It prints one JSON line per epoch: the samples' keys digest, how many there were and how many distinct,
and the worker processes that produced them. `--pause-at EPOCH` stops after the first batch of that epoch
until the file `--resume-file` exists, so a test can restart the daemon in the middle of an epoch.
`--record-imports DIR`: each worker writes to DIR the modules it imported after it was forked (the
fork-safety rule that no worker imports lazily: `shardcache.forksafe`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import shardcache

_AT_FORK: set[str] = set()
_RECORD_DIR: list[str] = []


def _remember_modules_at_fork() -> None:
    _AT_FORK.update(sys.modules)


def tag_worker(sample: dict[str, Any]) -> dict[str, Any]:
    sample["pid"] = os.getpid()
    if _RECORD_DIR and _AT_FORK:
        imported = sorted(set(sys.modules) - _AT_FORK)
        Path(_RECORD_DIR[0], f"{os.getpid()}.json").write_text(json.dumps(imported))
    return sample


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", required=True)
    parser.add_argument("--socket", default=None, help="the daemon's socket; omitted: daemon=None")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument(
        "--start-method", default="default", choices=["default", "fork", "forkserver", "spawn"]
    )
    parser.add_argument("--persistent", default="default", choices=["default", "true", "false"])
    parser.add_argument("--pause-at", type=int, default=None)
    parser.add_argument("--resume-file", default=None)
    parser.add_argument("--record-imports", default=None)
    args = parser.parse_args()
    if args.record_imports:
        _RECORD_DIR.append(args.record_imports)
        os.register_at_fork(after_in_child=_remember_modules_at_fork)

    ds = shardcache.Dataset.from_source("tars", shards=args.shards, daemon=args.socket).map(tag_worker)
    kwargs: dict[str, Any] = {"pin_memory": True}
    if args.start_method != "default":
        kwargs["multiprocessing_context"] = args.start_method
    if args.persistent != "default":
        kwargs["persistent_workers"] = args.persistent == "true"
    loader = shardcache.TorchLoader(ds, num_workers=2, batch_size=8, **kwargs)
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        keys: list[str] = []
        pids: set[int] = set()
        for batch in loader:
            keys.extend(batch["__key__"])
            pids.update(int(p) for p in batch["pid"])
            if epoch == args.pause_at and len(keys) == len(batch["__key__"]):
                print(json.dumps({"paused": epoch}), flush=True)
                while not Path(str(args.resume_file)).exists():
                    time.sleep(0.05)  # the test restarts the daemon meanwhile
        digest = hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]
        line = {"epoch": epoch, "samples": len(keys), "distinct": len(set(keys)), "digest": digest}
        print(json.dumps({**line, "worker_pids": sorted(pids)}), flush=True)
    loader.close()


if __name__ == "__main__":
    main()
