"""How often the plain training script hangs: N fresh interpreters per start method, the daemon running.

Each run is `harness/user_script.py` (tar shards on local disk, `TorchLoader(ds, num_workers=2,
batch_size=8)`, 4 epochs, pin_memory) in its own interpreter, two at a time; a run still going after
`--timeout-s` is counted as hung and its process tree is killed. `--checkout DIR` runs the same script
against another checkout of the repository (e.g. a `git worktree` of an older commit), to count before
and after a change in one session; `--persistent false` restarts the workers every epoch (the case that
hung before the fork-safety rules).

    python -m bench.bench_hangs --runs 50
    python -m bench.bench_hangs --runs 50 --checkout /tmp/old --methods fork --persistent false
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.devservers import start_daemon
from harness.pipelines import make_tars
from harness.watchdog import kill_tree

REPO = Path(__file__).resolve().parents[1]


def one_run(command: list[str], env: dict[str, str], cwd: Path, timeout_s: float) -> tuple[str, float]:
    started = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=cwd)
    try:
        status = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        return "hung", time.monotonic() - started
    return ("ok" if status == 0 else f"exit {status}"), time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--methods", default="fork,forkserver,spawn")
    parser.add_argument("--persistent", default="default", choices=["default", "true", "false"])
    parser.add_argument("--timeout-s", type=float, default=60.0)
    parser.add_argument("--checkout", type=Path, default=REPO, help="the repository checkout to run")
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        str(checkout / part) for part in ("client", "daemon", "protocol", ".")
    )
    with tempfile.TemporaryDirectory(prefix="sc-", dir="/tmp") as tmp:
        root = Path(tmp)
        make_tars(root / "shards", 8, 32)
        daemon = start_daemon(root / "d.sock", root / "cache", [str(root)], capacity="1GiB")
        try:
            print(f"checkout {checkout}, persistent_workers {args.persistent}, {args.runs} runs per method")
            print(f"{'start method':<12} {'finished':>9} {'hung':>5} {'failed':>7} {'median s':>9}")
            for method in args.methods.split(","):
                command = [sys.executable, "-m", "harness.user_script"]
                command += ["--shards", str(root / "shards" / "shard_{000000..000007}.tar")]
                command += [
                    "--socket",
                    daemon.socket,
                    "--start-method",
                    method,
                    "--persistent",
                    args.persistent,
                ]
                with ThreadPoolExecutor(2) as pool:
                    runs = [
                        pool.submit(one_run, command, env, checkout, args.timeout_s) for _ in range(args.runs)
                    ]
                    results = [run.result() for run in runs]
                outcomes = [outcome for outcome, _ in results]
                seconds = sorted(s for outcome, s in results if outcome == "ok")
                median = seconds[len(seconds) // 2] if seconds else float("nan")
                ok, hung = outcomes.count("ok"), outcomes.count("hung")
                print(
                    f"{method:<12} {ok:>9} {hung:>5} {len(outcomes) - ok - hung:>7} {median:>9.1f}",
                    flush=True,
                )
        finally:
            daemon.stop()


if __name__ == "__main__":
    main()
