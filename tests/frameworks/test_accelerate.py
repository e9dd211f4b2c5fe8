"""Hugging Face Accelerate trains from shardcache on two CPU ranks (torchrun, gloo, 2 workers, 3 epochs).

Each fixture is one `torchrun --standalone --nproc_per_node 2` launch of `accelerate_train.py`, running one
or more runs in turn, shared by the tests that read its reports: every key each rank's training step saw,
by global step and epoch. The loop is Accelerate's documented one (`for epoch ...: for batch in loader:`)
and never calls `set_epoch`. Launches run under the watchdog (240 s; the process group times out after
60 s).

What each way of handing the data to `accelerator.prepare` must give, per epoch across both ranks:

- a TorchLoader (returned unchanged): every sample once, less `even="drop"`'s remainder (fewer than
  world_size samples); each rank reads its own share.
- a plain DataLoader, dispatched (the default: rank 0 iterates it, every rank gets a slice of each batch):
  every sample at least once. Accelerate's `even_batches` completes the last, short batch with samples
  from the first one: up to world_size * batch_size - 1 = 15 repeats per epoch. Nothing may be lost.
- a plain DataLoader with `dispatch_batches=False` (every rank iterates it; IterableDatasetShard keeps
  each rank's slice): every sample at least once. IterableDatasetShard runs inside each DataLoader worker
  and completes each worker's last buffer of world_size * batch_size samples with that worker's first
  samples: up to num_workers * (world_size * batch_size - 1) = 30 repeats per epoch. Nothing may be lost.

Equal steps per rank and a new order each epoch hold for all three. `prepared`, through a real daemon,
runs the TorchLoader, the dispatched and the sharded DataLoader in turn. The resume recipe
(`register_for_checkpointing`, `save_state`, `load_state`) and the evaluation with `gather_for_metrics` are
`examples/frameworks/accelerate_loop.py`, run by `tests/frameworks/test_examples.py`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.devservers import Daemon
from tests.frameworks.framework_checks import (
    Launch,
    assert_each_epoch_reads_the_dataset_once,
    assert_ended_well,
    assert_equal_steps,
    assert_new_order_each_epoch,
    assert_no_sample_repeats_within_an_epoch_on_a_rank,
    assert_read_through_the_daemon,
    launch_env,
    reports,
    require,
    run,
    torchrun,
)
from tests.frameworks.training_plan import BATCH, WORKERS, WORLD

require("accelerate")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

DISPATCH_REPEATS = WORLD * BATCH - 1
SHARD_REPEATS = WORKERS * (WORLD * BATCH - 1)


def accelerate(
    out: Path,
    shards: str,
    socket: str | Path,
    *args: str,
    daemon: Daemon | None = None,
    workers: str = "processes",
) -> Launch:
    command = torchrun("accelerate_train.py", "--shards", shards, "--out", str(out), *args)
    return run(command, out, launch_env(socket, workers), daemon)


@pytest.fixture(scope="module")
def prepared(
    framework_workers: str, shards: str, daemon: Daemon, tmp_path_factory: pytest.TempPathFactory
) -> Launch:
    """Through the daemon: TorchLoader, dispatched and sharded DataLoader."""
    out = tmp_path_factory.mktemp("acc-prepared")
    args = ["--runs", "torchloader,dispatch,shard"]
    return accelerate(out, shards, daemon.socket, *args, daemon=daemon, workers=framework_workers)


# -- accelerator.prepare(model, optimizer, TorchLoader(...)) ----------------------------------------------


def test_a_prepared_torchloader_reads_every_sample_once_per_epoch(prepared: Launch) -> None:
    found = reports(prepared, "torchloader")
    assert_each_epoch_reads_the_dataset_once(found)
    assert_no_sample_repeats_within_an_epoch_on_a_rank(found)


def test_a_prepared_torchloader_takes_equal_steps_on_both_ranks(prepared: Launch) -> None:
    assert_equal_steps(reports(prepared, "torchloader"))


def test_a_prepared_torchloader_reads_a_new_order_each_epoch_without_set_epoch(prepared: Launch) -> None:
    assert_new_order_each_epoch(reports(prepared, "torchloader"))


def test_the_runs_read_their_shards_through_the_daemon(prepared: Launch, daemon: Daemon, shards: str) -> None:
    reports(prepared, "torchloader")
    assert_read_through_the_daemon(prepared, daemon, shards)


# -- accelerator.prepare(model, optimizer, DataLoader(ds, ...)): dispatched from rank 0 --------------------


def test_a_dispatched_dataloader_loses_no_sample_in_any_epoch(prepared: Launch) -> None:
    found = reports(prepared, "dispatch")
    assert_each_epoch_reads_the_dataset_once(found, lost_at_most=0, repeats_at_most=DISPATCH_REPEATS)


def test_a_dispatched_dataloader_takes_equal_steps_on_both_ranks(prepared: Launch) -> None:
    assert_equal_steps(reports(prepared, "dispatch"))


def test_a_dispatched_dataloader_reads_a_new_order_each_epoch(prepared: Launch) -> None:
    assert_new_order_each_epoch(reports(prepared, "dispatch"))


# -- the same with DataLoaderConfiguration(dispatch_batches=False): sharded on every rank ------------------


def test_a_sharded_dataloader_loses_no_sample_in_any_epoch(prepared: Launch) -> None:
    found = reports(prepared, "shard")
    assert_each_epoch_reads_the_dataset_once(found, lost_at_most=0, repeats_at_most=SHARD_REPEATS)


def test_a_sharded_dataloader_takes_equal_steps_on_both_ranks(prepared: Launch) -> None:
    assert_equal_steps(reports(prepared, "shard"))


def test_a_sharded_dataloader_reads_a_new_order_each_epoch(prepared: Launch) -> None:
    assert_new_order_each_epoch(reports(prepared, "shard"))


def test_every_run_through_the_daemon_ends_without_error(prepared: Launch) -> None:
    assert_ended_well(prepared)
