"""The trainer demo's result table: one row per epoch from the ranks' reports and the daemon's counters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardcache.formatting import human_bytes
from shardcache_protocol import Stats
from trainer_demo.rank import EpochReport

HEADERS = (
    "epoch",
    "opens",
    "hit ratio",
    "fetched",
    "fetched/dataset",
    "samples",
    "samples/s",
    "waited on shards",
    "trainer waited",
    "val acc",
)


@dataclass(frozen=True)
class EpochRow:
    """One epoch, all ranks together."""

    epoch: int
    hits: int
    opens: int
    fetched: int
    samples: int
    seconds: float  # the slowest rank's epoch
    shard_wait_s: float | None  # time opens waited in the daemon, all readers (None: metrics unreachable)
    trainer_wait_share: float  # time the training steps waited for data over the ranks' epoch time
    val_accuracy: float | None

    @classmethod
    def of(
        cls,
        epoch: int,
        reports: Sequence[EpochReport],
        before: Stats,
        after: Stats,
        shard_wait_s: float | None,
    ) -> EpochRow:
        hits = after.hits - before.hits
        opens = hits + after.misses - before.misses
        rank_time = sum(r.seconds for r in reports)
        val = sum(r.val_samples for r in reports)
        accuracy = sum(r.val_accuracy * r.val_samples for r in reports) / val if val else None
        return cls(
            epoch=epoch,
            hits=hits,
            opens=opens,
            fetched=after.bytes_fetched - before.bytes_fetched,
            samples=sum(r.samples for r in reports),
            seconds=max(r.seconds for r in reports),
            shard_wait_s=shard_wait_s,
            trainer_wait_share=sum(r.waited_s for r in reports) / rank_time if rank_time > 0 else 0.0,
            val_accuracy=accuracy,
        )


def _cells(row: EpochRow, dataset_bytes: int) -> list[str]:
    return [
        str(row.epoch),
        str(row.opens),
        f"{row.hits / row.opens:.0%}" if row.opens else "-",
        human_bytes(row.fetched),
        f"{row.fetched / dataset_bytes:.2f}x" if dataset_bytes else "-",
        str(row.samples),
        f"{row.samples / row.seconds:,.0f}" if row.seconds > 0 else "-",
        "-" if row.shard_wait_s is None else f"{row.shard_wait_s:.1f}s",
        f"{row.trainer_wait_share:.0%}",
        "-" if row.val_accuracy is None else f"{row.val_accuracy:.1%}",
    ]


def render_table(rows: Sequence[EpochRow], dataset_bytes: int) -> str:
    """A plain-text table with a total line, and a legend of the columns."""
    body = [_cells(row, dataset_bytes) for row in rows]
    if rows:
        total = EpochRow(
            epoch=0,
            hits=sum(r.hits for r in rows),
            opens=sum(r.opens for r in rows),
            fetched=sum(r.fetched for r in rows),
            samples=sum(r.samples for r in rows),
            seconds=sum(r.seconds for r in rows),
            shard_wait_s=None
            if any(r.shard_wait_s is None for r in rows)
            else sum(r.shard_wait_s or 0 for r in rows),
            trainer_wait_share=sum(r.trainer_wait_share * r.seconds for r in rows)
            / max(1e-9, sum(r.seconds for r in rows)),
            val_accuracy=None,
        )
        body.append(["total", *_cells(total, dataset_bytes)[1:9], ""])
    widths = [max(len(h), *(len(line[i]) for line in body)) for i, h in enumerate(HEADERS)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(HEADERS, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in body]
    lines.append(
        f"\ndataset: {human_bytes(dataset_bytes)}. hit ratio: opens served from the node cache. "
        "fetched: bytes downloaded from S3.\nwaited on shards: opens waiting for downloads (all readers). "
        "trainer waited: share of epoch time the training step waited for its next batch."
    )
    return "\n".join(lines)
