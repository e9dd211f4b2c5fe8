"""Equal work per rank under real torchrun: gloo, DistributedDataParallel, TorchLoader workers, no join().

Each test launches `python -m torch.distributed.run --standalone` on `ddp_worker.py`, a plain training loop
over a brace list of tar shards with unequal sample counts. A rank that ran out of batches first would leave
the others waiting at their next gradient all-reduce: the worker's process group times out after 60 s and
the launch is killed after 120 s, so an imbalance fails the test instead of hanging it for gloo's default
30 minutes. One launch per world size runs every mode (the default, "drop", "pad") for two epochs; its
reports are shared by the tests below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.daemon_api import metric
from harness.pipelines import write_tar

pytest.importorskip("torch.distributed")

WORKER = Path(__file__).parents[1] / "workers" / "ddp_worker.py"
SHARD_SAMPLES = (95, 60, 120, 33, 101, 77, 58, 140, 12, 89)
TOTAL = sum(SHARD_SAMPLES)
ALL_KEYS = {f"s{s:03d}_{i:04d}" for s, n in enumerate(SHARD_SAMPLES) for i in range(n)}
MODES = ("default", "drop", "pad")
EPOCHS = 2
LAUNCH_TIMEOUT_S = 120.0  # the worker's process group times out after 60 s: a stuck all-reduce fails first

Reports = list[dict[str, Any]]
Sweep = Callable[[int], Reports]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Ten tar shards of unequal sample counts, as a plain brace list."""
    root = tmp_path_factory.mktemp("ddp-shards")
    for s, count in enumerate(SHARD_SAMPLES):
        members = []
        for i in range(count):
            key = f"s{s:03d}_{i:04d}"
            members += [(f"{key}.txt", f"{s}-{i}".encode()), (f"{key}.json", json.dumps({"i": i}).encode())]
        write_tar(root / f"shard_{s:03d}.tar", members)
    return str(root / "shard_{000..009}.tar")


def torchrun(nproc: int, out: Path, *args: str) -> Reports:
    """Launch the worker on `nproc` ranks; every rank's report, by rank.

    Each rank's stdout and stderr go to its own file under `<out>/logs` (torchrun's `--log-dir` with
    `--redirects 3`), so a failure shows the tail of every rank's log, not the end of interleaved output.
    """
    logs = out / "logs"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    command += ["--log-dir", str(logs), "--redirects", "3"]
    command += [str(WORKER), "--out", str(out), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"torchrun with {nproc} ranks did not finish in {LAUNCH_TIMEOUT_S} s (a rank hung): {exc}\n"
            + rank_logs(logs)
        )
    assert done.returncode == 0, (
        f"torchrun with {nproc} ranks failed (exit {done.returncode}); torchrun's stderr ends:\n"
        f"{done.stderr[-3000:]}\n{rank_logs(logs)}"
    )
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def rank_logs(logs: Path, tail: int = 6000) -> str:
    """The end of every rank's stdout and stderr under torchrun's log folder, by rank and stream."""
    # torchrun writes <logs>/<run id>/attempt_<n>/<local rank>/{stdout,stderr}.log
    parts = []
    for path in sorted(logs.glob("*/attempt_*/*/*.log")):
        text = path.read_text(errors="replace")
        cut = "" if len(text) <= tail else f"[... {len(text) - tail} characters cut ...]\n"
        parts.append(f"----- {path.relative_to(logs)} -----\n{cut}{text[-tail:]}")
    return "\n".join(parts) or f"(no rank logs under {logs})"


@pytest.fixture(scope="module")
def sweep(shards: str, tmp_path_factory: pytest.TempPathFactory) -> Sweep:
    """The reports of one launch per world size, running every mode for two epochs (launched on first use)."""
    launched: dict[int, Reports] = {}

    def get(world_size: int) -> Reports:
        if world_size not in launched:
            out = tmp_path_factory.mktemp(f"ddp-ws{world_size}")
            launched[world_size] = torchrun(
                world_size, out, "--shards", shards, "--modes", ",".join(MODES), "--epochs", str(EPOCHS)
            )
        return launched[world_size]

    return get


def epoch_keys(reports: Reports, mode: str, epoch: int) -> list[str]:
    return [key for report in reports for key in report["modes"][mode][epoch]["keys"]]


def bound(world_size: int) -> int:
    """What `drop` may leave out, and `pad` may repeat, per epoch."""
    return max(world_size - 1, TOTAL // 100)


def test_a_plain_ddp_loop_takes_the_same_steps_on_both_ranks_every_epoch(sweep: Sweep) -> None:
    reports = sweep(2)
    for epoch in range(EPOCHS):
        steps = [report["modes"]["default"][epoch]["steps"] for report in reports]
        assert steps[0] > 0 and steps == [steps[0]] * 2, f"epoch {epoch}: steps per rank {steps}"


def test_set_epoch_reorders_the_samples_each_epoch(sweep: Sweep) -> None:
    reports = sweep(2)
    assert epoch_keys(reports, "default", 0) != epoch_keys(reports, "default", 1)


def test_the_default_under_torchrun_is_drop(sweep: Sweep) -> None:
    reports = sweep(2)
    for epoch in range(EPOCHS):
        keys = epoch_keys(reports, "default", epoch)
        assert not any(key.endswith("#pad") for key in keys)
        assert len(keys) == len(set(keys)), "a sample was read twice in one epoch"
        assert set(keys) <= ALL_KEYS
        assert TOTAL - len(keys) < 2, f"epoch {epoch} dropped {TOTAL - len(keys)} samples over 2 ranks"


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_takes_equal_steps_at_every_world_size(sweep: Sweep, world_size: int, mode: str) -> None:
    reports = sweep(world_size)
    for epoch in range(EPOCHS):
        steps = [report["modes"][mode][epoch]["steps"] for report in reports]
        samples = [len(report["modes"][mode][epoch]["keys"]) for report in reports]
        assert steps == [steps[0]] * world_size, f"{mode}, epoch {epoch}: steps per rank {steps}"
        assert samples == [samples[0]] * world_size, f"{mode}, epoch {epoch}: samples per rank {samples}"


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("mode", ["default", "drop"])
def test_drop_reads_each_sample_at_most_once_and_loses_at_most_the_bound(
    sweep: Sweep, world_size: int, mode: str
) -> None:
    reports = sweep(world_size)
    for epoch in range(EPOCHS):
        keys = epoch_keys(reports, mode, epoch)
        assert not any(key.endswith("#pad") for key in keys)
        assert len(keys) == len(set(keys)) and set(keys) <= ALL_KEYS
        assert TOTAL - len(keys) <= bound(world_size), f"{mode} dropped {TOTAL - len(keys)} of {TOTAL}"


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_pad_reads_every_sample_and_marks_at_most_the_bound_in_repeats(sweep: Sweep, world_size: int) -> None:
    reports = sweep(world_size)
    for epoch in range(EPOCHS):
        keys = epoch_keys(reports, "pad", epoch)
        real = [key for key in keys if not key.endswith("#pad")]
        repeats = [key.removesuffix("#pad") for key in keys if key.endswith("#pad")]
        assert sorted(real) == sorted(ALL_KEYS), "pad must read every sample once, unmarked"
        assert len(repeats) <= bound(world_size) and set(repeats) <= ALL_KEYS
        assert len(keys) % world_size == 0


def test_two_simulated_nodes_count_their_shares_and_take_equal_steps(shards: str, tmp_path: Path) -> None:
    # 4 ranks told they run 2 per node: node placement, and a counting pass split by node and gathered.
    modes = ",".join(MODES)
    reports = torchrun(4, tmp_path, "--shards", shards, "--modes", modes, "--local-world-size", "2")
    for mode in MODES:
        steps = [report["modes"][mode][0]["steps"] for report in reports]
        assert steps == [steps[0]] * 4, f"{mode}: steps per rank {steps}"
        keys = epoch_keys(reports, mode, 0)
        real = [key for key in keys if not key.endswith("#pad")]
        assert len(real) == len(set(real)) and set(real) <= ALL_KEYS
        if mode == "pad":
            assert set(real) == ALL_KEYS and len(keys) - TOTAL <= bound(4)
        else:
            assert real == keys and TOTAL - len(keys) <= bound(4)


def test_a_mid_epoch_resume_under_torchrun_finishes_the_epoch_exactly(
    sweep: Sweep, shards: str, tmp_path: Path
) -> None:
    full = sweep(2)
    stop_after = 7
    first = torchrun(
        2, tmp_path / "first", "--shards", shards, "--epochs", "1", "--stop-after", str(stop_after)
    )
    states = tmp_path / "states.json"
    states.write_text(json.dumps({str(r["rank"]): r["modes"]["default"][0]["state"] for r in first}))
    second = torchrun(2, tmp_path / "second", "--shards", shards, "--resume", str(states))
    for rank in range(2):
        head = first[rank]["modes"]["default"][0]
        tail = second[rank]["modes"]["default"][0]
        assert head["steps"] == stop_after
        assert tail["steps"] == full[rank]["modes"]["default"][0]["steps"] - stop_after
        assert head["keys"] + tail["keys"] == full[rank]["modes"]["default"][0]["keys"], (
            f"rank {rank} diverged"
        )


def test_ranks_take_equal_steps_reading_through_a_daemon(
    shards: str, daemon_factory: Callable[..., Any], tmp_path: Path
) -> None:
    folder = Path(shards).parent
    daemon = daemon_factory(allow=[str(folder)])
    reports = torchrun(2, tmp_path / "out", "--shards", shards, "--daemon", str(daemon.socket))
    steps = [report["modes"]["default"][0]["steps"] for report in reports]
    assert steps == [steps[0]] * 2
    keys = epoch_keys(reports, "default", 0)
    assert len(keys) == len(set(keys)) and TOTAL - len(keys) < 2
    shard_bytes = sum(path.stat().st_size for path in folder.glob("shard_*.tar"))
    assert metric(daemon, "shardcache_fetched_bytes_total") >= shard_bytes
