"""`Dataset.for_evaluation()`: a validation or test set, read the same way in every pass.

Metrics of two validation runs compare only when both read the same samples, each exactly once: a training
dataset reads a new order every epoch and, under DDP's default `even="drop"`, leaves a different few
samples out each time. An evaluation dataset is the same pipeline with:

- its units in source order (`shuffle_mode="none"`, for the kinds that have it) at one epoch, 0, that
  neither `set_epoch` nor a new pass moves (`Dataset.set_epoch` ignores it; the facade pins the epoch);
- `even="pad"` by default: every data-parallel rank reads the same number of samples (so every rank runs
  the same number of steps, which a framework's per-step collective needs: Accelerate's
  `gather_for_metrics`, the Hugging Face Trainer's evaluation loop, `self.log(..., sync_dist=True)`); the
  last rank's share is completed with repeats marked `__pad__: True` (every other sample `False`) for the
  metrics to leave out. `even=None` reads whole shards per rank instead (uneven steps), for loops that take
  uneven inputs; "drop" is refused, since it leaves samples out;
- no position to resume: a pass always reads the whole set, so `state_dict()` always says "from the
  beginning" and a loaded state changes nothing (frameworks save evaluation loaders' states too).

Stages after the source run as they are: a `.shuffle()` there shuffles the same way in every pass (its seed
and epoch are fixed), and an order-changing stage is the user's choice.
"""

from __future__ import annotations

import dataclasses

from shardcache.errors import ConfigError
from shardcache.sources import check_options
from shardcache.sources.kinds import kind_of
from shardcache.spec import PipelineSpec

EVALUATION_EVEN = ("pad", None)
# The one epoch an evaluation dataset reads (`Dataset.for_evaluation` pins it).
EVALUATION_EPOCH = 0


def evaluation_spec(spec: PipelineSpec, even: str | None) -> PipelineSpec:
    """`spec` read for evaluation (see the module): source order, `even` ("pad" or None).

    Raises:
        ConfigError: a mix, a resampled source, or `even` neither "pad" nor None.
    """
    if even not in EVALUATION_EVEN:
        raise ConfigError(
            f"for_evaluation(even={even!r}): expected 'pad' (every rank the same steps, repeats marked "
            "__pad__) or None (whole shards, uneven steps); 'drop' would leave samples out of the metrics"
        )
    if spec.composed:
        raise ConfigError(
            "for_evaluation() on a mix: a mix draws its members by weight, so no pass reads each sample "
            "exactly once; evaluate each dataset on its own"
        )
    source = spec.source
    if source.resample:
        raise ConfigError(
            "for_evaluation() on a source with resample=True: its passes never end; build the evaluation "
            "dataset without resample"
        )
    options = {**source.options, "even": even}
    traits = kind_of(source.kind)
    if traits.unit_shuffle_modes is not None or "shuffle_mode" in traits.options:
        options["shuffle_mode"] = "none"
    check_options(source.kind, options)
    # The same units as before: the counts already taken (`facts`) stay valid.
    return PipelineSpec(dataclasses.replace(source, options=options), spec.stages, spec.facts)
