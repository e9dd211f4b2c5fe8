"""Training with mini epochs (seed 001): train, checkpoint and validate per chunk of an epoch's shards.

Each epoch's shard order (deterministic from seed and epoch) is cut into chunks of `--shards-per-chunk`
shards; every chunk is an ordinary finite Dataset with its own DataLoader. After each chunk the loop saves
`checkpoint_epoch{E}_chunk{K}.pt` and runs validation on a separate dataset. Run again with `--resume` to
continue after the newest checkpoint: the chunking is a function of (seed, epoch), so chunk K+1 is the same.

    python examples/mini_epochs.py --demo                 # generates small tar shards in a temp dir
    python examples/mini_epochs.py --shards 'data/train_{000000..000099}.tar' --val data/val.tar
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import re
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import torch

from shardcache import Dataset, RuntimeContext

logger = logging.getLogger("mini_epochs")
CHECKPOINT = re.compile(r"checkpoint_epoch(\d+)_chunk(\d+)\.pt$")


def make_demo_shards(root: Path, shards: int, samples: int, prefix: str) -> list[str]:
    """Tar shards of samples {x: 4 floats, y: 2x0 - x1 + 0.5x2}, one `.json` member per sample."""
    gen = torch.Generator().manual_seed(len(prefix) * 1000 + shards)
    paths = []
    for s in range(shards):
        path = root / f"{prefix}_{s:06d}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(samples):
                x = torch.rand(4, generator=gen).tolist()
                body = json.dumps({"x": x, "y": 2 * x[0] - x[1] + 0.5 * x[2]}).encode()
                info = tarfile.TarInfo(f"s{s:04d}_{i:05d}.json")
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
        paths.append(str(path))
    return paths


def decode(sample: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    row = json.loads(sample["json"])
    return torch.tensor(row["x"]), torch.tensor([row["y"]])


def latest_checkpoint(directory: Path) -> tuple[int, int, Path] | None:
    found = [(int(m[1]), int(m[2]), p) for p in directory.glob("*.pt") if (m := CHECKPOINT.search(p.name))]
    return max(found) if found else None


def validate(model: torch.nn.Module, val: Dataset, batch_size: int) -> float:
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in torch.utils.data.DataLoader(val, batch_size=batch_size):  # type: ignore[arg-type]
            total += float(torch.nn.functional.mse_loss(model(x), y, reduction="sum"))
            count += len(x)
    model.train()
    return total / max(count, 1)


def train(args: argparse.Namespace) -> list[str]:
    """The seed 001 loop; returns the checkpoint names written."""
    ctx = RuntimeContext(seed=args.seed)
    daemon = None if args.demo else args.daemon
    dataset = Dataset.from_source("tars", args.shards, context=ctx, daemon=daemon).map(decode)
    val = Dataset.from_source("tars", args.val, context=ctx, daemon=daemon).map(decode)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    out = Path(args.checkpoints)
    out.mkdir(parents=True, exist_ok=True)
    start_epoch, start_chunk = 0, 0
    if args.resume and (found := latest_checkpoint(out)) is not None:
        state = torch.load(found[2])
        model.load_state_dict(state["model_state_dict"])
        optimizer.load_state_dict(state["optimizer_state_dict"])
        start_epoch, start_chunk = state["epoch"], state["chunk"] + 1
        logger.info("resumed from %s", found[2].name)
    written = []
    for epoch in range(start_epoch, args.epochs):
        dataset.set_epoch(epoch)  # reshuffles the shard order, so the chunking changes with the epoch
        chunks = dataset.mini_epochs(args.shards_per_chunk, num_workers=args.workers)
        for chunk_index in range(start_chunk if epoch == start_epoch else 0, len(chunks)):
            loader = torch.utils.data.DataLoader(
                chunks[chunk_index],  # type: ignore[arg-type]
                batch_size=args.batch_size,
                num_workers=args.workers,
            )
            for x, y in loader:
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
            name = f"checkpoint_epoch{epoch}_chunk{chunk_index}.pt"
            torch.save(
                {
                    "model_state_dict": model.state_dict(),
                    "optimizer_state_dict": optimizer.state_dict(),
                    "epoch": epoch,
                    "chunk": chunk_index,
                    "shards": [ref.url for ref in chunks[chunk_index].source.shards],
                },
                out / name,
            )
            written.append(name)
            val_loss = validate(model, val, args.batch_size)
            print(
                f"epoch {epoch} chunk {chunk_index}/{len(chunks)}: train loss {loss.item():.4f} "
                f"val loss {val_loss:.4f} -> {name}",
                flush=True,
            )
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--demo", action="store_true", help="generate small shards and read them directly")
    parser.add_argument("--shards", help="training shards (brace ranges, globs, a manifest)")
    parser.add_argument("--val", help="validation shards")
    parser.add_argument("--daemon", default="auto", help="'auto', 'required' or a socket path")
    parser.add_argument(
        "--checkpoints", default=None, help="checkpoint directory (default: <workdir>/checkpoints)"
    )
    parser.add_argument("--workdir", default=None, help="demo data and checkpoints (default: a temp dir)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--shards-per-chunk", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers per chunk")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true", help="continue after the newest checkpoint")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="mini-epochs-"))
    if args.demo:
        data = workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        args.shards = make_demo_shards(data, shards=8, samples=40, prefix="train")
        args.val = make_demo_shards(data, shards=1, samples=40, prefix="val")
    elif not args.shards or not args.val:
        parser.error("give --shards and --val, or --demo")
    args.checkpoints = args.checkpoints or str(workdir / "checkpoints")
    train(args)


if __name__ == "__main__":
    main()
