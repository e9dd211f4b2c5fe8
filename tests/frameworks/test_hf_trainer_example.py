"""`examples/frameworks/hf_trainer.py`, the Hugging Face Trainer recipe docs/frameworks.md shows, launched
by `torchrun --nproc_per_node 2` (CPU, gloo).

- `trained`, through a real daemon: `num_train_epochs=3` (the TorchLoader's `len()` plans the run), an
  evaluation after every epoch (`eval_strategy="epoch"`), checkpoints every 27 steps.
- `resumed`, no daemon: a new output folder, `resume_from_checkpoint=` the checkpoint of step 27 copied to
  a folder of its own (not under the run's output_dir): the data state comes from that checkpoint.

What every training step and evaluation step saw comes from the example's own `--trace`; the Trainer
numbers no epochs of its own there, so a step's epoch is its step // the loader's length, which the
checks then hold to the data: each such window must read the dataset once.
"""

from __future__ import annotations

import shutil
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
    require,
    run,
    torchrun,
    traces,
)
from tests.frameworks.training_plan import EPOCHS

require("transformers")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SAVE_EVERY = 27  # epoch 1 holds global steps 20..39: the checkpoint of step 27 is in its middle


def hf_trainer(
    out: Path, toy: ToyData, socket: str | Path, *args: str, daemon: Daemon | None = None
) -> Launch:
    trace = str(out / "trace")
    command = torchrun(
        "hf_trainer.py", "--data", str(toy.root), "--out", str(out), "--trace", trace, *args, folder=EXAMPLES
    )
    return run(command, out, launch_env(socket), daemon)


@pytest.fixture(scope="module")
def trained(toy: ToyData, daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> Launch:
    out = tmp_path_factory.mktemp("hf-example")
    return hf_trainer(out, toy, daemon.socket, "--save-every", str(SAVE_EVERY), daemon=daemon)


@pytest.fixture(scope="module")
def resumed(
    trained: Launch, toy: ToyData, no_daemon: Path, tmp_path_factory: pytest.TempPathFactory
) -> Launch:
    assert_ended_well(trained)
    checkpoint = trained.out / f"checkpoint-{SAVE_EVERY}"
    assert checkpoint.is_dir(), f"no {checkpoint.name} among {sorted(trained.out.iterdir())}"
    elsewhere = tmp_path_factory.mktemp("hf-example-copied") / "saved-at-27"
    shutil.copytree(checkpoint, elsewhere)
    out = tmp_path_factory.mktemp("hf-example-resumed")
    return hf_trainer(out, toy, no_daemon, "--save-every", str(SAVE_EVERY), "--resume", str(elsewhere))


def test_the_trainer_example_trains_every_epoch_on_every_sample_once(trained: Launch, toy: ToyData) -> None:
    assert_ended_well(trained)
    found = traces(trained)
    assert_each_epoch_reads_the_dataset_once(found, dataset=toy.train_keys)
    assert_no_sample_repeats_within_an_epoch_on_a_rank(found)
    assert_equal_steps(found)
    assert_new_order_each_epoch(found)


def test_the_trainer_example_plans_its_epochs_with_the_loader_length(trained: Launch) -> None:
    found = traces(trained)
    assert_length_is_the_steps_of_every_epoch(found)
    steps = [len(report["batches"]) for report in found]
    assert steps == [EPOCHS * found[0]["length"]] * 2, f"steps per rank {steps}, len() {found[0]['length']}"


def test_the_trainer_example_reads_its_shards_through_the_daemon(
    trained: Launch, daemon: Daemon, toy: ToyData
) -> None:
    traces(trained)
    assert_read_through_the_daemon(trained, daemon, dataset_bytes=toy.shards_bytes())


def test_the_trainer_example_evaluates_every_sample_once_each_run(trained: Launch, toy: ToyData) -> None:
    found = traces(trained)
    assert [len(report["evals"]) for report in found] == [EPOCHS] * 2
    assert_every_evaluation_reads_each_sample_once(found, toy.val_keys)


def test_the_trainer_example_resumes_from_a_checkpoint_outside_its_output_dir_exactly(
    trained: Launch, resumed: Launch
) -> None:
    assert_ended_well(resumed)
    assert_resumed_exactly(traces(trained), traces(resumed), SAVE_EVERY)


def test_every_trainer_evaluation_reads_the_same_samples_in_the_same_order(
    trained: Launch, resumed: Launch
) -> None:
    compared = assert_evaluations_read_the_same_samples_in_the_same_order(traces(trained), traces(resumed))
    print(f"\n{compared} evaluation runs compared (2 ranks, 2 launches): the same samples in the same order")
