"""mvp-dataset 0.2.3 parity: `Dataset.from_source("mixed", sources=..., strategy=..., weights=...)`.

From its semantics: "concat" reads the sources one after the other, "round_robin" one sample of each in
turn, "weighted_round_robin" (the default) a smooth weighted rotation (weights 2:1 read a, b, a, a, b, a),
and the random strategies a seeded order that is the same on every run; every sample is read once, dict
samples carry ``__source__``, and a state taken mid-mix resumes exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.pipelines import assert_resumes, slot_contexts
from shardcache import ConfigError, Dataset, RuntimeContext


class Files:
    def __init__(self, root: Path) -> None:
        self.jsonl = str(root / "a.jsonl")
        Path(self.jsonl).write_text("".join(json.dumps({"id": f"jsonl-{i}"}) + "\n" for i in range(4)))
        self.parquet = str(root / "b.parquet")
        pq.write_table(pa.table({"id": [f"parquet-{i}" for i in range(2)]}), self.parquet)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    return Files(tmp_path_factory.mktemp("mixed"))


def mixed(files: Files, strategy: str = "weighted_round_robin", **kw: Any) -> Dataset:
    ctx = kw.pop("context", RuntimeContext(seed=11))
    return Dataset.from_source(
        "mixed",
        sources={
            "jsonl": Dataset.from_source("jsonl", files.jsonl, daemon=None, context=ctx),
            "parquet": Dataset.from_source("parquet", files.parquet, daemon=None, context=ctx),
        },
        strategy=strategy,
        weights={"jsonl": 2, "parquet": 1},
        **kw,
    )


def j(i: int) -> tuple[str, str]:
    return (f"jsonl-{i}", "jsonl")


def p(i: int) -> tuple[str, str]:
    return (f"parquet-{i}", "parquet")


ORDERS = {
    "concat": [j(0), j(1), j(2), j(3), p(0), p(1)],
    "round_robin": [j(0), p(0), j(1), p(1), j(2), j(3)],
    "weighted_round_robin": [j(0), p(0), j(1), j(2), p(1), j(3)],
}


@pytest.mark.parametrize("strategy", list(ORDERS))
def test_ordered_strategies_read_in_their_order(files: Files, strategy: str) -> None:
    assert [(s["id"], s["__source__"]) for s in mixed(files, strategy)] == ORDERS[strategy]


@pytest.mark.parametrize("strategy", ["random", "weighted_random"])
def test_random_strategies_are_deterministic_and_read_everything_once(files: Files, strategy: str) -> None:
    first = [s["id"] for s in mixed(files, strategy)]
    assert first == [s["id"] for s in mixed(files, strategy)]
    assert sorted(first) == sorted(i for i, _ in ORDERS["concat"])


def test_the_default_strategy_is_weighted_round_robin(files: Files) -> None:
    ctx = RuntimeContext(seed=11)
    ds = Dataset.from_source(
        "mixed",
        sources={
            "jsonl": Dataset.from_source("jsonl", files.jsonl, daemon=None, context=ctx),
            "parquet": Dataset.from_source("parquet", files.parquet, daemon=None, context=ctx),
        },
        weights={"jsonl": 2, "parquet": 1},
    )
    assert [(s["id"], s["__source__"]) for s in ds] == ORDERS["weighted_round_robin"]


@pytest.mark.parametrize("strategy", [*ORDERS, "random", "weighted_random"])
def test_a_mixed_source_resumes_exactly(files: Files, strategy: str) -> None:
    assert_resumes(lambda: mixed(files, strategy), [0, 1, 3, 4, 10_000])


def test_a_mixed_source_over_slots_reads_each_sample_once(files: Files) -> None:
    ds = mixed(files, "round_robin", context=None)
    seen = [s["id"] for ctx in slot_contexts(2) for s in ds.iter_context(ctx)]
    assert sorted(seen) == sorted(i for i, _ in ORDERS["concat"])


def test_sources_with_different_contexts_are_refused(files: Files) -> None:
    left = Dataset.from_source("jsonl", files.jsonl, daemon=None, context=RuntimeContext(seed=1))
    right = Dataset.from_source("parquet", files.parquet, daemon=None, context=RuntimeContext(seed=2))
    with pytest.raises(ConfigError, match="different contexts"):
        Dataset.from_source("mixed", sources={"left": left, "right": right})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"strategy": "zigzag"}, "strategy='zigzag'"),
        ({"weights": {"jsonl": 0}}, "positive integer"),
        ({"weights": {"nope": 1}}, "not source names"),
    ],
)
def test_bad_arguments_are_refused(files: Files, kwargs: dict[str, Any], message: str) -> None:
    a = Dataset.from_source("jsonl", files.jsonl, daemon=None)
    with pytest.raises(ConfigError, match=message):
        Dataset.from_source("mixed", sources={"jsonl": a}, **kwargs)


def test_no_sources_is_refused() -> None:
    with pytest.raises(ConfigError, match="at least one dataset"):
        Dataset.from_source("mixed", sources={})


def test_stages_chain_after_a_mixed_source(files: Files) -> None:
    batches = list(mixed(files, "concat").batch(4))
    assert [len(b) for b in batches] == [4, 2]


def keep(item: Any) -> Any:
    return item


def test_a_mixed_source_through_torch_loader_workers_reads_each_sample_once(
    files: Files, start_method: str
) -> None:
    pytest.importorskip("torch.utils.data")
    from harness.start_methods import worker_context
    from shardcache import TorchLoader

    loader = TorchLoader(
        mixed(files, "round_robin", context=None),
        num_workers=2,
        collate_fn=keep,
        multiprocessing_context=worker_context(start_method),
    )
    seen = [s["id"] for s in loader]
    assert sorted(seen) == sorted(i for i, _ in ORDERS["concat"])
