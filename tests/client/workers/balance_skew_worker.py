"""One rank of the skewed-balance torchrun test: `torchrun ... balance_skew_worker.py SPEC_JSON`.

SPEC_JSON has `data` (a jsonl file of one line per rank, `{"n": count}`), `out` (a folder for this rank's
report), `runs` (each `{"name", "per_node", "topology", "drop_last"}`), `pg_timeout_s` and `watchdog_s`.
Rank r reads line r (placement="global", whatever the simulated node layout) and fans it out into `n`
items named `<key>#<copy>`, so the ranks start from very different counts. Every run goes through
`TorchLoader.balance` with its default buffer, chunk and transfer budget; the report is every run's items,
in the order this rank yielded them ("DUMMY" for a dummy).

A rank that has not finished after `watchdog_s` prints every thread's stack and exits, so a rank stuck in a
transfer fails the launch (and shows where it waited) instead of hanging it.
"""

from __future__ import annotations

import datetime
import faulthandler
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist

from shardcache import Dataset, RuntimeContext, TorchLoader

DUMMY = "DUMMY"


class Fanout:
    """Emits each sample `n` times (its field), as `<key>#<copy>`."""

    def __init__(self, context: RuntimeContext) -> None:
        pass

    def push(self, sample: dict[str, Any]) -> Iterator[Any]:
        for copy in range(sample["n"]):
            yield f"{sample['__key__']}#{copy}"

    def finish(self, *, drop_last: bool = False) -> Iterator[Any]:
        return iter(())


def dummy(context: RuntimeContext) -> str:
    return DUMMY


def run(spec: dict[str, Any], case: dict[str, Any], rank: int, world: int) -> list[str]:
    context = RuntimeContext(rank=rank, world_size=world, local_world_size=case["per_node"])
    ds = Dataset.from_source("jsonl", spec["data"], daemon=None, context=context, placement="global")
    loader = TorchLoader(ds.assemble(Fanout), num_workers=0).balance(
        drop_last=case["drop_last"],
        dummy_factory=None if case["drop_last"] else dummy,
        topology=case["topology"],
    )
    return [str(item) for item in loader]


def main() -> None:
    spec = json.loads(sys.argv[1])
    faulthandler.dump_traceback_later(spec["watchdog_s"], exit=True)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=spec["pg_timeout_s"]))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        report: dict[str, list[str]] = {}
        for case in spec["runs"]:
            report[case["name"]] = run(spec, case, rank, world)
            print(f"rank {rank}: {case['name']}: {len(report[case['name']])} items", flush=True)
        Path(spec["out"], f"rank{rank}.json").write_text(json.dumps(report))
        dist.barrier()
    finally:
        dist.destroy_process_group()
        faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
