"""The Hugging Face Trainer: `ShardcacheCallback` saves a TorchLoader's position in each checkpoint, so
`trainer.train(resume_from_checkpoint=...)` goes on exactly where the checkpoint was, wherever it lies.

What the Trainer (transformers 5.x; docs/frameworks.md) does to a loader, and why the callback is what it is:

- It counts an "epoch" as one pass over the loader and calls `set_epoch(epoch)` before each. A loader with a
  length (`len(TorchLoader)`, known with manifests and `even=`) lets it plan `num_train_epochs`; without
  one it needs `max_steps` and, on resume, cannot tell which epoch it was in: it restarts its count at 0.
- On resume it replays the batches of the current epoch through Accelerate's `skip_first_batches`, which
  rebuilds the loader as a DataLoader: a TorchLoader (loader-side stages, worker merge) cannot be rebuilt
  so, and the replay would read the wrong epoch anyway. Without the callback that replay is refused with an
  error naming it.
- It saves no loader state, but writes the state of every callback that is an `ExportableState` into the
  checkpoint's `trainer_state.json`, and reads that file back from the checkpoint it resumes from.

So the callback, with a TorchLoader returned by the Trainer's `get_train_dataloader`:

- turns the Trainer's replay off (`ignore_data_skip=True`) and lets the loader count its own epochs (the
  Trainer's `set_epoch` numbers restart at 0 on a resume without a length; the loader's state knows the
  real one);
- at every step the Trainer will save (or evaluate, which may decide a save), gathers every rank's position
  into one job-wide state (a collective, on every rank: `on_step_end` and `on_epoch_end` run everywhere) and
  hands it to the Trainer as the callback's own state, which the Trainer writes into `trainer_state.json`;
- when training begins at a step past 0 (a resume), loads that state from the `trainer_state.json` the
  Trainer read, that is from the checkpoint `resume_from_checkpoint` named, wherever it lies: each rank
  goes on from its own position, in the epoch the checkpoint was in.

The Trainer writes `trainer_state.json` on the processes that save (global rank 0; with
`save_on_each_node=True`, local rank 0 of every node). The data state inside is the whole job's, so any one
copy resumes every rank: without a shared filesystem, `save_on_each_node=True` gives every node its copy.

A shardcache Dataset given as `train_dataset=` works for training (Accelerate's split is detected and the
Dataset reads the whole stream on each rank, `shardcache.frameworks`), but its mid-epoch resume is refused
with an error naming this recipe: the Trainer's replay would repeat and lose data.

Usage:
    >>> class MyTrainer(Trainer):  # doctest: +SKIP
    ...     def get_train_dataloader(self):
    ...         return TorchLoader(self.train_dataset, batch_size=8, num_workers=4)
    >>> callbacks = [ShardcacheCallback()]  # doctest: +SKIP
    >>> trainer = MyTrainer(model=model, args=args, train_dataset=ds, callbacks=callbacks)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState

from shardcache.errors import ConfigError
from shardcache.loader import TorchLoader
from shardcache.resume.state import StateDict


class ShardcacheCallback(TrainerCallback, ExportableState):  # type: ignore[misc]
    """Exact `resume_from_checkpoint` of a TorchLoader under the Hugging Face Trainer (see the module)."""

    def __init__(self) -> None:
        # The job-wide data state of the step the Trainer is about to save (`state()` hands it over), and
        # that step: a checkpoint must hold its own step's position, never an earlier one.
        self.data_state: StateDict | None = None
        self.data_step: int | None = None

    def state(self) -> dict[str, Any]:
        """What the Trainer writes into the checkpoint's `trainer_state.json` for this callback."""
        return {"args": {}, "attributes": {"data_state": self.data_state, "data_step": self.data_step}}

    def on_init_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        # The loader's state resumes the data; the Trainer's replay of batches must not run as well.
        args.ignore_data_skip = True

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        loader = _torch_loader(kwargs.get("train_dataloader"))
        loader.own_epochs = True
        if state.global_step == 0:
            return
        saved, step = _saved_data_state(state)
        if saved is None:
            raise ConfigError(
                f"resuming at step {state.global_step} from a checkpoint whose trainer_state.json holds no "
                "shardcache data state (ShardcacheCallback writes it with every checkpoint): resume from a "
                "checkpoint saved with the callback",
                code="UnsupportedResume",
            )
        if step != state.global_step:
            raise ConfigError(
                f"the checkpoint of step {state.global_step} holds the data position of step {step}: a "
                "callback listed after ShardcacheCallback decided that save, after the position was taken. "
                "List ShardcacheCallback after the callbacks that set control.should_save",
                code="UnsupportedResume",
            )
        loader.load_state_dict(saved)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self._take_if_saving(state, control, kwargs)

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self._take_if_saving(state, control, kwargs)

    def _take_if_saving(
        self, state: TrainerState, control: TrainerControl, kwargs: dict[str, object]
    ) -> None:
        # Called after the Trainer's own flow callback decided this step's save and evaluation (it runs
        # first), before the save: an evaluation may decide a save too (save_strategy="best").
        if not (control.should_save or control.should_evaluate):
            return
        loader = _torch_loader(kwargs.get("train_dataloader"))
        loader.state_scope = "job"
        self.data_state = loader.state_dict()  # every rank at once: the gather inside is a collective
        self.data_step = state.global_step


def _saved_data_state(state: TrainerState) -> tuple[StateDict | None, int | None]:
    """The data state in the `trainer_state.json` the Trainer resumed from, and the step it was taken at
    (None: none saved there)."""
    # A dict of states by callback class once built or loaded (its annotation says list: what it is given).
    states: object = state.stateful_callbacks
    saved = states.get(ShardcacheCallback.__name__) if isinstance(states, dict) else None
    if isinstance(saved, list):  # the Trainer lists the states of several callbacks of one class
        saved = saved[-1] if saved else None
    attributes = saved.get("attributes") if isinstance(saved, dict) else None
    if not isinstance(attributes, dict):
        return None, None
    data, step = attributes.get("data_state"), attributes.get("data_step")
    return (data if isinstance(data, dict) else None), (step if isinstance(step, int) else None)


def _torch_loader(loader: object) -> TorchLoader:
    if not isinstance(loader, TorchLoader):
        raise ConfigError(
            f"shardcache.transformers.ShardcacheCallback: the Trainer trains from {type(loader).__name__}, "
            "not a TorchLoader: return a shardcache.TorchLoader from your Trainer's get_train_dataloader() "
            "(docs/frameworks.md)"
        )
    return loader
