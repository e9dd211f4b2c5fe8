"""One sample's path through the client: which of its modules a first sample passes through, and how often
control moves from one module to another on the way (issue 26's measure of how much a reader must follow).

A fresh interpreter builds `Dataset.from_source("tars", ...)` → `.map(fn)` → `.shuffle(16)` → `.batch(4)`
over local tar shards, no daemon, no workers, and traces with `sys.setprofile` from `iter(dataset)` until
the first batch arrives (the build of the Dataset itself is not traced). Counted: distinct `shardcache.*`
modules entered, switches between two different client modules (calls and returns), and how many times a
source node was constructed and a context resolved.

    .venv/bin/python -m bench.bench_sample_path            # this checkout
    PYTHONPATH=/tmp/before/client .venv/bin/python -m bench.bench_sample_path   # another one
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from harness.pipelines import make_tars


def main() -> None:
    import shardcache

    with tempfile.TemporaryDirectory() as tmp:
        urls = make_tars(Path(tmp), 4, 16)
        dataset = (
            shardcache.Dataset.from_source("tars", shards=urls, daemon=None)
            .map(lambda sample: sample)
            .shuffle(16)
            .batch(4)
        )
        entered: Counter[str] = Counter()
        calls: Counter[str] = Counter()
        switches = 0
        last: str | None = None

        def profile(frame: FrameType, event: str, arg: Any) -> None:
            nonlocal switches, last
            if event not in ("call", "return"):
                return
            module = frame.f_globals.get("__name__", "")
            if not module.startswith("shardcache"):
                return
            if event == "call":
                entered[module] += 1
                calls[frame.f_code.co_qualname] += 1
            if last is not None and module != last:
                switches += 1
            last = module

        sys.setprofile(profile)
        iterator = iter(dataset)
        next(iterator)
        sys.setprofile(None)
        print(f"client modules entered before the first batch: {len(entered)}")
        print(f"module switches before the first batch: {switches}")
        for name in sorted(calls):
            if name.endswith("Node.__init__") and "Source" in name or name.endswith("resolve_context"):
                print(f"  {name}: {calls[name]}")
        print("  modules:", " ".join(sorted(m.removeprefix("shardcache.") for m in entered)))


if __name__ == "__main__":
    main()
