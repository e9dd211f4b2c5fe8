"""`examples/frameworks/lightning_fit.py`, the Lightning recipe docs/frameworks.md shows, run as its docs say:
`python lightning_fit.py` (Lightning's "ddp" strategy starts the second CPU rank by running it again).

- `trained`, through a real daemon: three epochs with a validation run after each, checkpoints every 27
  steps (`ModelCheckpoint(..., save_last=True)`), the loaders' `len()` known from the toy manifests.
- `resumed`, no daemon: a fresh output folder holding the checkpoint of step 27 as `last.ckpt` (a run stopped
  after that checkpoint), started with `--resume` (`fit(ckpt_path="last")`).

What every training step and validation step saw comes from the example's own `--trace`.
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
    python,
    require,
    run,
    traces,
)
from tests.frameworks.training_plan import EPOCHS

require("pytorch_lightning")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SAVE_EVERY = 27  # epoch 1 holds global steps 20..39: the checkpoint of step 27 is in its middle


def lightning_fit(
    out: Path, toy: ToyData, socket: str | Path, *args: str, daemon: Daemon | None = None
) -> Launch:
    command = python(
        "lightning_fit.py",
        "--data",
        str(toy.root),
        "--out",
        str(out),
        "--trace",
        str(out / "trace"),
        *args,
        folder=EXAMPLES,
    )
    return run(command, out, launch_env(socket), daemon)


@pytest.fixture(scope="module")
def trained(toy: ToyData, daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> Launch:
    out = tmp_path_factory.mktemp("pl-example")
    return lightning_fit(out, toy, daemon.socket, "--save-every", str(SAVE_EVERY), daemon=daemon)


@pytest.fixture(scope="module")
def resumed(
    trained: Launch, toy: ToyData, no_daemon: Path, tmp_path_factory: pytest.TempPathFactory
) -> Launch:
    assert_ended_well(trained)
    checkpoint = trained.out / "checkpoints" / f"step={SAVE_EVERY}.ckpt"
    assert checkpoint.is_file(), f"no {checkpoint.name} among {sorted(checkpoint.parent.iterdir())}"
    out = tmp_path_factory.mktemp("pl-example-resumed")
    (out / "checkpoints").mkdir()
    shutil.copy(checkpoint, out / "checkpoints" / "last.ckpt")
    return lightning_fit(out, toy, no_daemon, "--save-every", str(SAVE_EVERY), "--resume")


def test_the_lightning_example_trains_every_epoch_on_every_sample_once(trained: Launch, toy: ToyData) -> None:
    assert_ended_well(trained)
    found = traces(trained)
    assert_each_epoch_reads_the_dataset_once(found, dataset=toy.train_keys)
    assert_no_sample_repeats_within_an_epoch_on_a_rank(found)
    assert_equal_steps(found)
    assert_new_order_each_epoch(found)


def test_the_lightning_example_loader_length_is_the_steps_of_each_epoch(trained: Launch) -> None:
    assert_length_is_the_steps_of_every_epoch(traces(trained))


def test_the_lightning_example_reads_its_shards_through_the_daemon(
    trained: Launch, daemon: Daemon, toy: ToyData
) -> None:
    traces(trained)
    assert_read_through_the_daemon(trained, daemon, dataset_bytes=toy.shards_bytes())


def test_the_lightning_example_validates_on_every_sample_once_each_run(trained: Launch, toy: ToyData) -> None:
    found = traces(trained)
    assert [len(report["evals"]) for report in found] == [EPOCHS] * 2
    assert_every_evaluation_reads_each_sample_once(found, toy.val_keys)


def test_the_lightning_example_resumes_from_last_ckpt_exactly(trained: Launch, resumed: Launch) -> None:
    assert_ended_well(resumed)
    assert_resumed_exactly(traces(trained), traces(resumed), SAVE_EVERY)


def test_every_lightning_validation_run_reads_the_same_samples_in_the_same_order(
    trained: Launch, resumed: Launch
) -> None:
    compared = assert_evaluations_read_the_same_samples_in_the_same_order(traces(trained), traces(resumed))
    print(f"\n{compared} validation runs compared (2 ranks, 2 launches): the same samples in the same order")
