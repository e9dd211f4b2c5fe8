"""One rank of a gloo process group that learns its node layout from its ranks' hosts (test_hosts.py).

Started by the test once per rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in its environment, as a
hand-made launcher or `mp.spawn` would give them, and no LOCAL_WORLD_SIZE), each inside its own UTS
namespace whose host name says which simulated node it runs on. It writes `<out>/rank<r>.json`: the node
layout `RuntimeContext.from_runtime()` gives in this process, and in a DataLoader worker started by fork
and one started by spawn (which has no process group: the layout travels with the dataset's run facts).

--alone: rank 0 resolves its context while the other ranks wait in a barrier (a collective), as when rank 0
alone builds an evaluation loader; they resolve theirs after it.

A rank that hangs dumps every thread's stack and exits after --hang-after seconds (faulthandler).
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import torch.distributed as dist
import torch.utils.data

from shardcache import RuntimeContext
from shardcache.sources.deal.counting import RunFacts


def layout(ctx: RuntimeContext) -> list[int]:
    return [ctx.rank, ctx.world_size, ctx.local_rank, ctx.local_world_size, ctx.node_rank, ctx.num_nodes]


class ContextInWorker(torch.utils.data.IterableDataset[list[int]]):
    """Yields the layout a DataLoader worker resolves, as a shardcache source's worker does."""

    def __init__(self) -> None:
        self.facts = RunFacts()

    def __iter__(self) -> Iterator[list[int]]:
        yield layout(RuntimeContext.from_runtime(env=self.facts.worker_environment()))


def in_worker(method: str) -> list[int]:
    loader = torch.utils.data.DataLoader(
        ContextInWorker(), num_workers=1, batch_size=None, multiprocessing_context=method
    )
    (seen,) = list(loader)
    return [int(value) for value in seen]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--alone", action="store_true")
    parser.add_argument("--workers", default="fork,spawn", help="DataLoader start methods to resolve in")
    parser.add_argument("--hang-after", type=float, default=60.0)
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.hang_after, exit=True)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.hang_after))
    rank = dist.get_rank()
    if args.alone and rank != 0:
        dist.barrier()  # rank 0 exchanges meanwhile: a collective of the others must not meet it
    report = {"trainer": layout(RuntimeContext.from_runtime())}
    if args.alone and rank == 0:
        dist.barrier()
    report["again"] = layout(RuntimeContext.from_runtime())
    for method in filter(None, args.workers.split(",")):
        report[method] = in_worker(method)
    (args.out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
