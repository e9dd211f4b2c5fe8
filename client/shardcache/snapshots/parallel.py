"""Run the leading `map` stages of a cache build on several workers, in order, with bounded work in flight.

Processes, not threads: the maps worth caching (decode, tokenise, feature extraction) are often pure
Python and hold the GIL, so threads would not run them in parallel. The functions reach the workers by
reference (pickled once, in the pool initializer), which works because `.cache()` refuses lambdas and local
closures. Workers start with `forkserver` (fork would copy Lance's and Arrow's threads and their locks).
Inside a daemonic process (a DataLoader worker) no child processes are allowed, so threads are used there.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

logger = logging.getLogger(__name__)

Fn = Callable[[Any], object]  # the user's map functions: they may take any sample type

_CHAIN: list[Fn] = []  # set once per worker process by _install (the pool initializer)


def _install(fns: Sequence[Fn]) -> None:
    _CHAIN[:] = list(fns)


def _apply(fns: Sequence[Fn], chunk: list[object]) -> list[object]:
    out = []
    for sample in chunk:
        for fn in fns:
            sample = fn(sample)
        out.append(sample)
    return out


def _apply_installed(chunk: list[object]) -> list[object]:
    return _apply(_CHAIN, chunk)


def _executor(workers: int, fns: Sequence[Fn]) -> tuple[Executor, Callable[[list[object]], list[object]]]:
    if multiprocessing.current_process().daemon:
        logger.info(
            "cache build inside a daemonic process (a DataLoader worker): leading maps run on threads"
        )
        return ThreadPoolExecutor(workers), lambda chunk: _apply(fns, chunk)
    method = "forkserver" if sys.platform == "linux" else "spawn"
    pool = ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context(method), initializer=_install, initargs=(list(fns),)
    )
    return pool, _apply_installed


def parallel_map(
    samples: Iterable[object], fns: Sequence[Fn], workers: int, *, chunk_size: int = 16
) -> Iterator[object]:
    """`fns` applied in turn to every sample, on `workers` workers, yielding results in input order.

    At most `2 * workers` chunks of `chunk_size` samples are in flight, so memory stays bounded whatever
    the stream's length. Chunks amortise the cost of sending samples between processes.

    Args:
        samples: The input stream (read in this process).
        fns: The map functions, applied left to right.
        workers: Number of worker processes (threads inside a daemonic process).
        chunk_size: Samples per task.
    """
    if workers <= 1:
        for sample in samples:
            for fn in fns:
                sample = fn(sample)
            yield sample
        return
    executor, apply = _executor(workers, fns)
    in_flight: deque[Future[list[object]]] = deque()
    iterator = iter(samples)
    try:
        while chunk := list(itertools.islice(iterator, chunk_size)):
            in_flight.append(executor.submit(apply, chunk))
            if len(in_flight) >= 2 * workers:
                yield from in_flight.popleft().result()
        while in_flight:
            yield from in_flight.popleft().result()
    finally:
        for future in in_flight:
            future.cancel()
        executor.shutdown(wait=True, cancel_futures=True)
