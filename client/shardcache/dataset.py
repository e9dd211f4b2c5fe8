"""`Dataset`: the immutable, chainable pipeline facade (mvp-dataset's public API).

Every stage method returns a new Dataset. Iterating resolves the runtime context (explicit, else torch and
environment), builds one node per stage over the source node, and returns a `PipelineIterator`, whose
`state_dict()` a trainer checkpoints (`shardcache.iteration`). Resume states are checked and turned into
a start point in `shardcache.dataset_resume`; the `.cache()` boundary is `shardcache.cache_boundary`.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from shardcache.cache_boundary import CACHE_DEFAULTS as CACHE_DEFAULTS
from shardcache.cache_boundary import cache_stage, cut_at_cache
from shardcache.context import RuntimeContext, in_main_process
from shardcache.dataset_resume import Runtime, check_loaded, resume_point
from shardcache.errors import ConfigError
from shardcache.iteration import PipelineIterator
from shardcache.shards import ShardRef, expand_shards
from shardcache.sources import SourceNode, SourceSpec, canonical_kind, check_options, node_class
from shardcache.sources.counting import RunFacts, unit_counts
from shardcache.sources.opener import DaemonSetting, check_daemon_setting
from shardcache.stages import Node, Stage, builders


def _register_with_torch() -> None:
    # Dataset is a torch IterableDataset (so a plain DataLoader takes it) without importing torch here:
    # IterableDataset's metaclass is ABCMeta, so registering a virtual subclass suffices once torch is loaded.
    data = sys.modules.get("torch.utils.data")
    if data is not None and not issubclass(Dataset, data.IterableDataset):
        data.IterableDataset.register(Dataset)


def _describe(source: SourceSpec, stages: Sequence[Stage]) -> str:
    return "\n".join([source.describe(), *(stage.describe() for stage in stages)])


class Dataset:
    """An immutable iterable pipeline over shards served by the node daemon.

    Example:
        >>> ds = Dataset.from_source("tars", "/data/shard_{000000..000127}.tar")  # doctest: +SKIP
        >>> ds = ds.shuffle(1024).map(decode)  # doctest: +SKIP
        >>> for sample in ds:  # doctest: +SKIP
        ...     train_step(sample)
    """

    def __init__(
        self,
        source: SourceSpec,
        stages: Sequence[Stage] = (),
        *,
        epoch: int | None = None,
        facts: RunFacts | None = None,
    ) -> None:
        self._source = source
        self._stages: tuple[Stage, ...] = tuple(stages)
        self._runtime = Runtime(epoch, facts)
        _register_with_torch()

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
                both, and neither changes the data or fingerprint.
                Shard kinds (tars, jsonl, parquet) take the partitioning options (see
                `shardcache.sources.partition` and docs/cluster.md): `placement` ("auto": "node" when the
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
        if source_kind == "mixed":  # sources=, strategy=, weights= (see shardcache.mixing.mixed_source)
            from shardcache.mixing import mixed_source

            return mixed_source(options.pop("sources", shards), context=context, **options)
        kind = canonical_kind(source_kind)
        if context is not None and not isinstance(context, RuntimeContext):
            raise ConfigError(f"context={context!r}: expected a RuntimeContext or None")
        check_daemon_setting(daemon)
        check_options(kind, options)
        if kind == "lance":
            if isinstance(shards, (str, ShardRef)) or not isinstance(shards, Sequence):
                shards = [shards]
            refs = [s if isinstance(s, ShardRef) else ShardRef(str(s)) for s in shards]
            from shardcache.sources.lance import check_daemon

            check_daemon(daemon)
            daemon = None  # Lance reads its URIs with its own object-store support.
        else:
            from shardcache.sources import data_suffix

            refs = expand_shards(shards, data_suffix=data_suffix(kind))
        return cls(SourceSpec(kind, tuple(refs), dict(options), context, daemon))

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
        """Weighted mixing of datasets (see `shardcache.mixing.mix`)."""
        from shardcache.mixing import mix

        return mix(
            datasets, weights, temperature, virtual_size, max_scale_up, seed, recipe, main, context=context
        )

    def mini_epochs(self, shards_per_chunk: int, *, num_workers: int | None = None) -> list[Dataset]:
        """This epoch's shards in consecutive chunks (see `shardcache.mini_epochs.mini_epochs`)."""
        from shardcache.mini_epochs import mini_epochs

        return mini_epochs(self, shards_per_chunk, num_workers=num_workers)

    @property
    def source(self) -> SourceSpec:
        """The frozen source spec."""
        return self._source

    @property
    def run_facts(self) -> RunFacts:
        """What the main process learned for this dataset (counts, torch.distributed): workers get it."""
        return self._runtime.facts

    @property
    def stages(self) -> tuple[Stage, ...]:
        """The frozen stage specs, in order."""
        return self._stages

    def with_stages(self, stages: Sequence[Stage]) -> Dataset:
        """The same source with another stage list."""
        return Dataset(self._source, stages, epoch=self._runtime.epoch, facts=self._runtime.facts)

    def _add(self, stage: Stage) -> Dataset:
        return self.with_stages((*self._stages, stage))

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
        """Materialise everything before this point once into a local Lance dataset (`shardcache.cache`)."""
        options = {
            "cache_dir": cache_dir,
            "cache_num_workers": cache_num_workers,
            "cache_write_batch_size": cache_write_batch_size,
            "max_rows_per_fragment": max_rows_per_fragment,
            **extra,
        }
        return self._add(cache_stage(self._source, self._stages, options))

    # -- epochs, state, fingerprints ------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Use `epoch` for the next iterations: shard order and shuffles derive from (seed, epoch)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"epoch={epoch!r}: expected a non-negative integer")
        self._runtime.epoch = epoch

    @property
    def epoch(self) -> int | None:
        """The epoch set by `set_epoch` (None: the context's)."""
        return self._runtime.epoch

    def fingerprint(self) -> str:
        """A stable hash of the source and stage list (what a resume state must match)."""
        return hashlib.sha256(_describe(self._source, self._stages).encode()).hexdigest()[:32]

    def state_dict(self) -> dict[str, Any]:
        """The state of the most recent iterator (or the state loaded and not yet used)."""
        return self._runtime.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration resume from `state`: this reader's own `state_dict()`, or the states of
        every rank merged by `shardcache.merge_states` (which resumes on any number of nodes, ranks and
        workers; see `shardcache.elastic`; checks in `shardcache.dataset_resume`)."""
        check_loaded(self, state)
        self._runtime.pending = state

    def count_samples(self, context: RuntimeContext | None = None, *, always: bool = False) -> None:
        """Run the counting pass `even=` needs now, in this process (`shardcache.sources.counting`).

        `Dataset.__iter__` and `TorchLoader` call it in the trainer's main process; call it yourself before
        handing the dataset to a plain torch DataLoader, whose workers cannot share counts. `always`: count
        without `even=` too (an elastic resume through a shuffle counts its progress in samples).
        """
        self._runtime.facts.capture()
        if self._source.kind == "mix" or any(stage.kind == "cache" for stage in self._stages):
            return  # a mix's members count when they are read; a cached dataset's rows are lance's
        node = node_class(self._source.kind)(self._source, self.resolve_context(context), self._runtime.facts)
        if not isinstance(node, SourceNode) or not node.partitionable or node.counted_by_metadata:
            return
        if node.partitioning.even is not None or always:
            from shardcache.subsets import select_units

            units = select_units(self._source.kind, node.units(), self._source.options.get("subset"))
            unit_counts(node, units)
        node.close()

    def partitioning_of(self, context: RuntimeContext | None = None) -> list[Any] | None:
        """[placement, even, exchange] as this dataset's source resolves them in `context` (None for a mix),
        as its states record them: what an elastic resume replays (`shardcache.elastic`)."""
        if self._source.kind == "mix":
            return None
        node = node_class(self._source.kind)(self._source, self.resolve_context(context), self._runtime.facts)
        return node.partitioning.as_list() if isinstance(node, SourceNode) else None

    def parts(self) -> list[str]:
        """Short descriptions of the source and each stage, carried in states (`shardcache.resume_check`)."""
        from shardcache.resume_check import pipeline_parts

        return pipeline_parts(self._source, self._stages)

    # -- iteration ------------------------------------------------------------------------------------------

    @property
    def context(self) -> RuntimeContext:
        """The RuntimeContext this dataset reads with (mvp-dataset's `Dataset.context`): the one given to
        `from_source` (or a mix), else the one inferred now from torch.distributed, the DataLoader worker and
        the environment; with the epoch of `set_epoch`. The same as `resolve_context()`."""
        return self.resolve_context()

    def resolve_context(self, context: RuntimeContext | None = None) -> RuntimeContext:
        """The context an iteration uses: explicit (adjusted to the torch worker running it) or inferred."""
        explicit = context if context is not None else self._source.context
        if explicit is not None:
            ctx = explicit.in_current_worker()
        else:
            ctx = RuntimeContext.from_runtime()
        if self._runtime.epoch is not None:
            ctx = ctx.with_epoch(self._runtime.epoch)
        return ctx

    def iter_context(self, context: RuntimeContext | None = None) -> PipelineIterator:
        """Iterate as the slot `context` names (tests simulate ranks and workers this way)."""
        ctx = self.resolve_context(context)
        self._runtime.facts.capture()
        pending, self._runtime.pending = self._runtime.pending, None
        resume = resume_point(self, pending, ctx)
        if resume is not None:
            ctx = ctx.with_epoch(resume.epoch)
        node = self.build(ctx)
        if resume is not None:
            resume.restore(node)
        iterator = PipelineIterator(node, ctx, self.fingerprint(), self.parts())
        if resume is not None:
            resume.carry_over(iterator)
        self._runtime.iterator = iterator
        return iterator

    def __iter__(self) -> Iterator[Any]:
        if in_main_process():
            self.count_samples()
        iterator = self.iter_context(None)
        if in_main_process():
            # A trainer's own loop: report its wait time to the daemon (DataLoader workers do not; a
            # TorchLoader reports for all of them from the main process).
            kinds = [stage.kind for stage in self._stages if stage.kind in ("batch", "unbatch")]
            iterator.report_to_daemon(self._source, batched=bool(kinds) and kinds[-1] == "batch")
        return iterator

    def build(self, ctx: RuntimeContext) -> Node:
        """The node chain of this pipeline for one slot (resolving a `.cache()` boundary first)."""
        source, stages = cut_at_cache(self._source, self._stages, ctx)
        node: Node
        if source.kind == "mix":  # a mix of other datasets (shardcache.mixing.MixSource)
            from shardcache.mixing import MixSource

            assert isinstance(source, MixSource)
            node = source.node(ctx)
        else:
            node = node_class(source.kind)(source, ctx, self._runtime.facts)
        for stage in stages:
            node = stage.node(node, ctx)
        return node

    def __repr__(self) -> str:
        stages = "".join(f".{s.describe()}" for s in self._stages)
        if self._source.kind == "mix":
            return f"Dataset.mix({self._source!r}){stages}"
        return f"Dataset.from_source({self._source.kind!r}, <{len(self._source.shards)} shards>){stages}"

    # -- mvp-dataset 0.2.3's subsets, filter, consume and snapshot (see the modules named) ------------------

    def split(self, fractions: Sequence[float]) -> tuple[Dataset, ...]:
        """Disjoint datasets covering this one, in source order (`shardcache.subsets`)."""
        from shardcache.subsets import split_dataset

        return split_dataset(self, fractions)

    def sample(self, fraction: float, *, seed: int = 0) -> Dataset:
        """A seeded subset of `fraction` of the source, without replacement (`shardcache.subsets`)."""
        from shardcache.subsets import sample_dataset

        return sample_dataset(self, fraction, seed)

    def filter(self, predicate: str | Sequence[str], *, index: Mapping[str, Any] | None = None) -> Dataset:
        """Lance rows matching a SQL predicate, or any of a list of them (`shardcache.subsets`)."""
        from shardcache.subsets import filter_dataset

        return filter_dataset(self, predicate, index)

    def consume(self, factory: Callable[[RuntimeContext], Any]) -> Any:
        """Push every output into `factory(context)` and return its `finish()` (`shardcache.consume`)."""
        from shardcache.consume import consume

        return consume(self, factory)

    def snapshot(self, fingerprint_provider: Callable[[], str] | None = None, **options: Any) -> Dataset:
        """`.cache()` under mvp-dataset's name, optionally named by `fingerprint_provider()`."""
        from shardcache.cache.snapshot import snapshot

        return snapshot(self, fingerprint_provider, **options)

    def resolve_ref(
        self,
        ref_names: str | Sequence[str],
        *,
        resolve_batch_size: int = 1024,
        context: RuntimeContext | None = None,
        index: Mapping[str, Any] | None = None,
    ) -> Dataset:
        """Replace the lance `ref_columns` named by their referenced values (`shardcache.sources.lance_refs`).

        `context` is accepted for mvp-dataset's signature; the stage reads with the pipeline's context.
        """
        from typing import cast

        from shardcache.sources.lance_refs import resolve_ref_stage

        del context
        return self._add(cast(Stage, resolve_ref_stage(self._source, ref_names, resolve_batch_size, index)))
