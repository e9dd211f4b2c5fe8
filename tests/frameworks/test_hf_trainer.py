"""The Hugging Face Trainer trains from shardcache on two CPU ranks (torchrun, gloo, 2 workers).

Each fixture is one `torchrun --standalone --nproc_per_node 2` launch of `hf_trainer_train.py`, running
one or more `trainer.train()` in turn, shared by the tests that read its reports: every key each rank's
`compute_loss` saw, by global step and pass. A loader without a length needs `max_steps` (70: three whole
passes of 20 steps and part of a fourth), and the Trainer counts one pass over the loader as an epoch.
Launches run under the watchdog (240 s; `ddp_timeout=60`).

- `Trainer(train_dataset=<shardcache Dataset>)`: the Trainer builds a DataLoader and prepares it through
  Accelerate's dispatcher (rank 0 iterates it, every rank gets a slice of each batch). Every epoch must
  see every sample, at least once: Accelerate completes the last, short batch with samples of the first
  (up to world_size * batch_size - 1 = 15 repeats per epoch). Nothing may be lost.
- The recipe over shards without sample counts (the TorchLoader has no length, the Trainer restarts its
  epoch count at 0 on a resume; with a length, `tests/frameworks/test_examples.py`): a Trainer
  whose `get_train_dataloader()` returns a TorchLoader, with `shardcache.transformers.ShardcacheCallback()`:
  every sample once per epoch less `even="drop"`'s remainder (fewer than world_size), equal steps, a new
  order each epoch, and a `resume_from_checkpoint` from the checkpoint of step 27 (7 steps into epoch 1)
  that sees exactly what the uninterrupted run saw from step 27 on.
- The same TorchLoader without the callback: its mid-epoch resume (the Trainer's replay through
  Accelerate's `skip_first_batches`) must fail on every rank with an error naming `ShardcacheCallback`,
  never replay silently, nor fail on a missing attribute.
- `train_dataset=` with a mid-epoch `resume_from_checkpoint` cannot be exact (without a length the
  Trainer replays `global_step` batches of its epoch 0 through `skip_first_batches`): it must fail, naming
  the TorchLoader recipe, never replay silently.

Fixtures: `trained`, through a real daemon: the train_dataset run, the recipe and the bare TorchLoader
(checkpoints at steps 27, 54 and 70, the last). `restarted`, no daemon (SHARDCACHE_SOCKET names a path
where none listens): each run again from a fresh output directory holding only its checkpoint of step 27,
with `trainer.train(resume_from_checkpoint=True)` (a run stopped after that checkpoint, restarted as users
restart one): the recipe first, then the bare TorchLoader (which records its error), then the
train_dataset run, which must fail the launch.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.devservers import Daemon
from tests.frameworks.framework_checks import (
    Launch,
    assert_completed,
    assert_each_epoch_reads_the_dataset_once,
    assert_ended_well,
    assert_equal_steps,
    assert_failed_naming,
    assert_new_order_each_epoch,
    assert_no_sample_repeats_within_an_epoch_on_a_rank,
    assert_read_through_the_daemon,
    assert_resumed_exactly,
    keys_from_step,
    launch_env,
    reports,
    require,
    run,
    torchrun,
)
from tests.frameworks.training_plan import BATCH, WORLD

require("transformers")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SAVE_STEPS = 27  # epoch 1 holds global steps 20..39: the checkpoint of step 27 is in its middle
DISPATCH_REPEATS = WORLD * BATCH - 1


def hf_trainer(
    out: Path,
    shards: str,
    socket: str | Path,
    *args: str,
    daemon: Daemon | None = None,
    workers: str = "processes",
) -> Launch:
    command = torchrun("hf_trainer_train.py", "--shards", shards, "--out", str(out), *args)
    return run(command, out, launch_env(socket, workers), daemon)


@pytest.fixture(scope="module")
def trained(
    framework_workers: str, shards: str, daemon: Daemon, tmp_path_factory: pytest.TempPathFactory
) -> Launch:
    """Through the daemon: train_dataset, then the TorchLoader recipe; checkpoints every 27 steps."""
    out = tmp_path_factory.mktemp("hf-trained")
    args = ["--runs", "train_dataset,torchloader,bare", "--save-steps", str(SAVE_STEPS)]
    return hf_trainer(out, shards, daemon.socket, *args, daemon=daemon, workers=framework_workers)


@pytest.fixture(scope="module")
def restarted(
    framework_workers: str,
    trained: Launch,
    shards: str,
    no_daemon: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Launch:
    """No daemon: each run restarted from its checkpoint of step 27; the recipe, the bare TorchLoader, then
    train_dataset (last: it must fail)."""
    out = tmp_path_factory.mktemp("hf-restarted")
    for run_ in ("torchloader", "bare", "train_dataset"):
        assert_completed(trained, run_)
        checkpoint = trained.out / run_ / "trainer" / f"checkpoint-{SAVE_STEPS}"
        assert checkpoint.is_dir(), f"no {checkpoint.name} among {sorted(checkpoint.parent.iterdir())}"
        shutil.copytree(checkpoint, out / f"{run_}_resumed" / "trainer" / checkpoint.name)
    runs = "torchloader_resumed,bare_resumed,train_dataset_resumed"
    args = ["--runs", runs, "--save-steps", str(SAVE_STEPS)]
    return hf_trainer(out, shards, no_daemon, *args, workers=framework_workers)


# -- Trainer(train_dataset=<shardcache Dataset>) ----------------------------------------------------------


def test_a_train_dataset_loses_no_sample_in_any_epoch(trained: Launch) -> None:
    found = reports(trained, "train_dataset")
    assert_each_epoch_reads_the_dataset_once(found, lost_at_most=0, repeats_at_most=DISPATCH_REPEATS)


def test_a_train_dataset_takes_equal_steps_on_both_ranks(trained: Launch) -> None:
    assert_equal_steps(reports(trained, "train_dataset"))


def test_a_train_dataset_reads_a_new_order_each_epoch(trained: Launch) -> None:
    assert_new_order_each_epoch(reports(trained, "train_dataset"))


def test_a_mid_epoch_resume_of_a_train_dataset_fails_naming_the_torchloader_recipe(
    trained: Launch, restarted: Launch
) -> None:
    what = "(no resumed reports)"
    if (restarted.out / "train_dataset_resumed" / "rank0.json").exists():
        tail = keys_from_step(reports(trained, "train_dataset")[0], SAVE_STEPS)
        resumed = keys_from_step(reports(restarted, "train_dataset_resumed")[0], SAVE_STEPS)
        what = f"rank 0 read {resumed[:4]}... where the uninterrupted run read {tail[:4]}..., " + (
            "the same" if resumed == tail else "a different sequence"
        )
    assert_failed_naming(
        restarted,
        "train_dataset_resumed",
        "TorchLoader",
        silently=f"resume_from_checkpoint of a train_dataset from step {SAVE_STEPS}: {what}",
        after=["torchloader_resumed", "bare_resumed"],
    )


def test_a_mid_epoch_resume_of_a_torchloader_without_the_callback_fails_naming_it(restarted: Launch) -> None:
    found = reports(restarted, "bare_resumed")
    errors = [report["error"] for report in found]
    assert all(error and "ShardcacheCallback" in error for error in errors), (
        f"the resume of a TorchLoader without ShardcacheCallback did not fail naming it on every rank: "
        f"{errors}; completed {[report['completed'] for report in found]}"
    )
    assert all(error.startswith("ConfigError: [UnsupportedResume]") for error in errors), errors


# -- the recipe: get_train_dataloader() returns a TorchLoader, with ShardcacheCallback ---------------------


def test_the_torchloader_recipe_reads_every_sample_once_per_epoch(trained: Launch) -> None:
    found = reports(trained, "torchloader")
    assert_each_epoch_reads_the_dataset_once(found)
    assert_no_sample_repeats_within_an_epoch_on_a_rank(found)


def test_the_torchloader_recipe_takes_equal_steps_on_both_ranks(trained: Launch) -> None:
    assert_equal_steps(reports(trained, "torchloader"))


def test_the_torchloader_recipe_reads_a_new_order_each_epoch(trained: Launch) -> None:
    assert_new_order_each_epoch(reports(trained, "torchloader"))


def test_the_runs_read_their_shards_through_the_daemon(trained: Launch, daemon: Daemon, shards: str) -> None:
    reports(trained, "torchloader")
    assert_read_through_the_daemon(trained, daemon, shards)


def test_every_run_through_the_daemon_ends_without_error(trained: Launch) -> None:
    assert_ended_well(trained)


def test_resume_from_a_mid_epoch_checkpoint_with_the_callback_is_exact(
    trained: Launch, restarted: Launch
) -> None:
    assert_resumed_exactly(
        reports(trained, "torchloader"), reports(restarted, "torchloader_resumed"), SAVE_STEPS
    )
