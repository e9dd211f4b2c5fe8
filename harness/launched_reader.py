"""One rank of a job started by a launcher on simulated nodes (`harness.launches`): a plain training loop's
reads, for a few epochs, through its node's daemon.

It reads the shards of a manifest with `Dataset.from_source("tars", manifest, daemon="required")` (the
socket from SHARDCACHE_SOCKET: every byte it reads is counted by its node's daemon), as a user writes it:
the context comes from the launcher. It writes `<out>/rank<r>.json`: the node layout its context resolved
and the sample keys it read in each epoch.

--group: a gloo process group first, as a DDP script does (env:// where the launcher sets RANK and
WORLD_SIZE, as torchrun does; from SLURM_PROCID and SLURM_NTASKS with MASTER_ADDR/MASTER_PORT under srun,
which sets neither), epochs in lockstep (a barrier opens each). A rank that hangs dumps every thread's
stack and exits after --hang-after seconds.

    SHARDCACHE_SOCKET=/run/shardcache/shardcache.sock python harness/launched_reader.py \
        --manifest shards.manifest.jsonl --out out/ --epochs 3 --group
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
from pathlib import Path

from shardcache import Dataset


def init_group(timeout_s: float) -> None:
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    if "RANK" in os.environ:
        dist.init_process_group("gloo", timeout=timeout)
        return
    address = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    rank, world_size = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world_size, timeout=timeout)


def barrier(group: bool, *, last: bool = False) -> None:
    if group:
        import torch.distributed as dist

        dist.barrier()
        if last:
            dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--group", action="store_true", help="a gloo process group, epochs in lockstep")
    parser.add_argument("--placement", default="auto")
    parser.add_argument("--hang-after", type=float, default=100.0)
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.hang_after, exit=True)
    if args.group:
        init_group(args.hang_after)
    ds = Dataset.from_source("tars", args.manifest, daemon="required", placement=args.placement)
    ctx = ds.context
    layout = [ctx.rank, ctx.world_size, ctx.local_rank, ctx.local_world_size, ctx.node_rank, ctx.num_nodes]
    epochs = []
    for _ in range(args.epochs):
        barrier(args.group)
        epochs.append([sample["__key__"] for sample in ds])
    barrier(args.group, last=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{ctx.rank}.json").write_text(json.dumps({"layout": layout, "epochs": epochs}))
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
