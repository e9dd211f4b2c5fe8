"""One training rank for the daemon-loss test, run as its own process: a DataLoader with two workers over
the tars pipeline, writing `key sha1` per sample to --out. At each --pause-at count it writes
`<out>.paused<N>` and waits for `<out>.go<N>` (the test kills or restarts the daemon meanwhile)."""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import torch.utils.data

from shardcache import Dataset, RuntimeContext
from shardcache.daemon_access.daemon_client import DaemonClient


def wait_for_file(path: Path, deadline_s: float = 120.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {deadline_s:.0f}s")
        time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--urls", required=True, help="JSON file with the shard URLs")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--socket", help="the daemon's socket; none: read directly")
    parser.add_argument("--out", required=True)
    parser.add_argument("--pause-at", type=int, action="append", default=[])
    args = parser.parse_args()

    urls = json.loads(Path(args.urls).read_text())
    daemon = DaemonClient(args.socket, reprobe_interval=0.2) if args.socket else None
    context = RuntimeContext(rank=args.rank, world_size=args.world_size, seed=11)
    dataset = Dataset.from_source("tars", urls, context=context, daemon=daemon)
    assert isinstance(dataset, torch.utils.data.IterableDataset)  # a Dataset is one once torch is installed
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    out = Path(args.out)
    with out.open("w") as sink:
        for count, sample in enumerate(loader, start=1):
            sink.write(f"{sample['__key__']} {hashlib.sha1(sample['bin']).hexdigest()}\n")
            sink.flush()
            if count in args.pause_at:
                index = args.pause_at.index(count)
                Path(f"{out}.paused{index}").touch()
                wait_for_file(Path(f"{out}.go{index}"))


if __name__ == "__main__":
    main()
