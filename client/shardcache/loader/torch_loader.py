"""`TorchLoader`: a torch DataLoader over a Dataset, plus post-merge stages run in the main process.

Recommended pattern: workers emit micro-batches (`batch_size=32, collate_fn=lambda x: x`), then `.unbatch()`,
a loader-side `.shuffle(...)` that mixes samples across workers, optional `.assemble(...)`, and `.batch(...)`.
Resume states (identity, checks, the workers' start states) are `shardcache.loader.resume`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from shardcache.context import RuntimeContext
from shardcache.daemon_access.telemetry import Telemetry, for_reader, items_are_batches
from shardcache.dataset import Dataset
from shardcache.errors import ConfigError, LengthUnknown, UnsupportedResume, positive_int
from shardcache.frameworks import called_by_accelerate_skip, called_by_lightning
from shardcache.loader.iterator import LoaderIterator, PlainIterator, merge_of
from shardcache.loader.merge import MergeNode
from shardcache.loader.plain import PlainNode, PlainStream
from shardcache.loader.resume import (
    LoaderShape,
    check_loaded,
    header,
    initial_state,
    items_before,
    resume_start,
)
from shardcache.loader.stream import (
    EpochOrder,
    Item,
    WorkerHome,
    WorkerLauncher,
    WorkerStream,
    torch_data,
)
from shardcache.loader.threads import ThreadLauncher, thread_options, worker_mode
from shardcache.loader.watchdog import (
    _UNSET,
    StallWatchdog,
    describe_stall,
    describe_thread_stall,
    stall_warning,
)
from shardcache.node import Node, state_of
from shardcache.pipeline.length import Batching, Reader, pass_length
from shardcache.pipeline.stage_times import (
    LOADER_PREFIX,
    StageClock,
    StageStats,
    part_seconds,
    stage_times_enabled,
    timed_stages,
)
from shardcache.resume.job import job_state
from shardcache.resume.state import LiveState, StateDict, ended_epoch, public
from shardcache.sources.deal.schedule import source_job
from shardcache.stages import Stage, builders

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

logger = logging.getLogger(__name__)
# DataLoader arguments torch refuses without worker processes (mvp-dataset passes the same three only with
# workers); dropped (with a debug line) when num_workers=0, so one set of arguments serves both.
_WORKER_ONLY_KWARGS = ("prefetch_factor", "persistent_workers", "multiprocessing_context")
# "rank": state_dict() is this rank's own position; "job": every rank's, gathered (`shardcache.resume.job`).
STATE_SCOPES = ("rank", "job")


def _check_scope(name: str, scope: str) -> None:
    if scope not in STATE_SCOPES:
        raise ConfigError(f"{name}={scope!r}: expected one of {STATE_SCOPES}")


class TorchLoader:
    """A `torch.utils.data.DataLoader` over `dataset`, with loader-side stages in the main process.

    Iteration is resumable: `state_dict()` after any item, `load_state_dict(state)` on a fresh TorchLoader
    built the same way (same dataset, stages, batch size and num_workers; same ranks), and the next
    iteration yields exactly what the uninterrupted one would have yielded next. The main process merges
    the workers in a fixed rotation (see `shardcache.loader.merge`), so the order of items does not
    depend on worker timing. A resume restarts the workers at their saved positions; loader-side shuffle
    and assemble restart them a little earlier and re-read up to their checkpoint (see their modules: an
    assembler without its own state re-reads from the epoch start).

    Args:
        dataset: The pipeline each worker iterates (its slot comes from rank and worker id). Any other
            iterable is accepted as mvp-dataset does: every worker iterates all of it (torch's
            IterableDataset rule: split it by `torch.utils.data.get_worker_info()` yourself), the
            loader-side stages run in a context from `RuntimeContext.from_runtime()` (or the iterable's
            own `context`), and it does not resume (`state_dict()` raises UnsupportedResume).
        num_workers: Workers, each reading its own slot (0: iterate in the main process).
        batch_size: Worker-side batch size (None: samples pass one by one).
        collate_fn: Worker-side collate function (`lambda x: x` keeps lists of samples); None means torch's
            `default_collate` for batches, and samples as they are without a batch size (numpy arrays stay
            numpy, as in mvp-dataset; a plain DataLoader would make them tensors).
        workers: How the workers run (default: `SHARDCACHE_LOADER_WORKERS`, else "processes").
            "processes": torch DataLoader worker processes; every batch crosses to the trainer through
            shared memory (`shared_ring`). "threads": threads of the trainer's process
            (`shardcache.loader.threads`); batches reach the training loop as built, with no copy, and no
            process starts.
            Threads win where the stages release the GIL (reading, image decode, numpy and torch
            operations); a stage that holds it (a pure-Python loop per sample) runs one thread at a time:
            keep processes for those (docs/loader.md). The same slots, order and resume states in both modes
            (a state taken in one resumes in the other). Threads honour prefetch_factor, pin_memory (on a
            thread of its own), pin_memory_device, timeout and worker_init_fn (called on each worker thread);
            they share the process, so a stage's globals (random generators, caches) are shared too.
        shared_ring: Worker processes hand their batches' tensors and numpy arrays over through a
            shared-memory ring each worker allocates once (`shardcache.loader.ring`): one copy per batch, no
            new segment or descriptor per batch. Off (False) it is torch's own path; with pin_memory=True
            it is off (pinning copies each batch anyway). Thread workers need neither.
        stall_warning_s: Seconds the main process may wait for an item before one warning names the
            worker it waits for and where every worker is (`shardcache.loader.watchdog`); 0 or None turns
            it off. Default: `SHARDCACHE_STALL_WARNING_S`, else 300.
        **loader_kwargs: Any other DataLoader argument (pin_memory, prefetch_factor, persistent_workers,
            multiprocessing_context, drop_last for worker-side batches, ...). `persistent_workers`
            defaults to True with workers: they start once and serve every epoch (the new epoch and any
            resume state reach them; `bench/bench_worker_start.py` measures what a restart per epoch
            costs); `close()` stops them, as does dropping the loader. Arguments torch refuses without
            workers (prefetch_factor, persistent_workers, multiprocessing_context) are ignored when
            num_workers=0. Workers start with torch's default method (fork on Linux), which is safe with
            the daemon (`shardcache.forksafe`). Lance is not fork-safe: when workers read lance data (a
            lance source or a `.cache()`) in a process that already imported lance, pass
            multiprocessing_context="forkserver" or "spawn" (the pipeline pickles).

    Example:
        >>> loader = (TorchLoader(ds, num_workers=8, batch_size=32, collate_fn=lambda x: x)  # doctest: +SKIP
        ...           .unbatch().shuffle(4096).batch(64))
        >>> for step, batch in enumerate(loader):  # doctest: +SKIP
        ...     if step % 1000 == 0:
        ...         save({"model": ..., "data": loader.state_dict()})
    """

    def __init__(
        self,
        dataset: Dataset | Iterable[Any],
        num_workers: int = 0,
        batch_size: int | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        *,
        workers: str | None = None,
        shared_ring: bool = True,
        stall_warning_s: float | None | object = _UNSET,
        state_scope: str = "rank",
        _stages: Sequence[Stage] = (),
        **loader_kwargs: Any,
    ) -> None:
        torch_data()
        if not isinstance(dataset, (Dataset, Iterable)):
            raise ConfigError(f"dataset={dataset!r}: expected a shardcache.Dataset or an iterable")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ConfigError(f"num_workers={num_workers!r}: expected an integer >= 0")
        if batch_size is not None:
            positive_int("batch_size", batch_size)
        _check_scope("state_scope", state_scope)
        workers = worker_mode(workers)
        if workers == "threads" and not isinstance(dataset, Dataset) and num_workers > 0:
            raise ConfigError(
                "TorchLoader(workers='threads') runs a shardcache.Dataset's slots on threads; a plain "
                "iterable splits itself by torch.utils.data.get_worker_info(), which threads do not set: "
                "use workers='processes' (the default) for it"
            )
        # A plain iterable: only `__iter__` and `set_epoch` look at it, through `_plain` and `_pipeline()`.
        self.dataset = cast(Dataset, dataset)
        self._plain: Iterable[Any] | None = None if isinstance(dataset, Dataset) else dataset
        self.num_workers = num_workers
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.loader_kwargs = loader_kwargs
        self.stall_warning_s = stall_warning(stall_warning_s)
        self.stages: tuple[Stage, ...] = tuple(_stages)
        self.state_scope = state_scope
        self.workers = workers
        self.shared_ring = shared_ring
        self._live = LiveState()
        # Set by a framework integration (`checkpoint_with`): items its loop fetched ahead of the step it
        # checkpoints, and how many positions back the iterator keeps for it.
        self._fetched_ahead: Callable[[], int] | None = None
        self._keep_positions = 0
        # Set by an integration whose framework numbers epochs wrongly (the Hugging Face Trainer restarts its
        # count at 0 on a resume without a length): set_epoch is then ignored, passes and states count.
        self.own_epochs = False
        # Threads start in microseconds: they are started each iteration, never kept.
        processes = num_workers > 0 and workers == "processes"
        self.persistent_workers = processes and bool(loader_kwargs.get("persistent_workers", True))
        # Refused now, not at the first iteration: arguments thread workers cannot honour.
        self._thread_options = thread_options(self._dataloader_kwargs()) if workers == "threads" else None
        # Made at the first iteration with workers: their run directory and, when they persist, the
        # DataLoader kept across epochs (`WorkerHome`).
        self._home: WorkerHome | None = None
        # The latest length `len()` answered, with what it was for (`Reader.key`): a pass that has yielded
        # that many items has ended, whether or not its consumer asks for one more (see `__iter__`).
        self._asked_length: tuple[tuple[object, ...], int] | None = None

    def _add(self, stage: Stage) -> TorchLoader:
        return TorchLoader(
            self.dataset,
            self.num_workers,
            self.batch_size,
            self.collate_fn,
            workers=self.workers,
            shared_ring=self.shared_ring,
            stall_warning_s=self.stall_warning_s,
            state_scope=self.state_scope,
            _stages=(*self.stages, stage),
            **self.loader_kwargs,
        )

    def map(self, fn: Callable[[Any], Any]) -> TorchLoader:
        """Apply `fn` to every item in the main process."""
        return self._add(builders.map_stage(fn))

    def unbatch(self) -> TorchLoader:
        """Flatten the workers' batches into samples."""
        return self._add(builders.unbatch_stage())

    def shuffle(self, buffer_size: int, initial: int | None = None, seed: int | None = None) -> TorchLoader:
        """Shuffle across workers; seeded from the dataset's context (TP co-members agree) unless `seed`."""
        return self._add(builders.shuffle_stage(buffer_size, initial, seed))

    def assemble(self, factory: Callable[[RuntimeContext], Any], drop_last: bool = False) -> TorchLoader:
        """Assemble in the main process; `factory` receives the dataset's resolved context."""
        return self._add(builders.assemble_stage(factory, drop_last))

    def batch(
        self, batch_size: int, drop_last: bool = False, collate_fn: Callable[[list[Any]], Any] | None = None
    ) -> TorchLoader:
        """Batch in the main process."""
        return self._add(builders.batch_stage(batch_size, drop_last, collate_fn))

    def set_epoch(self, epoch: int) -> None:
        """Read `epoch` in every pass until the next `set_epoch` (without it, each new pass reads the epoch
        after the previous pass's: `shardcache.epochs`). Ignored under `own_epochs`."""
        if self.own_epochs:
            logger.debug("TorchLoader.set_epoch(%r) ignored: this loader counts its own epochs", epoch)
            return
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if not callable(set_epoch):
            raise ConfigError(f"TorchLoader.set_epoch: the dataset {self.dataset!r} has no set_epoch")
        set_epoch(epoch)

    def close(self) -> None:
        """Stop the persistent workers now and end the current iteration (the next one starts anew)."""
        # The closed iterator stays the latest one: state_dict() still answers after close(), and the next
        # iteration starts at the loader's epoch as after any other (not from the closed one's state).
        iterator = self._live.iterator
        if isinstance(iterator, LoaderIterator):
            iterator.close()
        home, self._home = self._home, None
        if home is not None:
            home.close()

    def __len__(self) -> int:
        """The items one pass yields on this rank: its steps per epoch (batches, with a `batch_size` or a
        loader-side `.batch()`). Known when every shard's sample count is known (manifests, parquet,
        Lance, `Dataset.count_samples`) and `even=` fixes each rank's share: then the same in every epoch
        (`shardcache.pipeline.length`).

        Raises:
            LengthUnknown: (a TypeError) the length is not known before reading; the message says why and
                how to get one (frameworks then treat the loader as one without a length).
        """
        if self._plain is not None:
            raise LengthUnknown(
                f"a TorchLoader over {type(self._plain).__name__} has no length: only a shardcache.Dataset "
                "knows its passes' lengths"
            )
        reader = self._reader()
        length = pass_length(self.dataset.spec, reader)
        self._asked_length = (reader.key(), length)
        return length

    def __bool__(self) -> bool:
        # A loader is an object, not a container: without this, `if loader:` would ask `__len__`.
        return True

    def _reader(self) -> Reader:
        """Who reads a pass of this loader, for its length: this rank, its workers and their batching."""
        size = self.batch_size
        batching = None if size is None else Batching(size, bool(self.loader_kwargs.get("drop_last", False)))
        return Reader(self.dataset.resolve_context(), self.num_workers, batching, self.stages)

    def __getattr__(self, name: str) -> Any:
        # Only for attributes a TorchLoader does not have. The Hugging Face Trainer resumes a loader it did
        # not prepare by rebuilding it from DataLoader attributes (Accelerate's `skip_first_batches`):
        # refuse that replay loudly, as Lightning's path does, rather than fail on a missing attribute.
        if not name.startswith("__") and called_by_accelerate_skip():
            raise ConfigError(
                "Accelerate's skip_first_batches is replaying a TorchLoader (the Hugging Face Trainer's "
                "resume_from_checkpoint without shardcache.transformers.ShardcacheCallback): it would "
                "rebuild the loader and replay the wrong epoch. Add ShardcacheCallback() to "
                "Trainer(callbacks=[...]): it saves the loader's position with each checkpoint and resumes "
                "from it (docs/frameworks.md)",
                code="UnsupportedResume",
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def stats(self) -> StageStats:
        """Where the latest iteration's time went: reading, each worker-side stage and collation (summed
        over the workers; `shardcache.pipeline.stage_times`), and the share of the trainer's time spent
        waiting for batches. `str()` reads "read 4%, map[0] decode 71%, collate 6%; trainer waited 38%".
        Empty before the first iteration; without stage times (`SHARDCACHE_STAGE_TIMES=0`) only the wait.
        """
        iterator = self._live.iterator
        return iterator.stats() if isinstance(iterator, LoaderIterator) else StageStats()

    # -- resume ---------------------------------------------------------------------------------------------

    def _pipeline(self) -> Dataset:
        """The shardcache Dataset; UnsupportedResume for a plain iterable, which has no state."""
        if self._plain is not None:
            raise UnsupportedResume(
                f"TorchLoader dataset does not implement identity(): over {type(self._plain).__name__}, "
                "only a shardcache.Dataset resumes (state_dict/load_state_dict); build the pipeline with "
                "Dataset.from_source"
            )
        return self.dataset

    def _shape(self) -> LoaderShape:
        """What this loader's states identify it by (`shardcache.loader.resume`)."""
        return LoaderShape(
            self._pipeline().spec,
            self.num_workers,
            self.batch_size,
            self.collate_fn,
            bool(self.loader_kwargs.get("drop_last", False)),
            self.stages,
        )

    def fingerprint(self) -> str:
        """A stable hash of the dataset, the worker-side batching and the loader-side stages."""
        return self._shape().fingerprint()

    def state_dict(self) -> StateDict:
        """The resume envelope (version, identity, state) of the most recent iteration, else of the state
        loaded and not yet used. Its ``state`` is None before any iteration and once the iteration is
        exhausted: loading it starts the next pass from the beginning.

        With ``state_scope="job"`` it is every data-parallel rank's position in one state
        (`shardcache.resume.job`), which any rank loads: a collective, so every rank calls it at the same
        step (Lightning and Accelerate's `save_state` do). Over an evaluation dataset
        (`Dataset.for_evaluation`) the state always starts the next pass from the beginning.

        Raises:
            ConfigError: Lightning asks for a mid-epoch state without
                `shardcache.lightning.ShardcacheCallback` (the state would serve rank 0 only and, for a
                loader without a length, count a batch Lightning fetched ahead).
        """
        shape = self._shape()
        if self.dataset.evaluation:  # each pass reads the whole set: no position, and no collective
            return public(initial_state(shape, self.dataset.resolve_context()))
        iterator = self._live.iterator
        ahead = 0 if self._fetched_ahead is None else self._fetched_ahead()
        if ahead > 0 and isinstance(iterator, LoaderIterator):
            state = iterator.state_dict(behind=ahead)
        else:
            state = self._live.state_dict(
                lambda: public(initial_state(shape, self.dataset.resolve_context()))
            )
        if self._fetched_ahead is None and state.get("state") is not None and called_by_lightning():
            raise ConfigError(
                "Lightning is checkpointing this TorchLoader in the middle of an epoch: add "
                "shardcache.lightning.ShardcacheCallback() to Trainer(callbacks=[...]). Lightning keeps rank "
                "0's loader state only, and fetches one batch ahead of the step it saves when the loader has "
                "no length, so without it other ranks could not resume and the resumed run could skip a "
                "batch (docs/frameworks.md)"
            )
        return job_state(state) if self.state_scope == "job" else state

    def checkpoint_with(self, fetched_ahead: Callable[[], int], keep: int = 1, scope: str = "job") -> None:
        """For framework integrations: `fetched_ahead()` says how many items the framework's loop took
        beyond the step it checkpoints (at most `keep`), so `state_dict()` names the position of that step;
        `scope` sets `state_scope`."""
        _check_scope("scope", scope)
        self._fetched_ahead, self._keep_positions, self.state_scope = fetched_ahead, keep, scope

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Make the next iteration resume from `state` (as taken by `state_dict()`, or a version-1 state).

        Raises:
            ResumeStateError: [ResumeIdentityMismatch] a state of another pipeline, batching or stage list,
                seed, num_workers or data-parallel layout; [InvalidResumeStateVersion]; [InvalidResumeState].
        """
        checked = check_loaded(self._shape(), state, self.dataset.resolve_context())
        if self.dataset.evaluation:  # an evaluation pass reads the whole set from the beginning
            return
        self._live.load(state, checked)
        after = ended_epoch(state)
        if after is not None:  # the saved pass had ended: the next one reads the epoch after it
            self.dataset.epoch_clock.advance_to(after + 1)

    # -- iteration ------------------------------------------------------------------------------------------

    def _telemetry(self, node: Node, ctx: RuntimeContext, clock: StageClock | None) -> Telemetry | None:
        """Wait time, samples, stage times (the workers' and the loader-side `clock`'s) and the workers'
        skipped shards for this rank, reported in the background."""
        spec = self.dataset.source
        job = source_job(spec.hints.job, spec.shards, ctx.seed)
        merge = merge_of(node)  # not the iterator: the count must not keep it alive (see LoaderIterator)
        # Samples, not items: the workers' items are batches with a batch_size or a worker-side .batch().
        worker_batching = (s.batches for s in self.dataset.stages)
        workers_batch = items_are_batches(worker_batching, self.batch_size is not None)
        batched = items_are_batches((s.batches for s in self.stages), workers_batch)
        return for_reader(
            spec.daemon,
            job,
            ctx.slot,
            lambda: 0 if merge is None else merge.skipped_shards,
            batched,
            stages=None if merge is None else lambda: part_seconds(merge.stage_times(), clock),
        )

    def _workers_home(self) -> WorkerHome | None:
        """The home of this loader's worker processes (made on first use; None without them)."""
        if self.num_workers == 0 or self._thread_options is not None:
            return None
        if self._home is None:
            self._home = WorkerHome(self.persistent_workers)
        return self._home

    def _dataloader_kwargs(self) -> dict[str, Any]:
        kwargs = dict(self.loader_kwargs)
        kwargs.pop("drop_last", None)
        kwargs.pop("persistent_workers", None)  # kept across epochs by this loader (`PersistentLoader`)
        if self.num_workers == 0:
            ignored = [name for name in _WORKER_ONLY_KWARGS if kwargs.pop(name, None) is not None]
            if ignored:
                logger.debug("TorchLoader(num_workers=0) ignores %s (they apply to workers)", ignored)
        return kwargs

    def __iter__(self) -> LoaderIterator:
        if self._plain is not None:
            return self._iter_plain(self._plain)
        ctx = self.dataset.resolve_context()
        # Counted once here, in the main process; the workers get the counts with the epoch's order.
        self.dataset.count_samples()
        shape = self._shape()
        pending, worker_states, ctx = resume_start(shape, self._live.take_pending(), ctx)
        # The epoch of this pass: the dataset's next one, or the loaded state's (`shardcache.epochs`).
        drop_last = bool(self.loader_kwargs.get("drop_last", False))
        home = self._workers_home()
        run_dir = None if home is None else home.run_dir
        order = EpochOrder(ctx.epoch, worker_states)
        ring = self.shared_ring and home is not None and not self.loader_kwargs.get("pin_memory", False)
        stream = WorkerStream(
            self.dataset, self.batch_size, self.collate_fn, drop_last, order, run_dir, ring=ring
        )
        # The launcher holds no reference back to this TorchLoader: an iterator dropped unfinished is then
        # freed (and its workers stopped, unless they persist) by reference counting, not by a later
        # garbage collection.
        launcher: Callable[[dict[int, Any], frozenset[int]], Iterator[Item]]
        if self._thread_options is not None and self.num_workers > 0:
            launcher = ThreadLauncher(stream, self.num_workers, self._thread_options)
        else:
            launcher = WorkerLauncher(stream, self.num_workers, self._dataloader_kwargs(), home)
        merge = MergeNode(launcher, self.num_workers)
        # Loader-side stages run in this process, inside the trainer's wait: timed apart from the workers'.
        clock = StageClock() if self.stages and stage_times_enabled() else None
        node: Node = merge if clock is None else clock.timed(merge, "workers", shown=False)
        node = timed_stages(node, self.stages, ctx, clock, prefix=LOADER_PREFIX)
        if pending is not None:
            node.load_state_dict(state_of(pending, "pipeline"))
        start = next(iter(worker_states.values()), None)
        origin = None if start is None else start["origin"]  # where an elastic resume started this epoch
        iterator = LoaderIterator(
            node,
            header(shape, ctx, origin),
            self._telemetry(node, ctx, clock),
            self._watchdog(merge, run_dir, launcher),
            ctx.identity(),
            clock,
            # Items of the epoch before this pass: unknown after an elastic resume (other ranks' items).
            items=None if worker_states else items_before(pending),
        )
        self._expect_length(iterator)
        iterator.keep_positions(self._keep_positions)
        # The pass counts once it yields: the next iter() reads the next epoch.
        iterator.on_first_item(self.dataset.epoch_clock.passed)
        # An evaluation pass left unfinished (Lightning's sanity check) held no position worth a warning.
        self._live.start(iterator, warn=not self.dataset.evaluation)
        return iterator

    def _expect_length(self, iterator: LoaderIterator) -> None:
        """Tell the pass its length, when `len()` answered it for this rank and layout: a framework that
        asked (Lightning, the Hugging Face Trainer) stops after that many items without asking for one more,
        and the pass has ended then (its state says so; the next pass reads the next epoch). Only a length
        already asked: working it out here could open a Lance dataset in the trainer before its workers
        fork."""
        asked = self._asked_length
        if asked is not None and asked[0] == self._reader().key():
            iterator.expect(asked[1])

    def _iter_plain(self, iterable: Iterable[Any]) -> LoaderIterator:
        """An iteration over a plain iterable: a DataLoader over it, then the loader-side stages."""
        own = getattr(iterable, "context", None)
        ctx = own if isinstance(own, RuntimeContext) else RuntimeContext.from_runtime()
        drop_last = bool(self.loader_kwargs.get("drop_last", False))
        stream = PlainStream(iterable, self.batch_size, self.collate_fn, drop_last)
        plain = PlainNode(stream, self.num_workers, self._dataloader_kwargs())
        node = timed_stages(plain, self.stages, ctx, None)
        iterator = PlainIterator(node, None)
        self._live.start(iterator, warn=True)
        return iterator

    def _watchdog(self, merge: MergeNode, run_dir: str | None, launcher: object) -> StallWatchdog | None:
        """The stall watchdog of one iteration (`shardcache.loader.watchdog`), None when turned off."""
        after = self.stall_warning_s
        if not after:
            return None
        workers = self.num_workers

        def describe(waited: float) -> str:
            arrived = dict(merge.arrived_at)
            if isinstance(launcher, ThreadLauncher):
                return describe_thread_stall(waited, after, merge.next_worker, arrived, launcher.threads())
            return describe_stall(waited, after, merge.next_worker, arrived, workers, run_dir)

        return StallWatchdog(after, lambda: merge.waiting_since, describe)

    def balance(
        self,
        drop_last: bool = True,
        dummy_factory: Callable[[RuntimeContext], Any] | None = None,
        buffer_size: int = 32,
        chunk_size: int = 16,
        max_transfer_per_round: int = 16,
        topology: str = "node",
        process_group: ProcessGroup | None = None,
        device_process_group: ProcessGroup | None = None,
    ) -> TorchLoader:
        """The same number of items on every data-parallel rank, resumable (`shardcache.stages.balance`)."""
        stage = builders.balance_stage(
            drop_last,
            dummy_factory,
            buffer_size,
            chunk_size,
            max_transfer_per_round,
            topology,
            process_group,
            device_process_group,
        )
        return self._add(stage)
