"""`Dataset`: the immutable, chainable pipeline facade (mvp-dataset's public API).

A Dataset is a `PipelineSpec` (`shardcache.spec`: root source, stages, the main process's facts)
plus its mutable side: the epoch of `set_epoch`, its latest iterator and a state to resume. Every method
that changes the pipeline returns a new Dataset over a new spec, made by the feature's spec-to-spec
function (`shardcache.pipeline.*`, `shardcache.snapshots`). Iterating resolves the runtime context
(explicit, else torch and environment) and starts one slot's pass (`shardcache.pipeline.iteration.start`),
whose `state_dict()` a trainer checkpoints (`shardcache.resume`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shardcache.context import RuntimeContext, in_main_process, torch_worker_id
from shardcache.daemon_access.telemetry import items_are_batches
from shardcache.epochs import EpochClock
from shardcache.errors import ConfigError
from shardcache.frameworks import accelerate_context, accelerate_dispatch_batch, as_one_process, length_asker
from shardcache.node import Node
from shardcache.pipeline import mini_epochs as chunks
from shardcache.pipeline import mixing, subsets
from shardcache.pipeline.build import build
from shardcache.pipeline.consume import Consumer, consume
from shardcache.pipeline.evaluation import EVALUATION_EPOCH, evaluation_spec
from shardcache.pipeline.from_source import source_pipeline
from shardcache.pipeline.iteration import PipelineIterator, start
from shardcache.pipeline.length import Batching, Reader, pass_length
from shardcache.pipeline.mixed import mixed_source
from shardcache.pipeline.stage_times import StageStats
from shardcache.resume.check import spec_parts
from shardcache.resume.point import check_loaded, initial_state
from shardcache.resume.state import LiveState, StateDict, ended_epoch, public
from shardcache.snapshots.boundary import cached
from shardcache.snapshots.snapshot import FingerprintProvider, snapshot
from shardcache.sources import SourceSpec
from shardcache.sources.deal.counting import RunFacts
from shardcache.sources.opener import DaemonSetting
from shardcache.spec import PipelineSpec
from shardcache.stages import Stage, builders
from shardcache.stages.resolve_ref import resolve_ref_stage

logger = logging.getLogger(__name__)


def _register_with_torch() -> None:
    # Dataset is a torch IterableDataset (so a plain DataLoader takes it) without importing torch here:
    # IterableDataset's metaclass is ABCMeta, so registering a virtual subclass suffices once torch is loaded.
    data = sys.modules.get("torch.utils.data")
    if data is not None and not issubclass(Dataset, data.IterableDataset):
        data.IterableDataset.register(Dataset)


class Dataset:
    """An immutable iterable pipeline over shards served by the node daemon.

    Example:
        >>> ds = Dataset.from_source("tars", "/data/shard_{000000..000127}.tar")  # doctest: +SKIP
        >>> ds = ds.shuffle(1024).map(decode)  # doctest: +SKIP
        >>> for sample in ds:  # doctest: +SKIP
        ...     train_step(sample)
    """

    def __init__(self, spec: PipelineSpec, *, epoch: int | None = None, evaluation: bool = False) -> None:
        self._spec = spec
        # The next pass's epoch, shared with DataLoader workers; an epoch given here is pinned.
        self._clock = EpochClock(epoch, pinned=epoch is not None)
        self._live = LiveState()
        self._evaluation = evaluation  # `for_evaluation`: one fixed pass, no position to resume
        _register_with_torch()

    def _derive(self, spec: PipelineSpec) -> Dataset:
        epoch = self._clock.next if self._clock.pinned else None
        return Dataset(spec, epoch=epoch, evaluation=self._evaluation)

    # -- construction ---------------------------------------------------------------------------------------

    @classmethod
    def from_source(
        cls,
        source_kind: str,
        shards: Any = None,
        *,
        context: RuntimeContext | None = None,
        daemon: DaemonSetting = "auto",
        **options: Any,
    ) -> Dataset:
        """A dataset reading `shards` of one kind: "tars" (or "tar"), "jsonl", "parquet" or "lance".

        Args:
            source_kind: The shard format.
            shards: A path or URL, a list, brace ranges, globs, or a `.jsonl` manifest.
            context: An explicit RuntimeContext, honoured at iteration time (else inferred from torch/env).
            daemon: "auto" (the node daemon, direct reads if none answers), "required", None (never use a
                daemon), a socket path, or a DaemonClient.
            **options: The kind's arguments: `resample`; `on_error` ("raise"|"skip": skip and count shards
                that are corrupt, missing or still failing after the daemon's retries; tars, jsonl,
                parquet); tars `sidecars`, `on_corrupt` ("raise"|"skip", corrupt shards only); jsonl
                `ref_fields`; parquet `columns`, `batch_size`, `use_threads`; lance `columns`,
                `batch_size`, `shuffle_mode` ("none"|"global"|"random_scan"), `storage_options` (for
                lance's object store; s3:// URIs get the endpoint, region and keys of the AWS
                environment), `even`. Every kind also takes the planning hints `job` (the daemon job id)
                and `plan_following` ((epoch, urls) groups read after this dataset); `mini_epochs` sets
                both, and neither changes the data or fingerprint. `immutable=True` says the shards are
                never rewritten in place: the daemon then serves its cached copies without checking them
                against the remote (by default a job's first reads are checked, see docs/reliability.md);
                it changes neither the data nor the fingerprint.
                Shard kinds (tars, jsonl, parquet) take the partitioning options (see
                `shardcache.sources.deal.partition` and docs/cluster.md): `placement` ("auto": "node" when the
                context spans several nodes, else "global"; "node": each node keeps a fixed share of the
                units across epochs, reshuffled among its ranks and workers every epoch; "global": a fresh
                global deal every epoch), `exchange` (a fraction of each node's units moved to other
                nodes every epoch, for more mixing at about that fraction of the dataset in downloads),
                and `even` ("auto": "drop" when torch.distributed runs several ranks, else None;
                "drop": every rank reads the same number of samples, fewer than world_size left out per
                epoch; "pad": the same with at most as many repeats, marked `__pad__: True` (others
                `False`); None: whole shards, ranks may get different amounts).

        Raises:
            ConfigError: an unknown kind or argument, or a bad value; the message names it.
        """
        if source_kind == "mixed":  # sources=, strategy=, weights= (see shardcache.pipeline.mixed)
            members = _specs_of(options.pop("sources", shards))
            return cls(mixed_source(members, context=context, **options))
        return cls(source_pipeline(source_kind, shards, context, daemon, options))

    @staticmethod
    def mix(
        datasets: Mapping[str, Dataset] | Sequence[Dataset],
        weights: Mapping[str, float] | Sequence[float] | None = None,
        temperature: float = 1.0,
        virtual_size: int | None = None,
        max_scale_up: float = 1.5,
        seed: int | None = None,
        recipe: Mapping[str, int] | None = None,
        main: str | None = None,
        *,
        context: RuntimeContext | None = None,
    ) -> Dataset:
        """Weighted mixing of datasets (see `shardcache.pipeline.mixing.mix`)."""
        spec = mixing.mix(
            _specs_of(datasets),
            weights,
            temperature,
            virtual_size,
            max_scale_up,
            seed,
            recipe,
            main,
            context=context,
        )
        return Dataset(spec)

    def mini_epochs(self, shards_per_chunk: int, *, num_workers: int | None = None) -> list[Dataset]:
        """This epoch's shards in consecutive chunks (see `shardcache.pipeline.mini_epochs.mini_epochs`)."""
        ctx = self.resolve_context()
        specs = chunks.mini_epochs(self._spec, ctx, shards_per_chunk, num_workers=num_workers)
        return [Dataset(spec, epoch=ctx.epoch) for spec in specs]

    def for_evaluation(self, *, even: str | None = "pad") -> Dataset:
        """This dataset as a validation or test set: one fixed order, every sample exactly once across the
        ranks, the same in every pass (`shardcache.pipeline.evaluation`).

        Units are read in source order at one epoch that `set_epoch` and new passes leave alone; the
        dataset has no position to resume (`state_dict()` always starts the next pass from the beginning).

        Args:
            even: "pad" (default): every rank reads the same number of samples, the last ones repeated and
                marked `__pad__: True` (every other sample `False`): leave those out of the metrics. None:
                whole shards per rank, so ranks may take different numbers of steps (for a loop that takes
                uneven inputs).

        Raises:
            ConfigError: a mix, a resampled source, or `even` neither "pad" nor None.

        Example:
            >>> val = Dataset.from_source("tars", "s3://bucket/val/{0..7}.tar")  # doctest: +SKIP
            >>> loader = TorchLoader(val.for_evaluation(), batch_size=64)  # doctest: +SKIP
        """
        spec = evaluation_spec(self._spec, even)
        return Dataset(spec, epoch=EVALUATION_EPOCH, evaluation=True)

    @property
    def evaluation(self) -> bool:
        """Whether this is an evaluation dataset (`for_evaluation`)."""
        return self._evaluation

    def epoch_shard_order(self) -> list[int]:
        """Indices into ``source.shards`` in the order this epoch reads them (what `mini_epochs` cuts)."""
        return chunks.epoch_shard_order(self._spec, self.resolve_context())

    @property
    def spec(self) -> PipelineSpec:
        """The immutable pipeline this dataset is (`shardcache.spec`)."""
        return self._spec

    @property
    def source(self) -> SourceSpec:
        """The frozen source spec."""
        return self._spec.source

    @property
    def run_facts(self) -> RunFacts:
        """What the main process learned for this dataset (counts, torch.distributed): workers get it."""
        return self._spec.facts

    @property
    def stages(self) -> tuple[Stage, ...]:
        """The frozen stage specs, in order."""
        return self._spec.stages

    def with_stages(self, stages: Sequence[Stage]) -> Dataset:
        """The same source with another stage list."""
        return self._derive(self._spec.with_stages(stages))

    def _add(self, stage: Stage) -> Dataset:
        return self._derive(self._spec.then(stage))

    def map(self, fn: Callable[[Any], Any]) -> Dataset:
        """Apply `fn` to every sample."""
        return self._add(builders.map_stage(fn))

    def select(self, fields: str | Sequence[str]) -> Dataset:
        """Keep only `fields` (and the `__key__`-style metadata) of every sample."""
        return self._add(builders.select_stage(fields))

    def shuffle(self, buffer_size: int, initial: int | None = None) -> Dataset:
        """Shuffle through a buffer of `buffer_size` samples, seeded from (seed, slot, epoch)."""
        return self._add(builders.shuffle_stage(buffer_size, initial))

    def assemble(self, factory: Callable[[RuntimeContext], Any], drop_last: bool = False) -> Dataset:
        """Feed samples to the assembler `factory(context)` returns (push/finish), emitting its outputs."""
        return self._add(builders.assemble_stage(factory, drop_last))

    def batch(
        self, batch_size: int, drop_last: bool = False, collate_fn: Callable[[list[Any]], Any] | None = None
    ) -> Dataset:
        """Group samples into lists of `batch_size` (through `collate_fn` when given)."""
        return self._add(builders.batch_stage(batch_size, drop_last, collate_fn))

    def unbatch(self) -> Dataset:
        """Flatten batches back into samples."""
        return self._add(builders.unbatch_stage())

    def cache(
        self,
        cache_dir: str = ".cache",
        cache_num_workers: int = 1,
        cache_write_batch_size: int = 1024,
        max_rows_per_fragment: int = 5000,
        **extra: Any,
    ) -> Dataset:
        """Materialise everything before this point once into a local Lance dataset (`snapshots`)."""
        self._no_pending_state("cache()")
        options = {
            "cache_dir": cache_dir,
            "cache_num_workers": cache_num_workers,
            "cache_write_batch_size": cache_write_batch_size,
            "max_rows_per_fragment": max_rows_per_fragment,
            **extra,
        }
        return self._derive(cached(self._spec, options))

    def _no_pending_state(self, what: str) -> None:
        # A loaded state resumes this pipeline's stream; a snapshot materialises it whole, from the start.
        if self._live.pending is not None:
            raise ConfigError(
                f"{what}: this dataset has a pending resume state (load_state_dict was called); a snapshot "
                "is built from the start. Call it on a dataset without a loaded state",
                code="SnapshotResumeUnsupported",
            )

    # -- epochs, state, fingerprints ------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Read `epoch` in every pass until the next `set_epoch` (`shardcache.epochs`); shard order and
        shuffles derive from (seed, epoch). Without it, each new pass reads the epoch after the last one."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"epoch={epoch!r}: expected a non-negative integer")
        if self._evaluation:  # frameworks call it on every loader; an evaluation set has one order
            logger.debug("Dataset.set_epoch(%r) ignored: an evaluation dataset reads one fixed order", epoch)
            return
        self._clock.pin(epoch)

    @property
    def epoch_clock(self) -> EpochClock:
        """Which epoch the next pass reads (`shardcache.epochs`); a TorchLoader's passes advance it too."""
        return self._clock

    @property
    def epoch(self) -> int | None:
        """The epoch the next pass reads: pinned by `set_epoch` or advanced by the passes before (None: the
        context's, before any pass)."""
        return self._clock.next

    def fingerprint(self) -> str:
        """A stable hash of the source and stage list (what a resume state must match)."""
        return self._spec.fingerprint()

    def state_dict(self) -> StateDict:
        """The resume envelope (version, identity, state; `shardcache.resume.state`) of the most recent
        iterator, else of the state loaded and not yet used. Its ``state`` is None before any iteration and
        once the iterator is exhausted: loading it starts the next pass from the beginning."""
        return self._live.state_dict(lambda: public(initial_state(self._spec, self.resolve_context())))

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Make the next iteration resume from `state`: this reader's own `state_dict()` (or a version-1
        state), or the states of every rank merged by `shardcache.merge_states` (which resumes on any number
        of nodes, ranks and workers; see `shardcache.resume.elastic`; checks in `shardcache.resume.point`).

        Raises:
            ResumeStateError: the state does not fit, its message starting with mvp-dataset's code:
                [ResumeIdentityMismatch] (another pipeline, seed or slot), [InvalidResumeStateVersion],
                [InvalidResumeState] (not a state).
        """
        checked = check_loaded(self._spec, state, self.resolve_context())
        if self._evaluation:  # checked, but every pass reads the whole set from the beginning
            return
        self._live.load(state, checked)
        after = ended_epoch(state)
        if after is not None:  # the saved pass had ended: the next one reads the epoch after it
            self._clock.advance_to(after + 1)

    def count_samples(self, context: RuntimeContext | None = None, *, always: bool = False) -> None:
        """Run the counting pass `even=` needs now, in this process (`shardcache.sources.deal.counting`).

        `Dataset.__iter__` and `TorchLoader` call it in the trainer's main process; call it yourself before
        handing the dataset to a plain torch DataLoader, whose workers cannot share counts. `always`: count
        without `even=` too (an elastic resume through a shuffle counts its progress in samples).
        """
        self._spec.count_samples(self.resolve_context(context), always=always)

    def partitioning_of(self, context: RuntimeContext | None = None) -> list[str | float | None] | None:
        """[placement, even, exchange] as this dataset's source resolves them in `context` (None for a mix),
        as its states record them: what an elastic resume replays (`shardcache.resume.elastic`)."""
        return self._spec.partitioning_of(self.resolve_context(context))

    def parts(self) -> list[str]:
        """Short descriptions of the source and each stage, carried in states (`shardcache.resume.check`)."""
        return spec_parts(self._spec)

    # -- iteration ------------------------------------------------------------------------------------------

    @property
    def context(self) -> RuntimeContext:
        """The RuntimeContext this dataset reads with (mvp-dataset's `Dataset.context`): the one given to
        `from_source` (or a mix), else the one inferred now from torch.distributed, the DataLoader worker and
        the environment; with the epoch of `set_epoch`. The same as `resolve_context()`."""
        return self.resolve_context()

    def resolve_context(self, context: RuntimeContext | None = None) -> RuntimeContext:
        """The context an iteration uses: explicit (adjusted to the torch worker running it) or inferred."""
        return self._spec.resolve_context(context, self._clock.next)

    def iter_context(self, context: RuntimeContext | None = None) -> PipelineIterator:
        """Iterate as the slot `context` names (tests simulate ranks and workers this way); the epoch is the
        dataset's next one, and the pass does not advance it (`__iter__` does)."""
        return self._start(self.resolve_context(context))

    def _start(self, ctx: RuntimeContext) -> PipelineIterator:
        iterator = start(self._spec, ctx, self._live.take_pending())
        self._live.start(iterator, warn=in_main_process())
        return iterator

    def __iter__(self) -> PipelineIterator:
        worker = torch_worker_id()
        ctx = self._reader_context()
        if worker is None:
            self._spec.count_samples(ctx)  # ctx is resolved already
            iterator = self._start(ctx)
            # The pass counts once it yields: the next iter() reads the next epoch (`shardcache.epochs`).
            iterator.on_first_item(self._clock.passed)
            # A trainer's own loop: report its wait time to the daemon (DataLoader workers do not; a
            # TorchLoader reports for all of them from the main process).
            batched = items_are_batches((stage.batches for stage in self.stages), batched_before=False)
            iterator.report_to_daemon(self.source, batched=batched)
        else:
            # A plain DataLoader's worker: the trainer's copy never sees this pass, the shared clock does.
            iterator = self._start(ctx.with_epoch(self._clock.worker_pass(worker, ctx.epoch)))
            whole = accelerate_dispatch_batch(self)
            if whole is not None:  # Accelerate's dispatcher: whole batches from every worker (see `_padded`)
                iterator.pad_to_multiple(whole)
        return iterator

    def stats(self) -> StageStats:
        """Where the latest pass in this process spent its time: reading, each stage, and the share of the
        trainer's time spent waiting (`shardcache.pipeline.stage_times`; empty before the first pass)."""
        iterator = self._live.iterator
        return iterator.stats() if isinstance(iterator, PipelineIterator) else StageStats()

    def _reader_context(self) -> RuntimeContext:
        """This pass's context: the resolved one, or a job of one process where Accelerate splits the stream
        among the ranks itself (`shardcache.frameworks.accelerate_context`)."""
        return accelerate_context(self.resolve_context(), self)

    def __len__(self) -> int:
        """The items one pass in this process yields: for this rank, under torch.distributed (its share
        of the epoch: samples, or batches after a `.batch()`). Asked by a torch DataLoader (its `__len__`),
        the answer is what that DataLoader's own workers and batching make of it, so its `len()` is the
        number of batches it yields. Known when every shard's sample count is known (manifests, parquet,
        Lance, `count_samples`) and `even=` fixes each rank's share (`shardcache.pipeline.length`).

        Raises:
            LengthUnknown: (a TypeError) the length is not known before reading; the message says why and
                how to get one.
        """
        asker = length_asker()
        if asker is None:
            return pass_length(self._spec, Reader(self._reader_context(), workers=None))
        ctx = self.resolve_context()
        if asker.splits:  # Accelerate splits this dataset's stream: it reads the whole epoch
            ctx = as_one_process(ctx)
        size = asker.batch_size
        batching = None if size is None else Batching(size, asker.drop_last)
        length = pass_length(self._spec, Reader(ctx, asker.workers, batching))
        # torch's DataLoader turns the dataset's length into batches itself (ceil or floor of length /
        # batch_size): whole batches of the steps its workers really make give it the exact number.
        return length if size is None else length * size

    def __bool__(self) -> bool:
        # A dataset is an object, not a container: without this, `if ds:` would ask `__len__`.
        return True

    def build(self, ctx: RuntimeContext) -> Node:
        """The node chain of this pipeline for one slot (`shardcache.pipeline.build`)."""
        return build(self._spec, ctx)

    def __repr__(self) -> str:
        stages = "".join(f".{s.describe()}" for s in self.stages)
        if self._spec.composed:
            return f"Dataset.mix({self.source!r}){stages}"
        return f"Dataset.from_source({self.source.kind!r}, <{len(self.source.shards)} shards>){stages}"

    # -- mvp-dataset 0.2.3's subsets, filter, consume and snapshot (see the modules named) ------------------

    def split(self, fractions: Sequence[float]) -> tuple[Dataset, ...]:
        """Disjoint datasets covering this one, in source order (`shardcache.pipeline.subsets`)."""
        slots = self._subset_slots()
        return tuple(self._derive(spec) for spec in subsets.split(self._spec, fractions, slots))

    def sample(self, fraction: float, *, seed: int = 0) -> Dataset:
        """A seeded subset of `fraction` of the source, without replacement (`pipeline.subsets`)."""
        return self._derive(subsets.sample(self._spec, fraction, seed, self._subset_slots()))

    def _subset_slots(self) -> int:
        # mvp-dataset: a whole-shard subset keeps at least one shard per slot of the dataset's context.
        return int(self.resolve_context().total_slots)

    def filter(self, predicate: str | Sequence[str], *, index: Mapping[str, Any] | None = None) -> Dataset:
        """Lance rows matching a SQL predicate, or any of a list of them (`shardcache.pipeline.subsets`)."""
        return self._derive(subsets.filter_rows(self._spec, predicate, index))

    def consume(self, factory: Callable[[RuntimeContext], Consumer]) -> Any:
        """Push every output into `factory(context)` and return its `finish()` (`pipeline.consume`)."""
        return consume(lambda: self.iter_context(None), factory)

    def snapshot(self, fingerprint_provider: FingerprintProvider | None = None, **options: Any) -> Dataset:
        """`.cache()` under mvp-dataset's name, optionally named by `fingerprint_provider()`."""
        self._no_pending_state("snapshot()")
        return self._derive(snapshot(self._spec, fingerprint_provider, **options))

    def resolve_ref(
        self,
        ref_names: str | Sequence[str],
        *,
        resolve_batch_size: int = 1024,
        context: RuntimeContext | None = None,
        index: Mapping[str, Any] | None = None,
    ) -> Dataset:
        """Replace the lance `ref_columns` named by their referenced values (`stages.resolve_ref`).

        `context` is accepted for mvp-dataset's signature; the stage reads with the pipeline's context.
        """
        del context
        return self._add(resolve_ref_stage(self.source, ref_names, resolve_batch_size, index))


def _specs_of(datasets: Any) -> Any:
    """The pipelines of a mapping or list of Datasets, for the mix features (anything else passes as it is,
    for their checks to name)."""
    if isinstance(datasets, Mapping):
        return {name: ds.spec if isinstance(ds, Dataset) else ds for name, ds in datasets.items()}
    if isinstance(datasets, Sequence) and not isinstance(datasets, str):
        return [ds.spec if isinstance(ds, Dataset) else ds for ds in datasets]
    return datasets
