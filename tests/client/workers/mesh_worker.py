"""One rank of a real gloo `DeviceMesh` reading tar shards, launched by torchrun from test_device_mesh.py.

Each rank builds `init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))`, a context with
`DataLoadMesh(mesh, ("dp",))`, and reads the dataset twice: in this process, and through
`TorchLoader(ds, num_workers=2)` with torch's default start method. It writes `<out>/rank<r>.json` with its
dp rank, dp size, leader flag and the keys of both reads.

A rank that hangs dumps every thread's stack to stderr and exits after `--hang-after` seconds (faulthandler),
so the launch fails with the stacks in its output instead of waiting for the test's watchdog.

    python -m torch.distributed.run --standalone --nproc-per-node 4 tests/client/workers/mesh_worker.py \
        --shards 'data/shard_{000000..000007}.tar' --out out/ --shape 2,2
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
from pathlib import Path

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from shardcache import DataLoadMesh, Dataset, RuntimeContext, TorchLoader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", default="2,2", help="dp,tp")
    parser.add_argument("--hang-after", type=float, default=60.0)
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.hang_after, exit=True)

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.hang_after))
    dp, tp = (int(n) for n in args.shape.split(","))
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    data_mesh = DataLoadMesh(mesh, ("dp",))
    context = RuntimeContext.from_runtime(mesh=data_mesh)
    ds = Dataset.from_source("tars", args.shards, daemon=None, context=context)
    report = {
        "rank": dist.get_rank(),
        "dp_rank": data_mesh.dp_rank,
        "dp_size": data_mesh.dp_size,
        "leader": data_mesh.is_dp_leader,
        "keys": [sample["__key__"] for sample in ds],
        "loader_keys": [sample["__key__"] for sample in TorchLoader(ds, num_workers=2)],
    }
    (args.out / f"rank{report['rank']}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
