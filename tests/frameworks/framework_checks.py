"""What the framework tests share: the shards, the launch under a watchdog, and the checks on the reports.

A launch writes one JSON report per rank (`tests.frameworks.train_support.Recorder`): every batch a
training step saw, with its global step and its epoch. The checks read only those: what the framework's
training step was given, not what the loader thinks it yielded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.daemon_api import metric
from harness.devservers import Daemon
from harness.pipelines import write_tar
from harness.watchdog import run_watched
from tests.frameworks.training_plan import EPOCHS, WORLD

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
EXAMPLES = REPO / "examples" / "frameworks"
# 8 shards of unequal sizes (315 samples): no rank's share is a round number of batches.
SHARD_SAMPLES = (35, 44, 38, 41, 36, 43, 37, 41)
ALL_KEYS = frozenset(f"s{s}_{i}" for s, n in enumerate(SHARD_SAMPLES) for i in range(n))
# What even="drop" (the default under torch.distributed) leaves out per epoch: fewer than world_size.
DROP_BOUND = WORLD - 1
LAUNCH_DEADLINE_S = 240.0  # the scripts' process groups time out after 60 s: a stuck rank fails first

Report = dict[str, Any]


def require(module: str) -> None:
    """Skip the test module when a framework is not installed (a failure under CI=true, see the root
    conftest), without importing it here: frameworks are imported by the launched scripts only, so their
    import-time warnings never meet pytest's `filterwarnings = error`."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(
            f"{module} is not installed (the dev extra pins it: pip install -e '.[dev]')",
            allow_module_level=True,
        )


def write_shards(root: Path) -> str:
    """The 8 tar shards under `root` (keys `s{shard}_{i}`, one json member each), and beside them their
    manifest (`manifest_of`); their brace pattern."""
    root.mkdir(parents=True, exist_ok=True)
    for s, count in enumerate(SHARD_SAMPLES):
        members = [(f"s{s}_{i}.json", json.dumps({"shard": s, "i": i}).encode()) for i in range(count)]
        write_tar(root / f"shard_{s}.tar", members)
    lines = [
        json.dumps({"url": str(root / f"shard_{s}.tar"), "num_samples": count}) + "\n"
        for s, count in enumerate(SHARD_SAMPLES)
    ]
    manifest_of(str(root)).write_text("".join(lines))
    return str(root / f"shard_{{0..{len(SHARD_SAMPLES) - 1}}}.tar")


def manifest_of(shards: str) -> Path:
    """The manifest `write_shards` wrote beside the shards of `shards` (their pattern, or their folder):
    the same shards with their sample counts, so a dataset over it has a length."""
    folder = Path(shards) if Path(shards).is_dir() else Path(shards).parent
    return folder / "shards.manifest.jsonl"


@dataclass(frozen=True)
class ToyData:
    """The examples' toy dataset as `examples/frameworks/toy.py` wrote it: its folder, and every key of each
    split (read back from the manifests, whose shard `shard_<s>.tar` holds keys `s<s>_0` ...)."""

    root: Path
    train_keys: frozenset[str]
    val_keys: frozenset[str]

    def shards_bytes(self) -> int:
        return sum(path.stat().st_size for path in self.root.glob("*/shard_*.tar"))


def write_toy_data(root: Path) -> ToyData:
    """Run `python examples/frameworks/toy.py <root>`, as a user makes the examples' data."""
    done = run_watched([sys.executable, str(EXAMPLES / "toy.py"), str(root)], 120.0, cwd=REPO)
    assert done.returncode == 0, f"toy.py failed:\n{done.stdout}"

    def keys(split: str) -> frozenset[str]:
        found: set[str] = set()
        for line in (root / f"{split}.manifest.jsonl").read_text().splitlines():
            row = json.loads(line)
            shard = int(Path(row["url"]).stem.removeprefix("shard_"))
            found.update(f"s{shard}_{i}" for i in range(int(row["num_samples"])))
        return frozenset(found)

    return ToyData(root, keys("train"), keys("val"))


# What a cluster or launcher around the test run would leave in the environment: Lightning and torchrun
# would take the launch for part of that job (Lightning picks SLURMEnvironment from SLURM_* variables).
_LAUNCHER = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK"})
_LAUNCHER_PREFIXES = ("SLURM_", "TORCHELASTIC_", "MASTER_", "PL_", "ACCELERATE_")


def launch_env(socket: str | Path, workers: str = "processes") -> dict[str, str]:
    """The environment of a launch: SHARDCACHE_SOCKET names the daemon (or a path where none runs), every
    TorchLoader's workers run as `workers` (SHARDCACHE_LOADER_WORKERS: "processes" or "threads"), the
    repository root is importable (the scripts import `tests.frameworks.train_support`), one thread per
    process, nothing reaches the network, and no outer launcher's variables leak in."""
    path = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    inherited = {
        key: value
        for key, value in os.environ.items()
        if key not in _LAUNCHER and not key.startswith(_LAUNCHER_PREFIXES)
    }
    return {
        **inherited,
        "SHARDCACHE_SOCKET": str(socket),
        "SHARDCACHE_LOADER_WORKERS": workers,
        "PYTHONPATH": os.pathsep.join(path),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }


def python(name: str, *args: str, folder: Path = HERE) -> list[str]:
    """The command line of `python <folder>/<name> <args>` (by default a script of tests/frameworks/)."""
    return [sys.executable, str(folder / name), *args]


def torchrun(name: str, *args: str, folder: Path = HERE) -> list[str]:
    """The command line of `torchrun --standalone --nproc_per_node 2 <folder>/<name> <args>`."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}"]
    return [*launcher, str(folder / name), *args]


@dataclass
class Launch:
    """One finished launch: its exit status, output and wall time, and where its ranks wrote their reports."""

    command: str
    returncode: int
    output: str
    wall_s: float
    out: Path
    daemon_opens: float | None = None  # the daemon's opens during this launch, when it ran with one

    def describe(self) -> str:
        head = f"{self.command}\nexit status {self.returncode} after {self.wall_s:.1f} s"
        return f"{head}; the last of its output:\n{self.output[-8000:]}"


def run(command: Sequence[str], out: Path, env: Mapping[str, str], daemon: Daemon | None = None) -> Launch:
    """Run `command` under the watchdog (past the deadline: every process's stacks, and the test fails).
    Prints its wall time (`pytest -s` shows it); with `daemon`, counts the opens it served meanwhile."""
    before = opens(daemon) if daemon is not None else None
    start = time.monotonic()
    done = run_watched(command, LAUNCH_DEADLINE_S, env=env, cwd=REPO)
    wall = time.monotonic() - start
    served = None if daemon is None or before is None else opens(daemon) - before
    through = "" if served is None else f", {served:g} opens through the daemon"
    print(f"\n[{wall:.1f} s, exit status {done.returncode}{through}] {' '.join(command[1:])}")
    return Launch(" ".join(command), done.returncode, done.stdout, wall, out, served)


def reports(launch: Launch, run: str) -> list[Report]:
    """The reports (by rank) of one run of a launch; fails with the launch's output when a rank wrote none
    (the run never started: an earlier run of the same launch failed). A run that raised reports what its
    steps saw until then, with `completed` false, so the checks show how far each rank got."""
    paths = sorted((launch.out / run).glob("rank*.json"))
    found = sorted((json.loads(path.read_text()) for path in paths), key=lambda r: int(r["rank"]))
    ranks = [int(report["rank"]) for report in found]
    assert ranks == list(range(WORLD)), f"{run}: reports from ranks {ranks} only:\n{launch.describe()}"
    return found


def traces(launch: Launch) -> list[Report]:
    """The step traces (by rank) an example wrote under `<out>/trace` (`examples/frameworks/toy.py`'s
    `StepTrace`), as reports the checks read: training batches under ``batches``, each with its epoch (the
    framework's, or its step // the loader's length where the framework numbers none: the Trainer's)."""
    found = reports(launch, "trace")
    for report in found:
        length = report["length"]
        for batch in report["train"]:
            if batch["epoch"] is None:
                assert length, f"rank {report['rank']}: no epochs and no length to derive them from"
                batch["epoch"] = batch["step"] // length
        report["batches"] = report["train"]
    return found


def assert_ended_well(launch: Launch) -> None:
    assert launch.returncode == 0, f"the launch failed:\n{launch.describe()}"


def assert_completed(launch: Launch, run: str) -> None:
    """Every rank's `run` returned (trained to its end) instead of raising."""
    completed = [bool(report["completed"]) for report in reports(launch, run)]
    assert all(completed), f"{run} raised on ranks {completed}:\n{launch.describe()}"


def assert_failed_naming(
    launch: Launch, run: str, words: str, silently: str, after: Sequence[str] = ()
) -> None:
    """`run`, the last run of the launch, failed loudly: a non-zero exit with an error naming `words`.
    `silently` says what a run to the end would have done instead. The runs `after` came first in the same
    launch and must have written their reports, so the failure is `run`'s own."""
    for earlier in after:
        reports(launch, earlier)
    assert launch.returncode != 0, f"{run} ran to the end silently: {silently}\n{launch.describe()}"
    assert words in launch.output, f"{run} failed, but its output does not name {words}:\n{launch.describe()}"


# -- reading the reports ---------------------------------------------------------------------------------


def epoch_keys(report: Report, epoch: int) -> list[str]:
    """The keys one rank's training steps saw in `epoch`, in order."""
    return [key for batch in report["batches"] if batch["epoch"] == epoch for key in batch["keys"]]


def epoch_steps(report: Report, epoch: int) -> int:
    return sum(1 for batch in report["batches"] if batch["epoch"] == epoch)


def keys_from_step(report: Report, step: int) -> list[str]:
    """The keys of the batches at global step `step` and after, in order."""
    return [key for batch in report["batches"] if batch["step"] >= step for key in batch["keys"]]


def steps_seen(report: Report) -> list[int]:
    return [int(batch["step"]) for batch in report["batches"]]


# -- the checks ------------------------------------------------------------------------------------------


def assert_each_epoch_reads_the_dataset_once(
    reports: Sequence[Report],
    *,
    lost_at_most: int = DROP_BOUND,
    repeats_at_most: int = 0,
    epochs: int = EPOCHS,
    dataset: frozenset[str] = ALL_KEYS,
) -> None:
    """Every epoch, across the ranks: only `dataset` keys, at most `repeats_at_most` repeats (a framework's
    padding) and at most `lost_at_most` samples never seen (even="drop"'s remainder)."""
    for epoch in range(epochs):
        keys = [key for report in reports for key in epoch_keys(report, epoch)]
        counts = Counter(keys)
        strangers = sorted(set(counts) - dataset)
        repeats = sum(n - 1 for n in counts.values())
        lost = sorted(dataset - set(counts))
        assert not strangers, f"epoch {epoch}: keys not in the dataset: {strangers[:10]}"
        assert repeats <= repeats_at_most, (
            f"epoch {epoch}: {repeats} repeated samples (at most {repeats_at_most} allowed), e.g. "
            f"{[k for k, n in counts.items() if n > 1][:10]}"
        )
        assert len(lost) <= lost_at_most, (
            f"epoch {epoch}: {len(lost)} of {len(dataset)} samples never seen (at most {lost_at_most} "
            "allowed); "
            f"{len(keys)} samples read; per rank {[len(epoch_keys(r, epoch)) for r in reports]}; "
            f"e.g. {lost[:10]}"
        )


def assert_no_sample_repeats_within_an_epoch_on_a_rank(
    reports: Sequence[Report], epochs: int = EPOCHS
) -> None:
    for report in reports:
        for epoch in range(epochs):
            keys = epoch_keys(report, epoch)
            repeated = sorted(k for k, n in Counter(keys).items() if n > 1)
            assert not repeated, f"rank {report['rank']}, epoch {epoch}: read twice: {repeated[:10]}"


def assert_equal_steps(reports: Sequence[Report], epochs: int = EPOCHS) -> None:
    """Every rank took the same, non-zero number of steps in every epoch (else DDP waits on a rank)."""
    for epoch in range(epochs):
        steps = [epoch_steps(report, epoch) for report in reports]
        assert steps[0] > 0 and steps == [steps[0]] * len(steps), f"epoch {epoch}: steps per rank {steps}"


def assert_new_order_each_epoch(reports: Sequence[Report], epochs: int = EPOCHS) -> None:
    """On every rank, epoch k's sequence of keys differs from epoch k-1's."""
    for report in reports:
        for epoch in range(1, epochs):
            before, now = epoch_keys(report, epoch - 1), epoch_keys(report, epoch)
            assert before and now, f"rank {report['rank']}: epoch {epoch - 1} or {epoch} read nothing"
            assert now != before, (
                f"rank {report['rank']}: epoch {epoch} read the same {len(now)} samples in the same order as "
                f"epoch {epoch - 1} (starting {now[:4]})"
            )


def assert_resumed_exactly(full: Sequence[Report], resumed: Sequence[Report], step: int) -> None:
    """The resumed run trained steps `step`, `step`+1, ... and saw exactly what the uninterrupted run saw
    from that step on, on every rank: none repeated, none lost, same order."""
    for before, after in zip(full, resumed, strict=True):
        rank = before["rank"]
        first = steps_seen(after)[:1]
        assert first == [step], f"rank {rank}: the resumed run's first step is {first}, expected [{step}]"
        expected, got = keys_from_step(before, step), keys_from_step(after, step)
        if got == expected:
            continue
        seen_before = {key for batch in before["batches"] if batch["step"] < step for key in batch["keys"]}
        lost = Counter(expected) - Counter(got)
        extra = Counter(got) - Counter(expected)
        at = next((i for i, pair in enumerate(zip(got, expected, strict=False)) if pair[0] != pair[1]), None)
        raise AssertionError(
            f"rank {rank}: from step {step} on, the resumed run read {len(got)} samples, the "
            f"uninterrupted run {len(expected)}; first difference at sample {at}; {lost.total()} lost "
            f"(e.g. {sorted(lost)[:6]}); {extra.total()} extra (e.g. {sorted(extra)[:6]}); "
            f"{len(set(got) & seen_before)} of what it read had been read before step {step}; "
            f"resumed begins {got[:6]}, expected {expected[:6]}"
        )


def assert_length_is_the_steps_of_every_epoch(reports: Sequence[Report], epochs: int = EPOCHS) -> None:
    """The training loader's `len()` that the example recorded is the steps each epoch took on each rank."""
    for report in reports:
        steps = [epoch_steps(report, epoch) for epoch in range(epochs)]
        assert report["length"] is not None and steps == [report["length"]] * epochs, (
            f"rank {report['rank']}: len() said {report['length']}, the epochs took {steps} steps"
        )


def evaluation_runs(report: Report) -> list[list[tuple[str, bool]]]:
    """Each evaluation run of one rank: its samples in order, each with whether it is a real one (not one
    of the repeats that even out the ranks)."""
    return [list(zip(run["keys"], run["valid"], strict=True)) for run in report["evals"]]


def assert_evaluations_read_the_same_samples_in_the_same_order(*launches: Sequence[Report]) -> int:
    """Every evaluation run of each rank, in every launch, read the same samples in the same order (with the
    same repeats marked); returns how many runs were compared."""
    compared = 0
    for rank in range(WORLD):
        runs = [run for reports in launches for run in evaluation_runs(reports[rank])]
        assert runs, f"rank {rank}: no evaluation ran"
        for i, run in enumerate(runs[1:], 1):
            assert run == runs[0], (
                f"rank {rank}: evaluation run {i} read {[k for k, _ in run][:8]}..., run 0 read "
                f"{[k for k, _ in runs[0]][:8]}... ({len(run)} against {len(runs[0])} samples)"
            )
        compared += len(runs)
    return compared


def assert_every_evaluation_reads_each_sample_once(
    reports: Sequence[Report], dataset: frozenset[str]
) -> None:
    """In every evaluation run, across the ranks, each real sample exactly once; every rank the same number
    of samples (so the same steps); the repeats that make them equal (fewer than the ranks) marked."""
    for i, runs in enumerate(zip(*(evaluation_runs(report) for report in reports), strict=True)):
        real = Counter(key for run in runs for key, valid in run if valid)
        repeated = sorted(key for key, n in real.items() if n > 1)
        assert set(real) == dataset and not repeated, (
            f"evaluation run {i}: {len(dataset - set(real))} samples missing (e.g. "
            f"{sorted(dataset - set(real))[:6]}), {len(repeated)} read twice (e.g. {repeated[:6]})"
        )
        sizes = [len(run) for run in runs]
        pads = sum(1 for run in runs for _, valid in run if not valid)
        assert sizes == [sizes[0]] * len(sizes) and pads < WORLD, (
            f"evaluation run {i}: samples per rank {sizes}, {pads} repeats marked"
        )


# -- the daemon ------------------------------------------------------------------------------------------


def opens(daemon: Daemon) -> float:
    """Opens the daemon served so far (hits, joins of a running download, misses)."""
    return sum(
        metric(daemon, "shardcache_requests_total", f'result="{result}"')
        for result in ("hit", "inflight", "miss")
    )


def shard_bytes(pattern: str) -> int:
    return sum(path.stat().st_size for path in Path(pattern).parent.glob("shard_*.tar"))


def assert_read_through_the_daemon(
    launch: Launch, daemon: Daemon, shards: str | None = None, *, dataset_bytes: int | None = None
) -> None:
    """The launch opened every shard of every epoch through the daemon, which fetched the dataset (the
    shards of `shards`' folder, or `dataset_bytes`)."""
    served = launch.daemon_opens
    assert served is not None and served >= 8 * EPOCHS, f"the daemon served {served} opens"
    expected = dataset_bytes if dataset_bytes is not None else shard_bytes(str(shards))
    assert metric(daemon, "shardcache_fetched_bytes_total") >= expected
