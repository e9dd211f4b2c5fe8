"""The resume contract (issue 6), one helper over every stage, source, TorchLoader and mixing.

Each case builds a FRESH pipeline per call; `assert_resumes` takes the state at several points (including
before the first item and after the last), round-trips it through JSON, resumes it in another fresh
pipeline, resumes a second time halfway through the rest, and compares with the uninterrupted run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.pipelines import Resumable, assert_resumes, make_tars
from harness.start_methods import DEFAULT, THREADS, loader_workers
from shardcache import Dataset, RuntimeContext, StateError


def add_len(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "length": len(sample.get("txt", b""))}


def key_of(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


def keep_list(batch: list[Any]) -> list[Any]:
    return batch


class Pairs:
    """An assembler with no state of its own (the stage resumes it by replay)."""

    def __init__(self, context: RuntimeContext) -> None:
        self.pending: list[Any] = []

    def push(self, sample: Any) -> Iterator[tuple[Any, ...]]:
        self.pending.append(sample["__key__"] if isinstance(sample, dict) else sample)
        if len(self.pending) == 2:
            out, self.pending = tuple(self.pending), []
            yield out

    def finish(self, *, drop_last: bool = False) -> Iterator[tuple[Any, ...]]:
        if self.pending and not drop_last:
            yield tuple(self.pending)


class Files:
    """One small dataset of every kind, written once for the module."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tars = make_tars(root / "tars", count=4, samples=5)
        self.small_tars = make_tars(root / "small", count=2, samples=3, prefix="small")
        self.jsonl = []
        for f in range(2):
            path = root / f"part_{f}.jsonl"
            path.write_text("".join(json.dumps({"id": f * 100 + i}) + "\n" for i in range(7 + f)))
            self.jsonl.append(str(path))
        self.parquet = []
        for f in range(2):
            path = root / f"train_{f}.parquet"
            pq.write_table(pa.table({"text": [f"t{f}-{i}" for i in range(8)]}), path, row_group_size=3)
            self.parquet.append(str(path))
        import lance

        self.lance = str(root / "rows.lance")
        lance.write_dataset(pa.table({"tokens": list(range(24))}), self.lance, max_rows_per_file=5)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    return Files(tmp_path_factory.mktemp("contract"))


def tars(f: Files, context: RuntimeContext | None = None) -> Dataset:
    return Dataset.from_source("tars", f.tars, daemon=None, context=context)


def loader(f: Files, workers: int, method: str = DEFAULT) -> Any:
    from shardcache import TorchLoader

    kwargs = loader_workers(method) if workers else {}
    ds = tars(f).map(key_of)
    return TorchLoader(ds, num_workers=workers, batch_size=3, collate_fn=keep_list, **kwargs)


Case = Callable[[Files], Resumable]

DATASET_CASES: dict[str, Case] = {
    "stage-map": lambda f: tars(f).map(add_len),
    "stage-select": lambda f: tars(f).select("txt"),
    "stage-shuffle": lambda f: tars(f).shuffle(7, initial=3),
    "stage-batch": lambda f: tars(f).batch(3),
    "stage-unbatch": lambda f: tars(f).batch(3).unbatch(),
    "stage-assemble": lambda f: tars(f).assemble(Pairs),
    "stage-chain": lambda f: tars(f).shuffle(4).batch(3).unbatch().assemble(Pairs).batch(2),
    "stage-cache": lambda f: tars(f).map(add_len).cache(cache_dir=str(f.root / "cache")).shuffle(5),
    "source-tars": lambda f: tars(f),
    "source-jsonl": lambda f: Dataset.from_source("jsonl", f.jsonl, daemon=None),
    "source-parquet": lambda f: Dataset.from_source("parquet", f.parquet, daemon=None, batch_size=2),
    "source-lance-none": lambda f: Dataset.from_source("lance", f.lance, shuffle_mode="none", batch_size=4),
    "source-lance-global": lambda f: Dataset.from_source(
        "lance", f.lance, shuffle_mode="global", batch_size=4
    ),
    "mix-proportional": lambda f: Dataset.mix(
        {"big": tars(f), "small": Dataset.from_source("tars", f.small_tars, daemon=None)}, seed=2
    ),
    "mixed-kind": lambda f: Dataset.from_source(
        "mixed",
        sources={"big": tars(f), "small": Dataset.from_source("tars", f.small_tars, daemon=None)},
        strategy="weighted_random",
        weights={"big": 2, "small": 1},
    ),
    "mix-recipe": lambda f: Dataset.mix(
        {"big": tars(f), "small": Dataset.from_source("tars", f.small_tars, daemon=None)},
        recipe={"big": 3, "small": 2},
        main="big",
    ),
}

# Before the first item, mid shard, at a shard boundary (tar shards hold 5), past it, after the last item
# (the helper clamps 10_000 to the run's length).
POINTS = [0, 1, 3, 5, 7, 10_000]
SLOTS = {
    "one-slot": None,
    "rank1-of-2": RuntimeContext(rank=1, world_size=2, seed=3, epoch=1),
}


@pytest.mark.parametrize("slot", list(SLOTS))
@pytest.mark.parametrize("case", list(DATASET_CASES))
def test_dataset_resumes_exactly(files: Files, case: str, slot: str) -> None:
    assert_resumes(lambda: DATASET_CASES[case](files), POINTS, SLOTS[slot])


LOADER_CASES: dict[str, Callable[[Files, int, str], Resumable]] = {
    "worker-batches": loader,
    "loader-side-stages": lambda f, w, m: (
        loader(f, w, m).unbatch().shuffle(6, seed=1).assemble(Pairs).batch(2)
    ),
    # Without torch.distributed balance passes through; tests/client/stages/test_parity_balance.py resumes it
    # under gloo with two ranks.
    "loader-balance": lambda f, w, m: loader(f, w, m).balance(chunk_size=2, buffer_size=2),
}


@pytest.mark.parametrize("case", list(LOADER_CASES))
def test_torch_loader_in_the_main_process_resumes_exactly(files: Files, case: str) -> None:
    pytest.importorskip("torch.utils.data")
    assert_resumes(lambda: LOADER_CASES[case](files, 0, DEFAULT), POINTS)


@pytest.mark.parametrize("case", list(LOADER_CASES))
def test_torch_loader_with_workers_resumes_exactly(files: Files, case: str, any_start_method: str) -> None:
    """Under every start method users choose: the default (fork), forkserver and spawn."""
    pytest.importorskip("torch.utils.data")
    make = lambda: LOADER_CASES[case](files, 2, any_start_method)  # noqa: E731
    if any_start_method == "spawn":
        # Each spawned worker imports torch (2-6 s a loader here): one resume mid-epoch, without the hop.
        assert_resumes(make, [1], hop=False)
    else:
        # Each pass with worker processes costs about a second here: fewer points with workers.
        assert_resumes(make, [1, 10_000])


@pytest.mark.parametrize("case", list(LOADER_CASES))
def test_torch_loader_with_thread_workers_resumes_exactly(files: Files, case: str) -> None:
    """Thread workers start in microseconds: every point, as in the main process."""
    pytest.importorskip("torch.utils.data")
    assert_resumes(lambda: LOADER_CASES[case](files, 2, THREADS), POINTS)


def test_state_from_world_size_2_is_refused_under_world_size_4(files: Files) -> None:
    ds = tars(files).shuffle(4)
    it = ds.iter_context(RuntimeContext(rank=0, world_size=2))
    next(it)
    resumed = tars(files).shuffle(4)
    resumed.load_state_dict(json.loads(json.dumps(ds.state_dict())))
    with pytest.raises(StateError, match="slot 0 of 2, this reader is slot 0 of 4; resume with the same"):
        resumed.iter_context(RuntimeContext(rank=0, world_size=4))


def test_state_of_another_source_is_refused(files: Files) -> None:
    ds = tars(files)
    next(iter(ds))
    with pytest.raises(StateError, match="another source or stage list"):
        Dataset.from_source("tars", files.tars[:3], daemon=None).load_state_dict(ds.state_dict())


def test_state_of_another_version_is_refused(files: Files) -> None:
    ds = tars(files)
    next(iter(ds))
    with pytest.raises(StateError, match="version 99 is not supported"):
        tars(files).load_state_dict({**ds.state_dict(), "version": 99})


EPOCH_SCRIPT = """
import json, sys
from shardcache import Dataset
args = json.loads(sys.argv[1])
ds = Dataset.from_source("tars", args["tars"], daemon=None, context=None).shuffle(6)
if args["mix"]:
    small = Dataset.from_source("tars", args["small"], daemon=None)
    ds = Dataset.mix({"big": ds, "small": small}, seed=args["seed"])
ds.set_epoch(args["epoch"])
print(json.dumps([s["__key__"] for s in ds]))
"""


@pytest.mark.parametrize("mix", [False, True], ids=["shuffled-tars", "mix"])
def test_set_epoch_order_is_the_same_in_another_process(files: Files, mix: bool) -> None:
    def here(epoch: int) -> list[str]:
        ds = tars(files).shuffle(6)
        if mix:
            small = Dataset.from_source("tars", files.small_tars, daemon=None)
            ds = Dataset.mix({"big": ds, "small": small}, seed=4)
        ds.set_epoch(epoch)
        return [s["__key__"] for s in ds]

    args = {"tars": files.tars, "small": files.small_tars, "mix": mix, "seed": 4, "epoch": 3}
    run = subprocess.run(
        [sys.executable, "-c", EPOCH_SCRIPT, json.dumps(args)], check=True, capture_output=True, text=True
    )
    elsewhere = json.loads(run.stdout)
    assert elsewhere == here(3)
    assert here(3) != here(2)


class Counter:
    """A map that counts the samples it sees: how much of the upstream a resume re-reads."""

    def __init__(self) -> None:
        self.seen = 0

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        self.seen += 1
        return sample


def test_shuffle_resume_rereads_from_a_checkpoint_not_from_the_epoch_start(tmp_path: Path) -> None:
    rows = make_tars(tmp_path / "long", count=4, samples=150)

    def make(counter: Counter) -> Dataset:
        return Dataset.from_source("tars", rows, daemon=None).map(counter).shuffle(8)

    full = [s["__key__"] for s in make(Counter())]
    first = make(Counter())
    it = first.iter_context(None)
    head = [next(it)["__key__"] for _ in range(500)]
    state = json.loads(json.dumps(first.state_dict()))
    counter = Counter()
    resumed = make(counter)
    resumed.load_state_dict(state)
    rest = resumed.iter_context(None)
    head.append(next(rest)["__key__"])
    # A buffer of 8 keeps inputs for a few dozen draws; the checkpoint (every 64 inputs) is just before.
    assert counter.seen < 200, f"resume re-read {counter.seen} of 500+ inputs"
    assert head + [s["__key__"] for s in rest] == full


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(0, 300),
    buffer_size=st.integers(1, 20),
    initial=st.none() | st.integers(1, 20),
    point=st.integers(0, 300),
)
def test_shuffle_resumes_exactly_for_any_buffer_and_point(
    files: Files, rows: int, buffer_size: int, initial: int | None, point: int
) -> None:
    path = files.root / f"rows_{rows}.jsonl"
    if not path.exists():
        path.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(rows)))
    assert_resumes(
        lambda: Dataset.from_source("jsonl", str(path), daemon=None).shuffle(buffer_size, initial), [point]
    )


class CountingPairs(Pairs):
    """The same packer with its own state: the pending keys (the inputs it holds back)."""

    def state_dict(self) -> dict[str, Any]:
        return {"pending": list(self.pending)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pending = list(state["pending"])


@pytest.mark.parametrize("slot", list(SLOTS))
def test_assembler_with_its_own_state_resumes_exactly(files: Files, slot: str) -> None:
    assert_resumes(lambda: tars(files).assemble(CountingPairs).batch(2), POINTS, SLOTS[slot])


def test_assembler_with_its_own_state_rereads_from_a_checkpoint(tmp_path: Path) -> None:
    rows = make_tars(tmp_path / "long", count=2, samples=300)

    def make(counter: Counter) -> Dataset:
        return Dataset.from_source("tars", rows, daemon=None).map(counter).assemble(CountingPairs)

    full = list(make(Counter()))
    first = make(Counter())
    it = first.iter_context(None)
    head = [next(it) for _ in range(250)]
    counter = Counter()
    resumed = make(counter)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    head += list(resumed)
    assert head == full
    assert counter.seen <= 600 - 500 + 64, f"resume re-read {counter.seen} inputs"
