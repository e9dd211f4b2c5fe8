"""TorchLoader's thread workers (`workers="threads"`): what differs from worker processes, and what must not.

Determinism, exact resume, elastic resume and equal ranks run under both modes in their own modules (the
`loader_mode` fixture); here: the two modes give the same items and the same states, a state crosses from one
mode to the other, the threads stay within their prefetch bound, stop when the loader is closed or dropped,
re-raise a worker's error as it was, and a fork while they read gives a child that inherits no lock held by
one of them.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from harness.pipelines import make_tars
from harness.polling import wait_for

torch_data = pytest.importorskip("torch.utils.data")

from shardcache import ConfigError, Dataset, RuntimeContext, TorchLoader  # noqa: E402
from shardcache.context import torch_worker_id  # noqa: E402
from shardcache.errors import CorruptShardError  # noqa: E402
from shardcache.loader.threads import THREAD_NAME  # noqa: E402

SHARDS, SAMPLES = 6, 7
ALL_KEYS = Counter(f"s{s:03d}_{i:04d}" for s in range(SHARDS) for i in range(SAMPLES))
DEADLINE_S = 30.0


def identity(batch: list[Any]) -> list[Any]:
    return batch


def key_of(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


@pytest.fixture
def tars(tmp_path: Path) -> list[str]:
    return make_tars(tmp_path / "tars", count=SHARDS, samples=SAMPLES)


def loader(tars: list[str], workers: str, num_workers: int = 2, **kwargs: Any) -> TorchLoader:
    ds = Dataset.from_source("tars", tars, daemon=None).map(key_of)
    return (
        TorchLoader(ds, num_workers=num_workers, batch_size=2, collate_fn=identity, workers=workers, **kwargs)
        .unbatch()
        .shuffle(5, seed=2)
        .batch(4)
    )


def worker_threads() -> list[str]:
    """The TorchLoader worker threads running in this process."""
    prefix = THREAD_NAME.format("")
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]


def test_threads_yield_the_items_and_states_of_worker_processes(tars: list[str]) -> None:
    by_mode = {}
    for mode in ("processes", "threads"):
        it = iter(loader(tars, mode))
        by_mode[mode] = [(batch, json.dumps(it.state_dict(), sort_keys=True)) for batch in it]
    assert by_mode["threads"] == by_mode["processes"]
    assert Counter(k for batch, _ in by_mode["threads"] for k in batch) == ALL_KEYS


@pytest.mark.parametrize(("saved", "resumed"), [("processes", "threads"), ("threads", "processes")])
def test_a_state_taken_in_one_mode_resumes_in_the_other(tars: list[str], saved: str, resumed: str) -> None:
    full = [k for batch in loader(tars, saved) for k in batch]
    it = iter(loader(tars, saved))
    head = [k for _ in range(4) for k in next(it)]
    state = json.loads(json.dumps(it.state_dict()))
    it.close()
    other = loader(tars, resumed)
    other.load_state_dict(state)
    assert head + [k for batch in other for k in batch] == full


def test_each_thread_reads_the_slot_of_its_worker(tars: list[str]) -> None:
    seen: list[tuple[int | None, str]] = []

    def record(sample: dict[str, Any]) -> str:
        seen.append((torch_worker_id(), str(sample["__key__"])))
        return str(sample["__key__"])

    ctx = RuntimeContext(rank=1, world_size=2)
    ds = Dataset.from_source("tars", tars, daemon=None, context=ctx).map(record)
    list(TorchLoader(ds, num_workers=3, workers="threads"))
    plain = Dataset.from_source("tars", tars, daemon=None).map(key_of)
    for worker in range(3):
        slot = RuntimeContext(rank=1, world_size=2, worker_id=worker, num_workers=3)
        assert [key for w, key in seen if w == worker] == list(plain.iter_context(slot))
    assert torch_worker_id() is None  # the trainer's own thread is no worker


def test_threads_hold_at_most_prefetch_factor_items_each(tars: list[str]) -> None:
    """Produced items never run further ahead of the trainer than the channels and the merge can hold."""
    workers, prefetch = 3, 2
    consumed = [0]
    ahead: list[int] = []
    produced = [0]
    lock = threading.Lock()

    def count(sample: dict[str, Any]) -> str:
        with lock:
            produced[0] += 1
            ahead.append(produced[0] - consumed[0])
        return str(sample["__key__"])

    ds = Dataset.from_source("tars", tars, daemon=None).map(count)
    for _ in TorchLoader(ds, num_workers=workers, workers="threads", prefetch_factor=prefetch):
        with lock:
            consumed[0] += 1
    # In each worker's channel, the one each worker is making, and what the merge holds for later turns.
    assert max(ahead) <= workers * prefetch + workers + workers
    assert consumed[0] == sum(ALL_KEYS.values())


def test_no_worker_thread_runs_after_the_loader_is_closed(tars: list[str]) -> None:
    built = loader(tars, "threads")
    it = iter(built)
    next(it)
    assert len(worker_threads()) == 2
    built.close()
    assert worker_threads() == []


def test_no_worker_thread_runs_after_an_unfinished_iterator_is_dropped(tars: list[str]) -> None:
    built = loader(tars, "threads")
    it = iter(built)
    next(it)
    del it, built
    gc.collect()
    assert worker_threads() == []


def test_no_worker_thread_runs_after_an_epoch_ends(tars: list[str]) -> None:
    assert sum(len(batch) for batch in loader(tars, "threads")) == sum(ALL_KEYS.values())
    assert worker_threads() == []


def test_an_error_in_a_worker_thread_reaches_the_trainer_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    built = TorchLoader(
        Dataset.from_source("jsonl", [str(path)], daemon=None), num_workers=2, workers="threads"
    )
    with pytest.raises(CorruptShardError, match="bad.jsonl") as raised:
        list(built)
    assert raised.value.shard is not None and str(path) in raised.value.shard  # its fields, not a rebuild
    assert any("worker thread" in note for note in getattr(raised.value, "__notes__", []))
    assert worker_threads() == []


def test_the_stats_count_the_worker_threads_stage_times(tars: list[str]) -> None:
    built = loader(tars, "threads")
    for _ in built:
        pass
    stats = built.stats()
    assert stats.workers == 2
    assert "read" in str(stats)


def test_pin_memory_pins_every_item_on_its_own_thread_in_the_rotations_order(
    tars: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No accelerator here: torch's pinning is replaced by one recording where it ran (the rest is real)."""
    import shardcache.loader.threads as threads

    pinned_on: list[str] = []

    def fake_pinner(device: str) -> Any:
        def pin(payload: Any) -> Any:
            pinned_on.append(threading.current_thread().name)
            return ("pinned", payload)

        return pin

    def batches(**kwargs: Any) -> list[Any]:
        ds = Dataset.from_source("tars", tars, daemon=None).map(key_of)
        return list(
            TorchLoader(ds, num_workers=2, batch_size=2, collate_fn=identity, workers="threads", **kwargs)
        )

    reference = batches()
    monkeypatch.setattr(threads, "pinner", fake_pinner)
    assert batches(pin_memory=True) == [("pinned", batch) for batch in reference]
    assert set(pinned_on) == {"shardcache-pin-memory"}
    assert worker_threads() == []


def test_pin_memory_hands_over_every_batch(tars: list[str]) -> None:
    import torch

    ds = Dataset.from_source("tars", tars, daemon=None).map(lambda s: torch.tensor([len(s["__key__"])]))
    batches = list(TorchLoader(ds, num_workers=2, batch_size=4, workers="threads", pin_memory=True))
    assert sum(len(b) for b in batches) == sum(ALL_KEYS.values())
    if torch.cuda.is_available():
        assert all(b.is_pinned() for b in batches)


def test_threads_refuse_a_plain_iterable_naming_processes() -> None:
    with pytest.raises(ConfigError, match="workers='processes'"):
        TorchLoader(range(4), num_workers=2, workers="threads")


def test_threads_refuse_an_argument_they_cannot_honour_naming_it(tars: list[str]) -> None:
    ds = Dataset.from_source("tars", tars, daemon=None)
    with pytest.raises(ConfigError, match="sampler"):
        TorchLoader(ds, num_workers=2, workers="threads", sampler=[0])


def test_an_unknown_mode_is_refused_naming_the_modes(tars: list[str]) -> None:
    with pytest.raises(ConfigError, match="'processes', 'threads'"):
        TorchLoader(Dataset.from_source("tars", tars, daemon=None), num_workers=2, workers="fibers")


def test_worker_init_fn_runs_on_each_worker_thread(tars: list[str]) -> None:
    started: list[tuple[int, int | None]] = []
    ds = Dataset.from_source("tars", tars, daemon=None)
    built = TorchLoader(
        ds, num_workers=3, workers="threads", worker_init_fn=lambda w: started.append((w, torch_worker_id()))
    )
    assert sum(1 for _ in built) == sum(ALL_KEYS.values())
    assert sorted(started) == [(0, 0), (1, 1), (2, 2)]


# -- forks ---------------------------------------------------------------------------------------------------

# A lock a stage holds while it works, as an import or a library holds its own: a child forked while a worker
# thread held it would wait on it for ever.
STAGE_LOCK = threading.Lock()


def hold_stage_lock(sample: dict[str, Any]) -> str:
    with STAGE_LOCK:
        threading.Event().wait(0.002)  # work done while holding the lock
        return str(sample["__key__"])


def take_stage_lock(result: Any) -> None:
    result.put(STAGE_LOCK.acquire(timeout=5))


def test_a_fork_while_worker_threads_read_inherits_no_lock_they_hold(tmp_path: Path) -> None:
    tars = make_tars(tmp_path / "long", count=4, samples=400)
    ds = Dataset.from_source("tars", tars, daemon=None).map(hold_stage_lock)
    it = iter(TorchLoader(ds, num_workers=4, workers="threads"))
    fork = multiprocessing.get_context("fork")
    try:
        for _ in range(5):  # forks in the middle of the epoch, each while every worker thread is busy
            for _ in range(50):
                next(it)
            result = fork.SimpleQueue()
            child = fork.Process(target=take_stage_lock, args=(result,))
            child.start()
            child.join(DEADLINE_S)
            assert child.exitcode == 0 and result.get() is True, "the child inherited a held stage lock"
    finally:
        it.close()
    assert worker_threads() == []


def test_a_plain_dataloader_forked_while_worker_threads_read_finishes(tars: list[str]) -> None:
    """A framework that starts its own DataLoader workers (fork) while the training loader's threads read."""
    it = iter(loader(tars, "threads"))
    next(it)
    validation: Any = Dataset.from_source("tars", tars, daemon=None).map(key_of)
    plain = torch_data.DataLoader(validation, num_workers=2, batch_size=None)
    assert Counter(plain) == ALL_KEYS
    assert sum(len(batch) for batch in it) > 0
    wait_for(lambda: worker_threads() == [], "the worker threads to end", DEADLINE_S)


def test_the_environment_variable_sets_the_default_mode(
    tars: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDCACHE_LOADER_WORKERS", "threads")
    ds = Dataset.from_source("tars", tars, daemon=None)
    assert TorchLoader(ds, num_workers=2).workers == "threads"
    assert TorchLoader(ds, num_workers=2, workers="processes").workers == "processes", "the argument wins"
    monkeypatch.setenv("SHARDCACHE_LOADER_WORKERS", "fibers")
    with pytest.raises(ConfigError, match="SHARDCACHE_LOADER_WORKERS='fibers'"):
        TorchLoader(ds, num_workers=2)


def test_timeout_names_the_worker_thread_it_waited_for(tars: list[str]) -> None:
    def hold(sample: dict[str, Any]) -> str:
        if torch_worker_id() == 0:
            threading.Event().wait(1.0)  # worker 0 takes 1 s per sample, past the 0.2 s timeout
        return str(sample["__key__"])

    ds = Dataset.from_source("tars", tars, daemon=None).map(hold)
    it = iter(TorchLoader(ds, num_workers=2, workers="threads", timeout=0.2))
    with pytest.raises(RuntimeError, match="timed out after 0.2 seconds waiting for worker thread 0"):
        next(it)
    it.close()  # the failed pass stopped its threads, each after its current sample
    assert worker_threads() == []
