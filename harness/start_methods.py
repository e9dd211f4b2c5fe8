"""How test processes start DataLoader workers (and simulated ranks): the start methods users choose.

"default" is what a user gets without asking: torch's DataLoader leaves `multiprocessing_context` at None and
uses multiprocessing's default, fork on Linux. It is tested first; "forkserver" and "spawn" are the variants
a user picks (and the ones that show a pipeline and its loader state pickle). The fixtures `start_method`
and `any_start_method` in tests/conftest.py parametrize over these names.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

DEFAULT = "default"
# Every loader behaviour runs under these two: what users get, and the pickling variant with cheap starts.
LOADER_METHODS = (DEFAULT, "forkserver")
# The resume contract and a few representative loader tests also run under spawn (a fresh interpreter per
# worker imports torch: about a second per worker start here, too slow for every loader test).
ALL_METHODS = (*LOADER_METHODS, "spawn")

# TorchLoader's thread workers (`workers="threads"`): not a start method, the other way workers run; every
# loader behaviour that applies to both runs under LOADER_MODES (`loader_workers` gives the arguments).
THREADS = "threads"
LOADER_MODES = (*LOADER_METHODS, THREADS)

# What forkserver workers import once, in the server, before it forks each worker.
FORKSERVER_PRELOAD = ["torch.utils.data", "shardcache", "shardcache.sources.tars"]


def worker_context(method: str) -> Any:
    """The `multiprocessing_context` for DataLoader workers started with `method` (a name in ALL_METHODS).

    "default" gives None, which DataLoader and TorchLoader treat as not given: torch's default start method,
    fork on Linux, the one users get. "forkserver" gives a forkserver context with torch and shardcache
    preloaded, so that each worker starts as a cheap fork of a clean server (a fresh interpreter per worker
    would import torch each time), and its workers receive the pipeline pickled, as under spawn. "spawn"
    gives a spawn context: a fresh interpreter per worker, nothing inherited.
    """
    if method == DEFAULT:
        return None
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(FORKSERVER_PRELOAD)
    return context


def process_context(method: str) -> Any:
    """A multiprocessing context for plain processes (Process, Queue, pools) started with `method`."""
    return worker_context(method) or multiprocessing.get_context()


def loader_workers(mode: str) -> dict[str, Any]:
    """TorchLoader's arguments for workers run as `mode`: a start method of worker processes (a name in
    ALL_METHODS), or THREADS."""
    if mode == THREADS:
        return {"workers": THREADS}
    return {"multiprocessing_context": worker_context(mode)}
