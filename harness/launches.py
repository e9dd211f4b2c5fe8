"""Jobs of two (or more) simulated nodes on one machine, started the way each launcher starts them.

Every node has its own daemon (`harness.cluster.NodeSet`: own cache dir and socket; SHARDCACHE_SOCKET
names it to the node's processes), all daemons fetch from one S3 endpoint, and each process writes a
report (`harness.launched_reader`, `harness.lightning_nodes`). A launch is the list of commands, one per
process the launcher would start by itself, with their environments; the caller runs them (under a
watchdog in tests) and reads the reports with `rank_reports`.

- `torchrun_nodes`: `torchrun --nnodes N --node-rank k --nproc-per-node P`, one per node, meeting at a
  c10d rendezvous on 127.0.0.1 (torchrun sets LOCAL_WORLD_SIZE and GROUP_WORLD_SIZE).
- `srun_nodes`: what `srun -N N --ntasks-per-node P` starts: one process per task with Slurm's variables
  (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_TASKS_PER_NODE as `P(xN)`, ...), and nothing else.
- `lightning_nodes`: `python script` per node with MASTER_ADDR, MASTER_PORT and NODE_RANK, as Lightning's
  docs launch `Trainer(num_nodes=N)`; its launcher starts the node's other ranks. Each node runs in a UTS
  namespace of its own (`harness.cluster.on_host`): the process group's hosts are what tells nodes apart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.cluster import on_host
from harness.devservers import free_tcp_port, stop_process
from shardcache.shards import ShardRef

REPO = Path(__file__).resolve().parents[1]
READER = REPO / "harness" / "launched_reader.py"
LIGHTNING = REPO / "harness" / "lightning_nodes.py"
# What an outer launcher or cluster would leave in the environment of the run: a launch sets its own.
_LAUNCHER_NAMES = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "NODE_RANK"}
)
_LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "TORCHELASTIC_", "MASTER_", "PL_")


@dataclass(frozen=True)
class Process:
    """One command a launcher starts by itself (a node's launcher, or a task), and its environment."""

    command: list[str]
    env: dict[str, str]
    name: str


def write_manifest(refs: Sequence[ShardRef], path: Path) -> Path:
    """A manifest of the shards with their sizes (node shares balanced by bytes, as `ClusterData.capacities`
    sizes the caches)."""
    lines = [json.dumps({"url": ref.url, "size": ref.size}) for ref in refs]
    path.write_text("\n".join(lines) + "\n")
    return path


def base_env(socket: str) -> dict[str, str]:
    """The environment of one node's processes: its daemon's socket, the repository importable, one thread
    per process, no GPU, and no variable of a launcher around the run."""
    inherited = {
        key: value
        for key, value in os.environ.items()
        if key not in _LAUNCHER_NAMES and not key.startswith(_LAUNCHER_PREFIXES)
    }
    path = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {
        **inherited,
        "SHARDCACHE_SOCKET": socket,
        "PYTHONPATH": os.pathsep.join(path),
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }


def torchrun_nodes(sockets: Sequence[str], per_node: int, args: Sequence[str]) -> list[Process]:
    """`torchrun --nnodes N --node-rank k` on each node, running the reader with `args`."""
    port = free_tcp_port()
    processes = []
    for node, socket in enumerate(sockets):
        command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(sockets)}"]
        command += [f"--nproc-per-node={per_node}", f"--node-rank={node}", "--rdzv-backend=c10d"]
        command += [f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=launchers", "--max-restarts=0"]
        command += [str(READER), *args]
        processes.append(Process(command, base_env(socket), f"torchrun node {node}"))
    return processes


def srun_nodes(sockets: Sequence[str], per_node: int, args: Sequence[str]) -> list[Process]:
    """The tasks of `srun -N len(sockets) --ntasks-per-node per_node reader args`, each with the Slurm
    variables srun gives it (and MASTER_ADDR/MASTER_PORT, which a DDP script under srun sets itself)."""
    nodes = len(sockets)
    tasks = nodes * per_node
    port = free_tcp_port()
    step = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "train",
        "SLURM_STEP_ID": "0",
        "SLURM_STEPID": "0",
        "SLURM_NTASKS": str(tasks),
        "SLURM_NPROCS": str(tasks),
        "SLURM_STEP_NUM_TASKS": str(tasks),
        "SLURM_NNODES": str(nodes),
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_STEP_NUM_NODES": str(nodes),
        "SLURM_TASKS_PER_NODE": f"{per_node}(x{nodes})",
        "SLURM_STEP_TASKS_PER_NODE": f"{per_node}(x{nodes})",
        "SLURM_NTASKS_PER_NODE": str(per_node),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    processes = []
    for task in range(tasks):
        node = task // per_node
        env = {**base_env(sockets[node]), **step}
        env.update(SLURM_PROCID=str(task), SLURM_LOCALID=str(task % per_node), SLURM_NODEID=str(node))
        processes.append(Process([sys.executable, str(READER), *args], env, f"srun task {task}"))
    return processes


def lightning_nodes(sockets: Sequence[str], per_node: int, args: Sequence[str]) -> list[Process]:
    """Lightning's multi-node launch: the script on each node (in its own UTS namespace, host `node-k`)
    with MASTER_ADDR, MASTER_PORT and NODE_RANK; `--nodes` and `--devices` tell its Trainer."""
    port = free_tcp_port()
    processes = []
    for node, socket in enumerate(sockets):
        script = [sys.executable, str(LIGHTNING), *args, "--nodes", str(len(sockets))]
        script += ["--devices", str(per_node)]
        env = {**base_env(socket), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        env["NODE_RANK"] = str(node)
        processes.append(Process(on_host(f"node-{node}", script), env, f"lightning node {node}"))
    return processes


def run_processes(processes: Sequence[Process], deadline_s: float) -> list[tuple[int, str]]:
    """Run every process at once to its end (killed past `deadline_s`); (exit status, output) of each."""
    outputs = [tempfile.TemporaryFile() for _ in processes]
    running = [
        subprocess.Popen(p.command, env=p.env, stdout=out, stderr=subprocess.STDOUT)
        for p, out in zip(processes, outputs, strict=True)
    ]
    deadline = time.monotonic() + deadline_s
    results = []
    try:
        for proc, out in zip(running, outputs, strict=True):
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stop_process(proc)
            out.seek(0)
            results.append((proc.returncode, out.read().decode(errors="replace")))
    finally:  # interrupted, or one hung: none is left running
        for proc, out in zip(running, outputs, strict=True):
            stop_process(proc)
            out.close()
    return results


LAUNCHERS = {"torchrun": torchrun_nodes, "srun": srun_nodes, "lightning": lightning_nodes}


def rank_reports(out: Path, world_size: int) -> list[dict[str, Any]]:
    """Every rank's report, by rank (an AssertionError naming the ranks that wrote none)."""
    missing = [r for r in range(world_size) if not (out / f"rank{r}.json").exists()]
    assert not missing, f"ranks {missing} wrote no report under {out}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world_size)]
