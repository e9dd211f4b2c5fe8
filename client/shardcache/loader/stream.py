"""What a TorchLoader's DataLoader workers iterate, and how they start each epoch.

Each worker iterates its own slot of the pipeline through `WorkerStream`, which yields
``(worker_id, payload, state_after_payload, done, times)``: the payload is one sample or one worker-side
batch, the state is the worker's pipeline position after it, a final ``done`` item says the worker's stream
has ended, and ``times`` is the worker's running `StageTimes` now and then (None in between; see
`shardcache.pipeline.stage_times.TimesOutbox`): how its stage times reach the trainer's `stats()` and
telemetry. The main process merges the workers' items in its own rotation (`shardcache.loader.merge`).
Resuming passes each worker its state (an `EpochOrder`) through the wrapped dataset before the DataLoader
iterator is created; a worker loads it when it starts.

Persistent workers (`persistent_workers=True`, the default with workers): one DataLoader serves every
epoch, so its workers start once. What changes between epochs (the epoch, the workers' start states, the
exhausted workers, the counts the main process took: an `EpochOrder`) reaches them through a file in the
loader's run directory, written before the DataLoader is asked for the epoch's iterator: torch then sends
each worker a resume message, and the worker's next `iter()` over `WorkerStream` reads the order. A file,
not a queue: it works under every start method and needs no feeder thread in the trainer.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import pickle
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar, cast

# torch's worker loop seeds numpy.random: imported here, in the trainer, never first in a forked worker.
import numpy.random  # noqa: F401

from shardcache.context import torch_worker_id
from shardcache.dataset import Dataset
from shardcache.loader.fork_memory import frozen_for_fork
from shardcache.loader.ring import RingReader, RingWriter, private_collate
from shardcache.loader.watchdog import register_worker
from shardcache.node import State
from shardcache.pipeline.stage_times import StageTimes, TimesOutbox, timed_collate
from shardcache.sources.deal.counting import RunFacts

if TYPE_CHECKING:
    from torch.utils.data import DataLoader, IterableDataset

T = TypeVar("T")
logger = logging.getLogger(__name__)

Item = tuple[int, object, State | None, bool, StageTimes | None]


def passthrough(item: T) -> T:
    """The DataLoader's collate_fn over `WorkerStream`: workers already collated their payloads."""
    return item


@dataclass(frozen=True)
class EpochOrder:
    """What the workers need to know about one epoch's iteration (see the module).

    Attributes:
        epoch: The epoch fresh workers start at (None: the dataset's).
        states: Worker id -> pipeline state to resume from (absent: start fresh).
        exhausted: Workers whose stream had already ended; they yield nothing.
        facts: What the main process counted (`RunFacts`), for persistent workers started before it did.
    """

    epoch: int | None
    states: Mapping[int, State] = dataclass_field(default_factory=dict)
    exhausted: frozenset[int] = frozenset()
    facts: RunFacts | None = None


ORDER_FILE = "order.pickle"


def torch_data() -> ModuleType:
    """torch.utils.data, imported in the trainer's thread before any worker forks (`shardcache.forksafe`)."""
    try:
        import torch.utils.data as data
    except ImportError as exc:
        raise ImportError(
            "TorchLoader needs PyTorch: install the torch extra (pip install 'shardcache[torch]')"
        ) from exc
    return data


class WorkerStream:
    """What the DataLoader iterates in each worker (or in the main process with num_workers=0).

    Args:
        dataset: The pipeline; each worker iterates a private copy.
        batch_size: Worker-side batch size (None: one sample per payload).
        collate_fn: Worker-side collate (None: torch's default_collate for batches, samples as they are else).
        drop_last: Drop a worker's last incomplete batch.
        order: The epoch, start states and exhausted workers of this iteration.
        run_dir: The loader's run directory: workers register their stack dumps there (the stall
            watchdog) and, with `persistent`, read each epoch's order from it.
        persistent: Read the order from `run_dir` at every `iter()` (the workers outlive one epoch).
        ring: In a worker process, hand each payload's tensors and arrays over through the worker's shared-
            memory ring (`shardcache.loader.ring`; the trainer unpacks them).
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int | None,
        collate_fn: Callable[[Any], Any] | None,
        drop_last: bool,
        order: EpochOrder,
        run_dir: str | None = None,
        persistent: bool = False,
        ring: bool = False,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self.order = order
        self.run_dir = run_dir
        self.persistent = persistent
        self.ring = ring
        self._ring_writer: RingWriter | None = None  # made in the worker process, kept across its epochs

    def _writer(self) -> RingWriter:
        writer = self._ring_writer
        if writer is None or writer.pid != os.getpid():  # a fresh worker: the trainer's copy is not its own
            writer = self._ring_writer = RingWriter()
        return writer

    def resumed(self, states: Mapping[int, State], exhausted: frozenset[int]) -> EpochOrder:
        """This stream's order with the workers' positions `states` and the `exhausted` workers: what
        workers started now read. The order's own states start workers that have no position yet (an
        elastic resume hands every new worker the same start state); a worker's own position, once it has
        one, wins."""
        order = self.order
        return EpochOrder(order.epoch, {**order.states, **states}, exhausted, self.dataset.run_facts)

    def with_order(self, order: EpochOrder, run_dir: str | None) -> WorkerStream:
        """The same stream reading `order`, its workers registered in `run_dir` (None: not registered)."""
        return WorkerStream(
            self.dataset, self.batch_size, self.collate_fn, self.drop_last, order, run_dir, ring=self.ring
        )

    def _current_order(self) -> EpochOrder:
        if not self.persistent or self.run_dir is None:
            return self.order
        order: EpochOrder = pickle.loads((Path(self.run_dir) / ORDER_FILE).read_bytes())
        return order

    def __iter__(self) -> Iterator[Item]:
        # torch is imported by TorchLoader in the trainer's main thread (fork safety: see
        # `shardcache.forksafe`); here it is already loaded, in every worker.
        import torch.utils.data as data

        # A worker process, or a thread running as one (`shardcache.loader.threads`); None: no workers.
        worker = torch_worker_id()
        wid = 0 if worker is None else worker
        if worker is not None and self.run_dir is not None:
            register_worker(self.run_dir, wid)
        # Only worker processes have a run dir (threads hand their batches over as they are).
        ring = self._writer() if self.ring and worker is not None and self.run_dir is not None else None
        pack = ring.pack if ring is not None else passthrough
        if ring is not None:
            ring.reclaim()  # batches of an earlier pass that the DataLoader dropped
        order = self._current_order()
        if wid in order.exhausted:
            return
        # A private copy: the caller's keeps its state; counts from the order when the main process sent them.
        source = self.dataset
        facts = source.run_facts if order.facts is None else order.facts
        ds = Dataset(dataclasses.replace(source.spec, facts=facts), epoch=source.epoch)
        if order.epoch is not None:
            ds.set_epoch(order.epoch)
        state = order.states.get(wid)
        if state is not None:
            ds.load_state_dict(state)
        iterator = ds.iter_context(None)
        snapshot, outbox = iterator.position, TimesOutbox(iterator.clock)
        try:
            size = self.batch_size
            if size is None:
                # Without a collate_fn samples pass as they are (numpy stays numpy), as in mvp-dataset.
                convert = self.collate_fn
                if convert is not None:
                    convert = timed_collate(iterator.clock, convert)
                for sample in iterator:
                    payload = sample if convert is None else convert(sample)
                    yield wid, pack(payload), snapshot(), False, outbox.due()
            else:
                default = private_collate if ring is not None else data.default_collate
                collate = self.collate_fn if self.collate_fn is not None else default
                collate = timed_collate(iterator.clock, collate)
                batch: list[object] = []
                for sample in iterator:
                    batch.append(sample)
                    if len(batch) == size:
                        yield wid, pack(collate(batch)), snapshot(), False, outbox.due()
                        batch = []
                if batch and not self.drop_last:
                    yield wid, pack(collate(batch)), snapshot(), False, outbox.due()
            yield wid, None, snapshot(), True, outbox.last()
        finally:
            iterator.close()


class WorkerLauncher:
    """Starts the workers over `stream` for one iteration, resuming the given workers' states.

    Without persistent workers, each iteration builds a DataLoader (its workers start and stop with it).
    With them, the first iteration builds it and later ones reuse it: the epoch's order goes to the live
    workers through the run directory (see the module). The launcher holds no reference back to the
    TorchLoader.
    """

    def __init__(
        self,
        stream: WorkerStream,
        num_workers: int,
        loader_kwargs: dict[str, Any],
        home: WorkerHome | None = None,
    ) -> None:
        self.stream = stream
        self.num_workers = num_workers
        self.loader_kwargs = loader_kwargs
        self.home = home

    def __call__(self, states: dict[int, State], exhausted: frozenset[int]) -> Iterator[Item]:
        base = self.stream
        order = base.resumed(states, exhausted)
        home = self.home
        if home is not None and home.persistent:
            loader = home.loader_for(base, order, self.num_workers, self.loader_kwargs)
            reader = home.ring_reader  # persistent workers keep their rings across epochs
        else:
            loader = _dataloader(base.with_order(order, base.run_dir), self.num_workers, self.loader_kwargs)
            reader = RingReader()
        with frozen_for_fork():  # iter() forks the workers (the first time, when they persist)
            items = iter(loader)
        return reader.unpack_items(items) if base.ring and self.num_workers > 0 else items


def _dataloader(stream: WorkerStream, num_workers: int, loader_kwargs: dict[str, Any]) -> DataLoader[object]:
    import torch.utils.data as data

    if not isinstance(stream, data.IterableDataset):
        data.IterableDataset.register(WorkerStream)
    # WorkerStream is an IterableDataset by registration (torch is imported lazily); mypy cannot see it.
    dataset = cast("IterableDataset[object]", stream)
    return data.DataLoader(
        dataset, num_workers=num_workers, batch_size=None, collate_fn=passthrough, **loader_kwargs
    )


class WorkerHome:
    """The run directory of a TorchLoader's workers and, when they persist, the DataLoader kept across epochs.

    Held by the TorchLoader and by each of its iterators (through the launcher), so an iteration outlives a
    loader dropped after `iter()`. When the last holder goes, the DataLoader goes with it (torch stops its
    workers) and the directory is removed; `close()` does both at once.
    """

    def __init__(self, persistent: bool) -> None:
        remove_dead_run_dirs(Path(tempfile.gettempdir()))
        self.run_dir = tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-")
        # Held for the home's life (and by forked workers, who inherit it): a run dir whose owner lock is
        # free belongs to a process that is gone, killed before its finalizer could remove it.
        owner = _held_owner_lock(Path(self.run_dir))
        self.persistent = persistent
        self.dataloader: DataLoader[object] | None = None
        self.ring_reader = RingReader()
        self._finalizer = weakref.finalize(self, _remove_run_dir, self.run_dir, os.getpid(), owner)

    def loader_for(
        self, base: WorkerStream, order: EpochOrder, num_workers: int, loader_kwargs: dict[str, Any]
    ) -> DataLoader[object]:
        """The persistent DataLoader, `order` written where its workers read it at their next `iter()`."""
        path = Path(self.run_dir) / ORDER_FILE
        temp = path.with_suffix(".tmp")
        temp.write_bytes(pickle.dumps(order))
        temp.replace(path)  # atomic: a worker never reads half an order
        if self.dataloader is None:
            stream = WorkerStream(
                base.dataset,
                base.batch_size,
                base.collate_fn,
                base.drop_last,
                order,
                self.run_dir,
                True,
                ring=base.ring,
            )
            self.dataloader = _dataloader(stream, num_workers, {**loader_kwargs, "persistent_workers": True})
        return self.dataloader

    def close(self) -> None:
        """Stop the persistent workers now and remove the run directory."""
        loader, self.dataloader = self.dataloader, None
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None:
            iterator._shutdown_workers()
        self._finalizer()


def _held_owner_lock(run_dir: Path) -> int:
    """Create `run_dir`'s owner lock already held; its open descriptor.

    The lock is made and taken under another name, then renamed into place: created in place, it would be
    free between `open` and `flock`, and another trainer's `remove_dead_run_dirs` that looked in that
    moment would take this live loader's directory for a dead one and remove it (the loader then fails on
    its missing order file). Before the rename the directory has no lock, which that sweep leaves alone.
    """
    temp = run_dir / f"{OWNER_LOCK}.new"
    owner = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(owner, fcntl.LOCK_EX)
    os.replace(temp, run_dir / OWNER_LOCK)
    return owner


def _remove_run_dir(run_dir: str, owner_pid: int, owner_fd: int) -> None:
    if os.getpid() == owner_pid:  # a forked worker's copy of the trainer's objects owns nothing on disk
        shutil.rmtree(run_dir, ignore_errors=True)
        os.close(owner_fd)


RUN_DIR_PREFIX = "shardcache-loader-"  # then the owner's pid, for people reading $TMPDIR
OWNER_LOCK = ".owner.lock"
_UNOWNED_GRACE_S = 3600.0  # a run dir without an owner lock (made before locks, or being made) is kept


def remove_dead_run_dirs(tmp: Path) -> int:
    """Remove the run dirs in `tmp` whose TorchLoader is gone (killed: no finalizer ran); returns how many.

    Liveness is the owner's `flock`, not its pid: a pid is reused, and another container sharing $TMPDIR
    has its own pid namespace. Only directories are looked at, never followed through a link.
    """
    removed = 0
    for entry in tmp.glob(f"{RUN_DIR_PREFIX}*"):
        try:
            if not entry.is_dir() or entry.is_symlink():
                continue
            try:
                fd = os.open(entry / OWNER_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError:
                if time.time() - entry.stat().st_mtime > _UNOWNED_GRACE_S:
                    shutil.rmtree(entry, ignore_errors=True)
                    removed += 1
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its loader (or one of its forked workers) is alive
            finally:
                os.close(fd)
        except OSError as exc:  # another user's directory, or removed meanwhile
            logger.debug("leaving %s: %s", entry, exc)
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed += 1
    if removed:
        logger.info("removed %d run directories of TorchLoaders that are gone from %s", removed, tmp)
    return removed
