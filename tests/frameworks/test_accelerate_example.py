"""`examples/frameworks/accelerate_loop.py`, the Accelerate recipe docs/frameworks.md shows, launched as
Accelerate's docs launch a script on several processes: `torchrun --nproc_per_node 2` (CPU, gloo).

- `trained`, through a real daemon: three epochs of the loop, `save_state` every 27 steps, an evaluation
  with `gather_for_metrics` after each epoch.
- `resumed`, no daemon: a new launch that starts with `load_state` of the state saved after step 27.

What every training step and evaluation step saw comes from the example's own `--trace`.
"""

from __future__ import annotations

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

require("accelerate")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SAVE_EVERY = 27  # epoch 1 holds global steps 20..39: a save_state in its middle


def accelerate_loop(
    out: Path, toy: ToyData, socket: str | Path, *args: str, daemon: Daemon | None = None
) -> Launch:
    trace = str(out / "trace")
    command = torchrun(
        "accelerate_loop.py",
        "--data",
        str(toy.root),
        "--out",
        str(out),
        "--trace",
        trace,
        *args,
        folder=EXAMPLES,
    )
    return run(command, out, launch_env(socket), daemon)


@pytest.fixture(scope="module")
def trained(toy: ToyData, daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> Launch:
    out = tmp_path_factory.mktemp("acc-example")
    return accelerate_loop(out, toy, daemon.socket, "--save-every", str(SAVE_EVERY), daemon=daemon)


@pytest.fixture(scope="module")
def resumed(
    trained: Launch, toy: ToyData, no_daemon: Path, tmp_path_factory: pytest.TempPathFactory
) -> Launch:
    assert_ended_well(trained)
    state = trained.out / "checkpoints" / f"step_{SAVE_EVERY}"
    assert state.is_dir(), f"no {state.name} among {sorted(state.parent.iterdir())}"
    out = tmp_path_factory.mktemp("acc-example-resumed")
    return accelerate_loop(out, toy, no_daemon, "--save-every", str(SAVE_EVERY), "--resume", str(state))


def test_the_accelerate_example_trains_every_epoch_on_every_sample_once(
    trained: Launch, toy: ToyData
) -> None:
    assert_ended_well(trained)
    found = traces(trained)
    assert_each_epoch_reads_the_dataset_once(found, dataset=toy.train_keys)
    assert_no_sample_repeats_within_an_epoch_on_a_rank(found)
    assert_equal_steps(found)
    assert_new_order_each_epoch(found)


def test_the_accelerate_example_loader_length_is_the_steps_of_each_epoch(trained: Launch) -> None:
    assert_length_is_the_steps_of_every_epoch(traces(trained))


def test_the_accelerate_example_reads_its_shards_through_the_daemon(
    trained: Launch, daemon: Daemon, toy: ToyData
) -> None:
    traces(trained)
    assert_read_through_the_daemon(trained, daemon, dataset_bytes=toy.shards_bytes())


def test_the_accelerate_example_evaluates_every_sample_once_each_run(trained: Launch, toy: ToyData) -> None:
    found = traces(trained)
    assert [len(report["evals"]) for report in found] == [EPOCHS] * 2
    assert_every_evaluation_reads_each_sample_once(found, toy.val_keys)


def test_the_accelerate_example_resumes_from_load_state_exactly(trained: Launch, resumed: Launch) -> None:
    assert_ended_well(resumed)
    assert_resumed_exactly(traces(trained), traces(resumed), SAVE_EVERY)


def test_every_accelerate_evaluation_reads_the_same_samples_in_the_same_order(
    trained: Launch, resumed: Launch
) -> None:
    compared = assert_evaluations_read_the_same_samples_in_the_same_order(traces(trained), traces(resumed))
    print(f"\n{compared} evaluation runs compared (2 ranks, 2 launches): the same samples in the same order")
