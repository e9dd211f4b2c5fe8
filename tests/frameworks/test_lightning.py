"""PyTorch Lightning trains from shardcache on two CPU ranks (gloo DDP, 2 DataLoader workers, 3 epochs).

Launched as Lightning's docs launch a DDP script (`python script.py`: its "ddp" strategy starts rank 1 by
running the script again). Each fixture is one launch of `lightning_train.py`, running one or more fits in
turn, shared by the tests that read its reports: every key each rank's `training_step` saw, by global step
and epoch. Launches run under the watchdog (240 s; the process group times out after 60 s, so a rank left
waiting fails rather than hangs the test).

Per epoch, across both ranks, every sample is seen once except `even="drop"`'s remainder (fewer than
world_size samples), every rank takes the same number of steps, and each epoch reads a new order.

- `plain_fits`, no daemon (SHARDCACHE_SOCKET names a path where none listens; daemon="auto" reads
  directly): `fit(model, train_dataloaders=TorchLoader(...))`, then a plain DataLoader over a Dataset of
  the shards' manifest, whose `count_samples()` ran at the start, before any Trainer or process group:
  the DataLoader has a length, so Lightning stops each epoch after len(DataLoader) batches, which must be
  the batches its workers yield; Lightning's default end-of-epoch checkpoints.
- `recipe_fits`, through a real daemon: the recipe over shards without sample counts, so the TorchLoader
  has no length and Lightning fetches one batch ahead of the step it checkpoints (with a length:
  `tests/frameworks/test_examples.py`): a DataModule returning the TorchLoader,
  `ShardcacheCallback()`, `ModelCheckpoint(every_n_train_steps=27)` (a checkpoint 7 steps into epoch
  1), which trains on to the end and is the resume reference; then a TorchLoader with the same
  ModelCheckpoint and no callback, which must fail at that checkpoint, naming the callback.
- `resumed_fit`, no daemon: a new launch of the recipe, `fit(..., ckpt_path=<the step-27 checkpoint>)`,
  which must see exactly what the reference saw from step 27 on.
"""

from __future__ import annotations

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
    epoch_steps,
    launch_env,
    manifest_of,
    python,
    reports,
    require,
    run,
)
from tests.frameworks.training_plan import EPOCHS

require("pytorch_lightning")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CHECKPOINT_STEP = 27  # epoch 1 holds global steps 20..39: a checkpoint in its middle


def lightning(
    out: Path,
    shards: str,
    socket: str | Path,
    *args: str,
    daemon: Daemon | None = None,
    workers: str = "processes",
) -> Launch:
    command = python("lightning_train.py", "--shards", shards, "--out", str(out), *args)
    return run(command, out, launch_env(socket, workers), daemon)


@pytest.fixture(scope="module")
def plain_fits(
    framework_workers: str, shards: str, no_daemon: Path, tmp_path_factory: pytest.TempPathFactory
) -> Launch:
    """No daemon: fit on a TorchLoader, then on a plain DataLoader over a Dataset counted at the start."""
    out = tmp_path_factory.mktemp("pl-plain")
    args = ["--runs", "torchloader,dataloader", "--manifest", str(manifest_of(shards))]
    return lightning(out, shards, no_daemon, *args, workers=framework_workers)


@pytest.fixture(scope="module")
def recipe_fits(
    framework_workers: str, shards: str, daemon: Daemon, tmp_path_factory: pytest.TempPathFactory
) -> Launch:
    """Through the daemon: the recipe with a checkpoint at step 27, then the same checkpoint without the
    callback (last: it must fail)."""
    out = tmp_path_factory.mktemp("pl-recipe")
    args = ["--runs", "datamodule,no_callback", "--checkpoint-every", str(CHECKPOINT_STEP)]
    return lightning(out, shards, daemon.socket, *args, daemon=daemon, workers=framework_workers)


@pytest.fixture(scope="module")
def resumed_fit(
    framework_workers: str,
    recipe_fits: Launch,
    shards: str,
    no_daemon: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Launch:
    """No daemon: the recipe again, from the reference's checkpoint of step 27."""
    assert_completed(recipe_fits, "datamodule")
    checkpoint = recipe_fits.out / "datamodule" / "ckpt" / f"step={CHECKPOINT_STEP}.ckpt"
    assert checkpoint.is_file(), f"no {checkpoint.name} among {sorted(checkpoint.parent.iterdir())}"
    out = tmp_path_factory.mktemp("pl-resumed")
    args = ["--runs", "resumed", "--checkpoint-every", str(CHECKPOINT_STEP), "--resume", str(checkpoint)]
    return lightning(out, shards, no_daemon, *args, workers=framework_workers)


# -- ds.count_samples(), then trainer.fit(model, train_dataloaders=DataLoader(ds, ...)) -------------------


def test_a_dataloader_after_count_samples_trains_every_epoch_to_the_end(plain_fits: Launch) -> None:
    epochs = [sorted({batch["epoch"] for batch in r["batches"]}) for r in reports(plain_fits, "dataloader")]
    assert epochs == [list(range(EPOCHS))] * 2, f"epochs each rank trained: {epochs}"
    assert_completed(plain_fits, "dataloader")


def test_a_dataloader_after_count_samples_reads_every_sample_once_per_epoch(plain_fits: Launch) -> None:
    found = reports(plain_fits, "dataloader")
    assert_each_epoch_reads_the_dataset_once(found)
    assert_no_sample_repeats_within_an_epoch_on_a_rank(found)


def test_a_dataloader_after_count_samples_takes_equal_steps_on_both_ranks(plain_fits: Launch) -> None:
    assert_equal_steps(reports(plain_fits, "dataloader"))


def test_a_dataloader_over_a_manifest_has_the_length_of_the_batches_its_workers_yield(
    plain_fits: Launch,
) -> None:
    # torch's DataLoader.__len__ batches the dataset's length as one stream; each worker batches its own
    # share, and Lightning stops an epoch after len() batches: a short length would lose the last ones.
    found = reports(plain_fits, "dataloader")
    planned = [report["length"] for report in found]
    assert planned[0] is not None, "Lightning saw no length for the DataLoader over the manifest"
    assert_each_epoch_reads_the_dataset_once(found)
    for report in found:
        steps = [epoch_steps(report, epoch) for epoch in range(EPOCHS)]
        assert steps == [report["length"]] * EPOCHS, f"rank {report['rank']}: len {planned}, steps {steps}"


def test_a_dataloader_reads_a_new_order_each_epoch(plain_fits: Launch) -> None:
    assert_new_order_each_epoch(reports(plain_fits, "dataloader"))


# -- trainer.fit(model, train_dataloaders=TorchLoader(ds, batch_size=8, num_workers=2)) -------------------


def test_fit_on_a_torchloader_reads_every_sample_once_per_epoch(plain_fits: Launch) -> None:
    found = reports(plain_fits, "torchloader")
    assert_each_epoch_reads_the_dataset_once(found)
    assert_no_sample_repeats_within_an_epoch_on_a_rank(found)


def test_fit_on_a_torchloader_takes_equal_steps_on_both_ranks(plain_fits: Launch) -> None:
    assert_equal_steps(reports(plain_fits, "torchloader"))


def test_fit_on_a_torchloader_reads_a_new_order_each_epoch(plain_fits: Launch) -> None:
    assert_new_order_each_epoch(reports(plain_fits, "torchloader"))


def test_fit_with_end_of_epoch_checkpoints_ends_without_error(plain_fits: Launch) -> None:
    assert_ended_well(plain_fits)


# -- the recipe: a DataModule, ShardcacheCallback, a mid-epoch ModelCheckpoint; through the daemon --------


def test_the_datamodule_recipe_trains_to_the_end(recipe_fits: Launch) -> None:
    assert_completed(recipe_fits, "datamodule")


def test_the_datamodule_recipe_reads_every_sample_once_per_epoch(recipe_fits: Launch) -> None:
    found = reports(recipe_fits, "datamodule")
    assert_each_epoch_reads_the_dataset_once(found)
    assert_no_sample_repeats_within_an_epoch_on_a_rank(found)


def test_the_datamodule_recipe_takes_equal_steps_on_both_ranks(recipe_fits: Launch) -> None:
    assert_equal_steps(reports(recipe_fits, "datamodule"))


def test_the_datamodule_recipe_reads_a_new_order_each_epoch(recipe_fits: Launch) -> None:
    assert_new_order_each_epoch(reports(recipe_fits, "datamodule"))


def test_the_datamodule_recipe_reads_its_shards_through_the_daemon(
    recipe_fits: Launch, daemon: Daemon, shards: str
) -> None:
    reports(recipe_fits, "datamodule")
    assert_read_through_the_daemon(recipe_fits, daemon, shards)


def test_the_callback_a_checkpoint_and_the_daemon_change_nothing_a_step_sees(
    recipe_fits: Launch, plain_fits: Launch
) -> None:
    # The same data, batch size and workers: the recipe (callback, mid-epoch checkpoint, daemon) and the
    # plain TorchLoader fit (none of them) train on the same batches.
    for recipe, plain in zip(
        reports(recipe_fits, "datamodule"), reports(plain_fits, "torchloader"), strict=True
    ):
        assert recipe["batches"] == plain["batches"], f"rank {recipe['rank']}: the two fits' batches differ"


def test_fit_from_a_mid_epoch_checkpoint_with_the_callback_resumes_exactly(
    recipe_fits: Launch, resumed_fit: Launch
) -> None:
    full = reports(recipe_fits, "datamodule")
    assert_resumed_exactly(full, reports(resumed_fit, "resumed"), CHECKPOINT_STEP)


def test_without_the_callback_a_mid_epoch_checkpoint_fails_naming_the_callback(recipe_fits: Launch) -> None:
    assert_failed_naming(
        recipe_fits,
        "no_callback",
        "ShardcacheCallback",
        silently="a mid-epoch checkpoint of a TorchLoader under DDP was saved without ShardcacheCallback "
        "(a state one batch behind the step, and rank 0's position only)",
        after=["datamodule"],
    )
