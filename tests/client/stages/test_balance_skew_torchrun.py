"""TorchLoader.balance under real torchrun with strongly skewed counts: no rank hangs, no item is lost.

Four gloo ranks start from 900, 9, 0 and 3 items (one rank a hundred times another's, one with none), on one
node and on two simulated nodes of two ranks (topology="node"), with and without drop_last, at the stage's
default buffer, chunk and transfer budget. Before the planner set each donor's own item aside, this plan
asked a rank to send items it did not hold: that rank failed on an empty buffer and the others waited for
it. One launch runs every case; the tests below share its reports.

Nothing here can hang CI: every rank dumps its stacks and exits after RANK_WATCHDOG_S, its process group
times out after PG_TIMEOUT_S, and the test stops the launch after LAUNCH_TIMEOUT_S, failing with everything
the ranks printed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

WORKER = Path(__file__).parents[1] / "workers" / "balance_skew_worker.py"
COUNTS = (900, 9, 0, 3)
WORLD = len(COUNTS)
DUMMY = "DUMMY"
RUNS = [
    {"name": f"{layout}-{mode}", "per_node": per_node, "topology": "node", "drop_last": mode == "drop"}
    for layout, per_node in (("one-node", WORLD), ("two-nodes", 2))
    for mode in ("pad", "drop")
]
PG_TIMEOUT_S = 20
RANK_WATCHDOG_S = 40
LAUNCH_TIMEOUT_S = 90.0

Reports = list[dict[str, list[str]]]


def launch(tmp: Path) -> Reports:
    """torchrun on WORLD ranks; each rank's report. Fails the test, with the ranks' output, if one hangs."""
    data = tmp / "skew.jsonl"
    data.write_text("".join(json.dumps({"n": n}) + "\n" for n in COUNTS))
    spec = {
        "data": str(data),
        "out": str(tmp),
        "runs": RUNS,
        "pg_timeout_s": PG_TIMEOUT_S,
        "watchdog_s": RANK_WATCHDOG_S,
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}"]
    command += [str(WORKER), json.dumps(spec)]
    log = tmp / "torchrun.log"
    with log.open("wb") as out:  # a file, not a pipe: a stray rank cannot keep the test reading
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
        try:
            code = proc.wait(timeout=LAUNCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # torchrun stops its ranks on SIGTERM
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            pytest.fail(f"torchrun did not finish in {LAUNCH_TIMEOUT_S} s (a rank hung):\n{log.read_text()}")
    assert code == 0, f"torchrun failed ({code}):\n{log.read_text()[-8000:]}"
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Reports:
    return launch(tmp_path_factory.mktemp("balance-skew"))


def every_item() -> Counter[str]:
    return Counter(f"skew.jsonl:{line}#{copy}" for line, n in enumerate(COUNTS) for copy in range(n))


def yielded(reports: Reports, run: str) -> list[list[str]]:
    return [report[run] for report in reports]


def real(items: list[list[str]]) -> Counter[str]:
    return Counter(item for rank in items for item in rank if item != DUMMY)


@pytest.mark.parametrize("run", [r["name"] for r in RUNS])
def test_every_rank_yields_the_same_number_of_items(reports: Reports, run: str) -> None:
    assert len({len(items) for items in yielded(reports, run)}) == 1


@pytest.mark.parametrize("run", [r["name"] for r in RUNS if not r["drop_last"]])
def test_without_drop_last_every_real_item_is_yielded_exactly_once(reports: Reports, run: str) -> None:
    assert real(yielded(reports, run)) == every_item()


@pytest.mark.parametrize("run", [r["name"] for r in RUNS if r["drop_last"]])
def test_drop_last_yields_no_dummy_and_each_item_at_most_once(reports: Reports, run: str) -> None:
    items = yielded(reports, run)
    assert DUMMY not in {item for rank in items for item in rank}
    assert real(items) <= every_item()
    assert sum(COUNTS) - real(items).total() < WORLD
