"""One rank of the TorchLoader.balance tests: `python balance_worker.py ARGS_JSON`."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from shardcache import Dataset, RuntimeContext, TorchLoader


class Fanout:
    """Emits each sample `n` times (its field), so ranks reading different lines get different counts."""

    def __init__(self, context: RuntimeContext) -> None:
        pass

    def push(self, sample: dict[str, Any]) -> Iterator[Any]:
        for copy in range(sample["n"]):
            yield f"{sample['__key__']}#{copy}"

    def finish(self, *, drop_last: bool = False) -> Iterator[Any]:
        return iter(())


class TensorFanout(Fanout):
    """The same items as dicts holding a tensor (its line number and copy), as packed batches are."""

    def push(self, sample: dict[str, Any]) -> Iterator[Any]:
        line = int(str(sample["__key__"]).rsplit(":", 1)[1])
        for copy in range(sample["n"]):
            yield {"ids": torch.tensor([line, copy])}


def show(item: Any) -> Any:
    return item["ids"].tolist() if isinstance(item, dict) else item


def dummy(context: RuntimeContext) -> str:
    return "DUMMY"


def main() -> None:
    args = json.loads(sys.argv[1])
    rank, world = args["rank"], args["world"]
    dist.init_process_group("gloo", init_method=f"file://{args['init']}", rank=rank, world_size=world)
    try:
        context = RuntimeContext(rank=rank, world_size=world)
        fanout = TensorFanout if args.get("tensor") else Fanout
        ds = Dataset.from_source("jsonl", args["data"], daemon=None, context=context).assemble(fanout)
        drop_last = args["drop_last"]
        loader = TorchLoader(ds, num_workers=0).balance(
            drop_last=drop_last,
            dummy_factory=None if drop_last else dummy,
            buffer_size=args["chunk"],
            chunk_size=args["chunk"],
            topology="none",
        )
        out: dict[str, Any] = {}
        if args.get("state") is not None:
            loader.load_state_dict(json.loads(Path(args["state"]).read_text())[str(rank)])
        it = iter(loader)
        if args.get("stop") is not None:
            out["items"] = [show(next(it)) for _ in range(args["stop"])]
            out["state"] = loader.state_dict()
        else:
            out["items"] = [show(item) for item in it]
        Path(args["out"], f"rank_{rank}.json").write_text(json.dumps(out))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
