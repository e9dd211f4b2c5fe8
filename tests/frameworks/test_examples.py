"""The framework examples docs/frameworks.md shows (`examples/frameworks/`), run as each framework's docs
launch a script on two CPU ranks: `python lightning_fit.py` (Lightning's "ddp" strategy starts the second
rank by running it again), `torchrun --nproc_per_node 2` for the Accelerate loop and the Hugging Face
Trainer.

For each framework, two launches:

- `trained`, through a real daemon: three epochs, an evaluation after each, a checkpoint every 27 steps
  (epoch 1 holds global steps 20..39: the one of step 27 is in its middle); the loaders' `len()` known from
  the toy manifests (the Trainer plans `num_train_epochs` with it).
- `resumed`, no daemon: a new launch from the checkpoint of step 27, as each example's docstring says:
  Lightning's `fit(ckpt_path="last")` in a fresh output folder holding it as `last.ckpt` (a run stopped after
  that checkpoint), Accelerate's `load_state` of the folder `save_state` wrote, the Trainer's
  `resume_from_checkpoint=` that checkpoint copied to a folder of its own (not under any output_dir).

What every training and evaluation step saw comes from the example's own `--trace`. The Trainer numbers no
epochs of its own there, so a step's epoch is its step // the loader's length, which the checks then hold
to the data: each such window must read the dataset once.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.devservers import Daemon
from tests.frameworks.framework_checks import (
    EXAMPLES,
    Launch,
    ToyData,
    assert_each_epoch_reads_the_dataset_once,
    assert_ended_well,
    assert_equal_steps,
    assert_evaluations_read_the_same_samples_in_the_same_order,
    assert_every_evaluation_reads_each_sample_once,
    assert_length_is_the_steps_of_every_epoch,
    assert_new_order_each_epoch,
    assert_no_sample_repeats_within_an_epoch_on_a_rank,
    assert_read_through_the_daemon,
    assert_resumed_exactly,
    launch_env,
    python,
    require,
    run,
    torchrun,
    traces,
)
from tests.frameworks.training_plan import EPOCHS

for framework in ("pytorch_lightning", "accelerate", "transformers"):
    require(framework)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SAVE_EVERY = 27


def stopped_after(checkpoint: Path, folder: Path) -> list[str]:
    """Lightning: a fresh output folder holding the checkpoint as `last.ckpt`; resume from the newest."""
    (folder / "checkpoints").mkdir(parents=True)
    shutil.copy(checkpoint, folder / "checkpoints" / "last.ckpt")
    return ["--resume"]


def from_the_folder(checkpoint: Path, folder: Path) -> list[str]:
    """Accelerate: `load_state` of the folder `save_state` wrote, where it is."""
    return ["--resume", str(checkpoint)]


def copied_elsewhere(checkpoint: Path, folder: Path) -> list[str]:
    """The Trainer: the checkpoint copied to a folder under no output_dir."""
    elsewhere = folder.parent / f"{folder.name}-copied" / "saved-at-27"
    shutil.copytree(checkpoint, elsewhere)
    return ["--resume", str(elsewhere)]


@dataclass(frozen=True)
class Example:
    script: str
    launcher: Callable[..., list[str]]
    checkpoint: str  # the checkpoint of step SAVE_EVERY, under the trained run's output folder
    resume: Callable[[Path, Path], list[str]]  # its arguments to resume from that checkpoint

    def launch(
        self, out: Path, toy: ToyData, socket: str | Path, *args: str, daemon: Daemon | None = None
    ) -> Launch:
        trace = str(out / "trace")
        given = [
            "--data",
            str(toy.root),
            "--out",
            str(out),
            "--trace",
            trace,
            "--save-every",
            str(SAVE_EVERY),
        ]
        command = self.launcher(self.script, *given, *args, folder=EXAMPLES)
        return run(command, out, launch_env(socket), daemon)


FRAMEWORKS = {
    "lightning": Example("lightning_fit.py", python, f"checkpoints/step={SAVE_EVERY}.ckpt", stopped_after),
    "accelerate": Example("accelerate_loop.py", torchrun, f"checkpoints/step_{SAVE_EVERY}", from_the_folder),
    "hf_trainer": Example("hf_trainer.py", torchrun, f"checkpoint-{SAVE_EVERY}", copied_elsewhere),
}


@pytest.fixture(scope="module", params=list(FRAMEWORKS))
def example(request: pytest.FixtureRequest) -> Example:
    return FRAMEWORKS[request.param]


@pytest.fixture(scope="module")
def trained(
    example: Example, toy: ToyData, daemon: Daemon, tmp_path_factory: pytest.TempPathFactory
) -> Launch:
    out = tmp_path_factory.mktemp(f"{Path(example.script).stem}-trained")
    return example.launch(out, toy, daemon.socket, daemon=daemon)


@pytest.fixture(scope="module")
def resumed(
    example: Example, trained: Launch, toy: ToyData, no_daemon: Path, tmp_path_factory: pytest.TempPathFactory
) -> Launch:
    assert_ended_well(trained)
    checkpoint = trained.out / example.checkpoint
    assert checkpoint.exists(), f"no {checkpoint} among {sorted(checkpoint.parent.iterdir())}"
    out = tmp_path_factory.mktemp(f"{Path(example.script).stem}-resumed")
    return example.launch(out, toy, no_daemon, *example.resume(checkpoint, out))


def test_the_example_trains_every_epoch_on_every_sample_once(trained: Launch, toy: ToyData) -> None:
    assert_ended_well(trained)
    found = traces(trained)
    assert_each_epoch_reads_the_dataset_once(found, dataset=toy.train_keys)
    assert_no_sample_repeats_within_an_epoch_on_a_rank(found)
    assert_equal_steps(found)
    assert_new_order_each_epoch(found)


def test_the_example_loader_length_is_the_steps_of_each_epoch(trained: Launch) -> None:
    found = traces(trained)
    assert_length_is_the_steps_of_every_epoch(found)
    steps = [len(report["batches"]) for report in found]
    assert steps == [EPOCHS * found[0]["length"]] * 2, f"steps per rank {steps}, len() {found[0]['length']}"


def test_the_example_reads_its_shards_through_the_daemon(
    trained: Launch, daemon: Daemon, toy: ToyData
) -> None:
    traces(trained)
    assert_read_through_the_daemon(trained, daemon, dataset_bytes=toy.shards_bytes())


def test_the_example_evaluates_every_sample_once_each_run(trained: Launch, toy: ToyData) -> None:
    found = traces(trained)
    assert [len(report["evals"]) for report in found] == [EPOCHS] * 2
    assert_every_evaluation_reads_each_sample_once(found, toy.val_keys)


def test_the_example_resumes_from_its_checkpoint_exactly(trained: Launch, resumed: Launch) -> None:
    assert_ended_well(resumed)
    assert_resumed_exactly(traces(trained), traces(resumed), SAVE_EVERY)


def test_every_evaluation_run_reads_the_same_samples_in_the_same_order(
    trained: Launch, resumed: Launch
) -> None:
    compared = assert_evaluations_read_the_same_samples_in_the_same_order(traces(trained), traces(resumed))
    print(f"\n{compared} evaluation runs compared (2 ranks, 2 launches): the same samples in the same order")
