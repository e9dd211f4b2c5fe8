"""TorchLoader.balance: mvp-dataset 0.2.3's semantics (equal items per rank; drop_last or dummies; local
items first, then the fullest donor, same node first; a per-chunk transfer budget), plus exact resume.

The planner is a pure function and is tested as one; the stage runs for real under torch.distributed (gloo,
one process per rank, `balance_worker.py`), and passes items through without it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.pipelines import assert_resumes, make_tars
from shardcache import ConfigError, Dataset, TorchLoader
from shardcache.stages.balance import Status, Transfer, plan_chunk

WORKER = Path(__file__).parents[1] / "workers" / "balance_worker.py"


def status(rank: int, available: int, node: int = 0, done: bool = True) -> Status:
    return Status(rank, node, available, done, 0)


def test_planner_takes_local_items_first() -> None:
    plan = plan_chunk([status(0, 2), status(1, 2)], 2, 4, True, "node")
    assert (plan.local, plan.transfers, plan.dummies) == ({0: 2, 1: 2}, [], {0: 0, 1: 0})


def test_planner_prefers_a_donor_on_the_same_node() -> None:
    statuses = [status(0, 4, 0), status(1, 0, 0), status(2, 4, 1), status(3, 0, 1)]
    plan = plan_chunk(statuses, 1, 4, True, "node")
    assert plan.transfers == [Transfer(0, 1, 1), Transfer(2, 3, 1)]


def test_planner_falls_back_to_another_node() -> None:
    statuses = [status(0, 0, 0), status(1, 0, 0), status(2, 4, 1), status(3, 1, 1)]
    plan = plan_chunk(statuses, 1, 4, True, "node")
    assert plan.transfers == [Transfer(2, 0, 1), Transfer(2, 1, 1)]


def test_planner_keeps_to_the_chunk_size_and_transfer_budget() -> None:
    plan = plan_chunk([status(0, 10), status(1, 0)], 4, 2, True, "none")
    assert (plan.local, plan.transfers) == ({0: 2, 1: 0}, [Transfer(0, 1, 2)])


def test_planner_tail_drops_with_drop_last() -> None:
    plan = plan_chunk([status(0, 1), status(1, 0)], 2, 4, True, "none")
    assert (plan.local, plan.finished) == ({0: 0, 1: 0}, True)


def test_planner_tail_pads_with_dummies_without_drop_last() -> None:
    plan = plan_chunk([status(0, 1), status(1, 0)], 2, 4, False, "none")
    assert (plan.local, plan.dummies, plan.finished) == ({0: 1, 1: 0}, {0: 0, 1: 1}, True)


def test_planner_sparse_tail_yields_every_real_item() -> None:
    plan = plan_chunk([status(r, 3 if r == 0 else 0) for r in range(8)], 16, 8, False, "none")
    assert plan.local == {r: 3 if r == 0 else 0 for r in range(8)}
    assert plan.dummies == {r: 0 if r == 0 else 3 for r in range(8)}
    assert plan.transfers == [] and plan.finished


def test_planner_is_not_finished_while_an_upstream_has_more() -> None:
    plan = plan_chunk([status(0, 4, done=False), status(1, 4)], 2, 4, True, "none")
    assert not plan.finished and plan.local == {0: 2, 1: 2}


def test_drop_last_false_needs_a_dummy_factory(tmp_path: Path) -> None:
    pytest.importorskip("torch.utils.data")
    ds = Dataset.from_source("tars", make_tars(tmp_path, 1, 2), daemon=None)
    with pytest.raises(ConfigError, match="needs dummy_factory"):
        TorchLoader(ds).balance(drop_last=False)


def test_buffer_size_must_hold_a_chunk(tmp_path: Path) -> None:
    pytest.importorskip("torch.utils.data")
    ds = Dataset.from_source("tars", make_tars(tmp_path, 1, 2), daemon=None)
    with pytest.raises(ConfigError, match="buffer_size must be >= chunk_size"):
        TorchLoader(ds).balance(buffer_size=1, chunk_size=2)


def test_without_torch_distributed_balance_passes_through_and_resumes(tmp_path: Path) -> None:
    pytest.importorskip("torch.utils.data")
    shards = make_tars(tmp_path, 2, 4)

    def make() -> Any:
        ds = Dataset.from_source("tars", shards, daemon=None)
        return TorchLoader(ds, batch_size=3, collate_fn=list).balance(chunk_size=2, buffer_size=2)

    assert sum(len(b) for b in make()) == 8
    assert_resumes(make, [0, 1, 2, 10_000])


# -- under torch.distributed (gloo, a process per rank) --------------------------------------------------


def write_data(path: Path, counts: list[int]) -> str:
    """One jsonl line per (rank, line); rank r's lines fan out to counts[r] items in total."""
    lines = []
    for count in counts:
        per_line = [1] * count + [0] * (6 - count)
        lines += [json.dumps({"n": n}) for n in per_line]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def run_ranks(tmp_path: Path, name: str, world: int, **args: Any) -> list[dict[str, Any]]:
    pytest.importorskip("torch.distributed")
    out = tmp_path / name
    out.mkdir()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                json.dumps(
                    {
                        **args,
                        "rank": r,
                        "world": world,
                        "init": str(tmp_path / f"{name}.init"),
                        "out": str(out),
                    }
                ),
            ]
        )
        for r in range(world)
    ]
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    return [json.loads((out / f"rank_{r}.json").read_text()) for r in range(world)]


def test_drop_last_gives_every_rank_the_same_count(tmp_path: Path) -> None:
    data = write_data(tmp_path / "d.jsonl", [5, 1])
    ranks = run_ranks(tmp_path, "drop", 2, data=data, drop_last=True, chunk=2)
    items = [r["items"] for r in ranks]
    assert [len(i) for i in items] == [3, 3]
    assert len(set(items[0] + items[1])) == 6


def test_dummies_fill_the_tail_without_losing_items(tmp_path: Path) -> None:
    data = write_data(tmp_path / "d.jsonl", [5, 2])
    ranks = run_ranks(tmp_path, "pad", 2, data=data, drop_last=False, chunk=3)
    items = [r["items"] for r in ranks]
    assert [len(i) for i in items] == [4, 4]
    real = [i for i in items[0] + items[1] if i != "DUMMY"]
    assert len(real) == len(set(real)) == 7


@pytest.mark.parametrize("drop_last", [True, False], ids=["drop", "pad"])
def test_balance_resumes_exactly_under_torch_distributed(tmp_path: Path, drop_last: bool) -> None:
    data = write_data(tmp_path / "d.jsonl", [6, 1])
    common = {"data": data, "drop_last": drop_last, "chunk": 2}
    full = [r["items"] for r in run_ranks(tmp_path, "full", 2, **common)]
    # Mid-chunk (3 = one chunk of 2, plus one): every rank checkpoints at the same step.
    head = run_ranks(tmp_path, "head", 2, stop=3, **common)
    states = tmp_path / "states.json"
    states.write_text(json.dumps({str(r): head[r]["state"] for r in range(2)}))
    tail = run_ranks(tmp_path, "tail", 2, state=str(states), **common)
    for r in range(2):
        assert head[r]["items"] + tail[r]["items"] == full[r]


def test_tensor_items_move_between_ranks(tmp_path: Path) -> None:
    data = write_data(tmp_path / "d.jsonl", [3, 1])
    ranks = run_ranks(tmp_path, "tensor", 2, data=data, drop_last=True, chunk=2, tensor=True)
    items = [r["items"] for r in ranks]
    assert [len(i) for i in items] == [2, 2]
    assert len({tuple(i) for i in items[0] + items[1]}) == 4
