"""One reader's deal under `even=` and `exchange=`: its own slot's share against the whole deal (issue 25).

`plan_epoch` deals every slot's pieces (a `Piece` per unit, then per-slot lists); a reader needs one slot's.
`slot_share` computes that row alone (the same pieces: `tests/client/sources/deal/test_slot_share.py`), with
array passes where `even=` (the cut at sample granularity) or `exchange=` need every unit. Both are timed
on a synthetic deal (no files: n units of 20-32 samples, W = 1,024 ranks x 2 workers), each for a fresh
epoch (the process's cache of recent epoch orders is emptied before each `slot_share`, since another case
or `plan_epoch` may have made the same order, and a garbage collection runs before it, so that one owed for
`plan_epoch`'s pieces does not land in it), slot 777, same process, median of `--repeats`:

    .venv/bin/python -m bench.bench_deal                          # n = 10^3, 10^4, 10^5
    .venv/bin/python -m bench.bench_deal --sizes 1000 1000000     # the 1M figures (minutes: plan_epoch)
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from shardcache.sources.deal.order import shuffled
from shardcache.sources.deal.partition import Layout, Partitioning, Piece, plan_epoch
from shardcache.sources.deal.share import slot_share

# (even, exchange, node groups)
CASES: list[tuple[str | None, float, int]] = [
    (None, 0.0, 1),
    ("drop", 0.0, 1),
    ("pad", 0.0, 1),
    (None, 0.1, 4),
    ("drop", 0.0, 4),
    ("pad", 0.2, 4),
]
SLOT = 777


def measure(n: int, even: str | None, exchange: float, groups: int, repeats: int) -> tuple[float, float]:
    """Seconds of one slot's share and of the whole deal (medians), for fresh epochs."""
    counts = [20 + (u * 7) % 13 for u in range(n)]
    weights = tuple(float(c) for c in counts)
    layout = Layout(groups=groups, ranks=1024, workers=2)
    part = Partitioning("node" if groups > 1 else "global", even, exchange)
    universe = [Piece(u, 0, counts[u] if even else None) for u in range(n)]
    slot = SLOT % layout.total_slots
    slot_share(n, lambda: weights, layout, part, 1, 0, 0, slot, True, lambda: counts)  # the node shares, once
    mine_s, whole_s = [], []
    for epoch in range(1, repeats + 1):
        shuffled.cache_clear()  # a fresh epoch: no order left by another case or by `plan_epoch`
        gc.collect()  # the collection owed for `plan_epoch`'s 10^6 pieces is not the share's
        started = time.perf_counter()
        mine = slot_share(n, lambda: weights, layout, part, 1, epoch, 0, slot, True, lambda: counts)
        mine_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        whole = plan_epoch(universe, weights, layout, part, 1, epoch)
        whole_s.append(time.perf_counter() - started)
        assert mine == whole[slot], "slot_share differs from the whole deal's row"
    return statistics.median(mine_s), statistics.median(whole_s)


def main(argv: list[str] | None = None) -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rows: dict[tuple[str | None, float, int], list[tuple[int, float, float]]] = {}
    for even, exchange, groups in CASES:
        for n in args.sizes:
            mine, whole = measure(n, even, exchange, groups, args.repeats)
            rows.setdefault((even, exchange, groups), []).append((n, mine, whole))
            print(
                f"n={n:>8} even={even!s:>4} exchange={exchange:.1f} groups={groups}: "
                f"slot_share {mine * 1e3:8.1f} ms  plan_epoch {whole * 1e3:9.1f} ms  "
                f"ratio {mine / whole:.3f}",
                flush=True,
            )
    print(f"\nslot_share at the largest n over the smallest (n={args.sizes[-1]}/{args.sizes[0]}):")
    for (even, exchange, groups), found in rows.items():
        (_, small, _), (_, large, whole) = found[0], found[-1]
        print(
            f"  even={even!s:>4} exchange={exchange:.1f} groups={groups}: {large / small:7.1f}x "
            f"({large * 1e3:.1f} ms; plan_epoch {whole * 1e3:.0f} ms)"
        )


if __name__ == "__main__":
    main()
