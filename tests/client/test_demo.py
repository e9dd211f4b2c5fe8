"""The trainer demo (examples/trainer_demo, `make demo`) end to end, tiny: S3 endpoint, daemon, two ranks
with workers, two epochs, the table; and `shardcache demo`, which runs it from a clone of the repository."""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from shardcache import cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY = ("--shards", "4", "--val-shards", "2", "--shard-mb", "0.5", "--no-progress")


def demo_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainer_demo", *TINY, *args]


def demo_env(cwd: Path) -> dict[str, str]:
    """As `make demo` runs it: the example's folder on PYTHONPATH."""
    return {**os.environ, "SHARDCACHE_SOCKET": str(cwd / "unused.sock"), "PYTHONPATH": str(EXAMPLES)}


def samples_per_shard(shard_bytes: int) -> int:
    spec = importlib.util.spec_from_file_location("trainer_demo_data", EXAMPLES / "trainer_demo" / "data.py")
    assert spec is not None and spec.loader is not None
    data = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = data  # its dataclasses look their module up
    spec.loader.exec_module(data)
    return int(data.samples_per_shard(shard_bytes))


def table_rows(stdout: str) -> dict[str, list[str]]:
    """The result table's rows by their first cell ("1", "2", "total")."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["epoch", "opens"])
    rows = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        cells = line.split()
        rows[cells[0]] = cells
    return rows


def test_demo_trains_two_ranks_for_two_epochs_and_prints_the_table(tmp_path: Path) -> None:
    # The preferred metrics port is taken, as a second demo or a running daemon would do: the demo moves on.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = subprocess.run(
            demo_command("--metrics-port", port),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env=demo_env(tmp_path),
        )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = table_rows(result.stdout)
    assert set(rows) == {"1", "2", "total"}
    samples = 4 * samples_per_shard(int(0.5 * 1024 * 1024))
    # header: epoch opens hit-ratio fetched(2 cells) fetched/dataset samples samples/s waits val-acc
    assert [rows[e][6] for e in ("1", "2")] == [str(samples), str(samples)]  # every sample, every epoch
    # A cold cache: the first epoch cannot be all hits (the daemon may prefetch some shards from the plans).
    assert int(rows["1"][2].rstrip("%")) < 100
    assert int(rows["2"][2].rstrip("%")) > 0  # the second epoch hits what the first left in the cache
    assert int(rows["1"][1]) == 4 + 2  # each train shard once, and each validation shard once for .cache()
    assert int(rows["2"][1]) == 4  # validation now reads the Lance cache, not shards
    fetched_first = float(rows["1"][5].rstrip("x"))
    assert fetched_first >= 1.0  # the whole dataset came from S3 once
    assert re.search(r"metrics: http://127\.0\.0\.1:(\d+)/metrics", result.stdout)
    assert f"127.0.0.1:{port}/" not in result.stdout
    assert (tmp_path / ".shardcache" / "shards").is_dir() and (
        tmp_path / ".shardcache" / "preprocessed"
    ).is_dir()


def test_demo_via_the_cli_rejects_too_few_shards_for_the_slots(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "shardcache.cli", "demo", "--shards", "3", "--ranks", "2", "--workers", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--shards" in result.stderr


def test_the_demo_is_not_in_the_package() -> None:
    import shardcache

    package = Path(shardcache.__file__).parent
    assert not list(package.glob("demo*.py")) and not (package / "devservers.py").exists()


def test_demo_via_the_cli_honours_the_demos_flags(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "shardcache.cli", "demo", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "--epochs" in result.stdout and "--no-local-s3" in result.stdout


def test_demo_outside_a_clone_says_how_to_run_it_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # An install from a wheel has no examples/ beside the package.
    monkeypatch.setattr(cli, "find_trainer_demo", lambda: None)
    assert cli.main(["demo", "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "make demo" in err


def test_a_socket_given_before_demo_is_the_demos_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    given: list[list[str]] = []

    def run_demo(args: Sequence[str]) -> int:
        given.append(list(args))
        return 0

    monkeypatch.setattr(cli, "run_demo", run_demo)
    assert cli.main(["--socket", "/run/x.sock", "demo", "--epochs", "1"]) == 0
    assert given == [["--socket", "/run/x.sock", "--epochs", "1"]]
