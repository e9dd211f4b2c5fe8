"""One trainer process for the cache tests: iterate a cached tar pipeline as one (dp, tp) rank.

    python -m tests.client.workers.cache_worker SHARDS CACHE_DIR DP_RANK DP_SIZE TP_RANK TP_SIZE OUT [MAP,...]

Run from the repository root. Writes the keys it received to OUT (JSON). The maps are names of functions
in `tests.client.snapshots.cache_helpers`, imported under the same module name as in the test process, so
their fingerprints match.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from shardcache import DataLoadMesh, Dataset, RuntimeContext
from tests.client.snapshots import cache_helpers


def main(argv: list[str]) -> int:
    shards, cache_dir, dp_rank, dp_size, tp_rank, tp_size, out = argv[:7]
    maps = argv[7].split(",") if len(argv) > 7 and argv[7] else []
    mesh = DataLoadMesh(
        cache_helpers.FakeDeviceMesh(int(dp_rank), int(dp_size), int(tp_rank), int(tp_size)), ("dp",)
    )
    rank = int(dp_rank) * int(tp_size) + int(tp_rank)
    ctx = RuntimeContext(rank=rank, world_size=int(dp_size) * int(tp_size), mesh=mesh)
    dataset = Dataset.from_source("tars", shards, daemon=None)
    for name in maps:
        dataset = dataset.map(getattr(cache_helpers, name))
    dataset = dataset.cache(cache_dir=cache_dir, cache_write_batch_size=2, max_rows_per_fragment=3)
    keys = [sample["__key__"] for sample in dataset.iter_context(ctx)]
    Path(out).write_text(json.dumps(keys))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
