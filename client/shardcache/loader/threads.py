"""TorchLoader's thread workers (`workers="threads"`): each worker's slot on a thread of the trainer.

Why: a DataLoader worker process hands every batch over through a fresh shared-memory segment (collated in
the worker, its file descriptor passed over a pipe, mapped and unpickled in the trainer); on a light
pipeline two worker processes ran 3.9x slower than the trainer's own process alone. The expensive stages of
real pipelines (reading, JPEG/PNG decode, resize, numpy and torch operations) release the GIL, so threads
run them in parallel and the batch reaches the training loop as the object the worker built: no pickle,
no copy.

The same as worker processes: thread w runs as DataLoader worker w (`shardcache.context.worker_thread`),
iterating the same `WorkerStream` (slot dp_rank x num_workers + w), and `MergeNode` takes the items in the
same rotation, so the order and every resume state are those of process workers: a state taken in one mode
resumes in the other.

How: each worker thread puts its items into its own bounded channel (`prefetch_factor` items, 2 by
default, as torch's), so at most num_workers x prefetch_factor payloads wait and a worker ahead of the
rotation blocks instead of piling up; the trainer takes them in the rotation (worker 0, 1, ..., an ended
worker skipped), as the DataLoader delivers in order. While the trainer computes, the threads read and
decode the next batches. `pin_memory=True` pins on a thread of its own, as the DataLoader does.

Forks: each step of a worker (one `next()` of its stream) runs inside the fork gate
(`shardcache.loader.fork_gate`), so a fork never copies a lock one of them holds.

Why not torchdata.nodes (`ParallelMapper` on threads): it maps a function over one source's items in
parallel, and its state is the source's position plus the items in flight; here the unit of parallelism is
a slot's whole stateful pipeline, whose position is the state the process workers record. What is written
by hand is the bounded channel and the rotation (~200 lines), and the fork gate.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from shardcache.context import worker_thread
from shardcache.errors import ConfigError
from shardcache.loader.fork_gate import FORK_GATE, THREAD_PREFIX
from shardcache.loader.stream import Item, WorkerStream
from shardcache.node import State

logger = logging.getLogger(__name__)

THREAD_NAME = THREAD_PREFIX + "{}"  # then the worker id: what the stall warning and py-spy show
# How long close() waits for a worker thread to end.
JOIN_WAIT_S = 10.0


@dataclass(frozen=True)
class ThreadOptions:
    """The DataLoader arguments thread workers honour.

    Attributes:
        prefetch_factor: Items each worker may have ready ahead of the trainer.
        pin_memory: Pin each payload (on its own thread) before the trainer takes it.
        pin_memory_device: The device to pin for ("": the current accelerator).
        timeout: Seconds the trainer waits for an item before RuntimeError (0: for ever).
        worker_init_fn: Called with the worker id on each worker thread before it reads.
    """

    prefetch_factor: int = 2
    pin_memory: bool = False
    pin_memory_device: str = ""
    timeout: float = 0.0
    worker_init_fn: Callable[[int], None] | None = None


class _Ended:
    """A worker thread's last message: its stream ended (after its done item, or at once when exhausted)."""


_ENDED = _Ended()


@dataclass(frozen=True)
class _Failed:
    """A worker thread's stream raised `error`; the trainer re-raises it as it is."""

    worker: int
    error: BaseException


class _Channel:
    """A bounded queue from one producer thread to the trainer that `close()` ends on both sides.

    Written by hand: `queue.Queue` cannot wake a producer blocked on a full queue when the consumer goes
    away (`Queue.shutdown` is Python 3.13's).
    """

    def __init__(self, capacity: int) -> None:
        self._items: deque[object] = deque()
        self._capacity = capacity
        # Reentrant: a close() run by a finaliser that the collector started inside put() or get() on the
        # same thread must not wait for itself.
        self._ready = threading.Condition(threading.RLock())
        self._closed = False

    def put(self, item: object) -> bool:
        """Add `item`, waiting for room; False once the channel is closed (the item is dropped)."""
        with self._ready:
            while len(self._items) >= self._capacity and not self._closed:
                self._ready.wait()
            if self._closed:
                return False
            self._items.append(item)
            self._ready.notify_all()
            return True

    def get(self, timeout: float | None) -> object:
        """The next item, waiting for it (TimeoutError after `timeout` seconds; None: for ever)."""
        with self._ready:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not self._items:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError
                self._ready.wait(remaining)
            item = self._items.popleft()
            self._ready.notify_all()
            return item

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._items.clear()
            self._ready.notify_all()


class ThreadWorkers:
    """The workers of one iteration on threads; iterating yields their items in the rotation (see module).

    Args:
        stream: What each worker iterates (each thread runs as its worker, so it reads its own slot).
        num_workers: Worker threads.
        options: The DataLoader arguments they honour.
    """

    def __init__(self, stream: WorkerStream, num_workers: int, options: ThreadOptions) -> None:
        self.num_workers = num_workers
        self._stream = stream
        self._options = options
        self._channels = [_Channel(options.prefetch_factor) for _ in range(num_workers)]
        self._ended: set[int] = set()
        self._turn = 0
        self._stopped = False
        self._pid = os.getpid()
        self.threads = {
            w: threading.Thread(target=self._work, args=(w,), name=THREAD_NAME.format(w), daemon=True)
            for w in range(num_workers)
        }
        self._pinned: _Channel | None = None
        self._pinner: threading.Thread | None = None
        for thread in self.threads.values():
            thread.start()
        if options.pin_memory:
            self._start_pinning()

    def _work(self, worker: int) -> None:
        """One worker thread: its stream's items into its channel, then `_ENDED` (or the error it raised)."""
        channel, options = self._channels[worker], self._options
        try:
            with worker_thread(worker, self.num_workers):
                if options.worker_init_fn is not None:
                    with FORK_GATE.step():
                        options.worker_init_fn(worker)
                items = iter(self._stream)
                try:
                    while not self._stopped:
                        with FORK_GATE.step():
                            item = next(items, _ENDED)
                        if item is _ENDED or not channel.put(item):
                            break
                finally:
                    with FORK_GATE.step():  # its shards and plans are released on this thread, as read
                        close = getattr(items, "close", None)
                        if close is not None:
                            close()
        except BaseException as error:  # re-raised in the trainer's thread, which takes it in turn
            channel.put(_Failed(worker, error))
        channel.put(_ENDED)

    def __iter__(self) -> Iterator[Item]:
        return self

    def __next__(self) -> Item:
        if self._pinned is not None:
            try:
                item = self._pinned.get(self._timeout())
            except TimeoutError:
                raise self._timed_out("the pin-memory thread") from None
            if isinstance(item, _Failed):
                raise _reraised(item)
            if item is _ENDED:
                raise StopIteration
            return item  # type: ignore[return-value]
        return self._next_in_turn()

    def _timeout(self) -> float | None:
        return self._options.timeout or None

    def _timed_out(self, waited_for: str) -> RuntimeError:
        """The DataLoader's own error for a `timeout` (its message, and the thread waited for)."""
        return RuntimeError(
            f"TorchLoader timed out after {self._options.timeout} seconds waiting for {waited_for} "
            "(timeout=; the stall warning shows where each worker thread is)"
        )

    def _next_in_turn(self) -> Item:
        """The next item of the rotation: the worker whose turn it is, an ended worker skipped."""
        ended, workers = self._ended, self.num_workers
        while len(ended) < workers:
            worker = self._turn
            if worker in ended:
                self._turn = (worker + 1) % workers
                continue
            try:
                item = self._channels[worker].get(self._timeout())
            except TimeoutError:
                raise self._timed_out(f"worker thread {worker}") from None
            if isinstance(item, _Failed):
                raise _reraised(item)
            if item is _ENDED:
                ended.add(worker)
                continue
            self._turn = (worker + 1) % workers
            return item  # type: ignore[return-value]
        raise StopIteration

    def _start_pinning(self) -> None:
        """Pin on a thread of its own (as the DataLoader's pin-memory thread), in the rotation's order."""
        pin = pinner(self._options.pin_memory_device)
        if pin is None:
            logger.warning("TorchLoader(pin_memory=True): no accelerator available, batches are not pinned")
            return
        pinned = self._pinned = _Channel(self._options.prefetch_factor)

        def run() -> None:
            try:
                while not self._stopped:
                    try:
                        wid, payload, state, done, times = self._next_in_turn()
                    except StopIteration:
                        break
                    if not pinned.put((wid, pin(payload), state, done, times)):
                        return
            except BaseException as error:
                pinned.put(_Failed(-1, error))
            pinned.put(_ENDED)

        self._pinner = threading.Thread(target=run, name="shardcache-pin-memory", daemon=True)
        self._pinner.start()

    def close(self) -> None:
        """Stop the worker threads and wait for them (each ends its stream, releasing its shards)."""
        if self._stopped or os.getpid() != self._pid:  # a forked child has none of these threads
            return
        self._stopped = True
        for channel in (*self._channels, *([self._pinned] if self._pinned is not None else [])):
            channel.close()
        threads = [*self.threads.values(), *([self._pinner] if self._pinner is not None else [])]
        deadline = time.monotonic() + JOIN_WAIT_S
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        running = [t.name for t in threads if t.is_alive() and t is not threading.current_thread()]
        if running:
            logger.warning(
                "TorchLoader: worker threads %s still run %.0fs after the loader closed (a stage that does "
                "not return: see the stall warning's stacks); they end with their current item",
                running,
                JOIN_WAIT_S,
            )


def pinner(device: str) -> Callable[[object], object] | None:
    """torch's pinning of a payload for `device` ("": the current accelerator), None without one."""
    import torch
    from torch.utils.data._utils.pin_memory import pin_memory

    if not device and not torch.cuda.is_available():
        return None

    def pin(payload: object) -> object:
        pinned: object = pin_memory(payload, device or None)  # type: ignore[no-untyped-call]
        return pinned

    return pin


def _reraised(failed: _Failed) -> BaseException:
    """The error a worker thread raised, as it was (type, fields, traceback), saying where it was raised."""
    error = failed.error
    where = "the pin-memory thread" if failed.worker < 0 else f"worker thread {failed.worker}"
    error.add_note(f"(raised in TorchLoader's {where})")
    return error


class ThreadLauncher:
    """What `MergeNode` opens for one iteration with thread workers: `ThreadWorkers` over `stream`, the
    given workers resuming from their states (the launcher of worker processes is `WorkerLauncher`)."""

    def __init__(self, stream: WorkerStream, num_workers: int, options: ThreadOptions) -> None:
        self.stream = stream
        self.num_workers = num_workers
        self.options = options
        self.running: ThreadWorkers | None = None  # for the stall warning: the threads and where they are

    def __call__(self, states: dict[int, State], exhausted: frozenset[int]) -> ThreadWorkers:
        stream = self.stream.with_order(self.stream.resumed(states, exhausted), None)
        self.running = ThreadWorkers(stream, self.num_workers, self.options)
        return self.running

    def threads(self) -> dict[int, threading.Thread]:
        """The worker threads of the running iteration, by worker id (empty before it starts)."""
        running = self.running
        return {} if running is None else dict(running.threads)


# How TorchLoader's workers run: "processes", torch DataLoader worker processes; "threads", threads of the
# trainer's process (this module). The same slots, orders and resume states either way.
WORKER_MODES = ("processes", "threads")
WORKERS_ENV = "SHARDCACHE_LOADER_WORKERS"


def worker_mode(given: str | None) -> str:
    """The mode of a TorchLoader's workers: `given`, else `SHARDCACHE_LOADER_WORKERS`, else "processes"
    (a job switches every loader it builds, framework recipes included, without a code change)."""
    name, value = "workers", given
    if given is None:
        name, value = WORKERS_ENV, os.environ.get(WORKERS_ENV) or "processes"
    if value not in WORKER_MODES:
        raise ConfigError(f"{name}={value!r}: expected one of {WORKER_MODES}")
    return value


def thread_options(kwargs: dict[str, Any]) -> ThreadOptions:
    """The thread workers' options from TorchLoader's DataLoader arguments (`kwargs` as the DataLoader would
    get them); ConfigError for an argument that means nothing without worker processes."""
    given = dict(kwargs)
    ignored = [name for name in _PROCESS_ONLY if given.pop(name, None) is not None]
    if ignored:
        logger.debug("TorchLoader(workers='threads') ignores %s (they apply to worker processes)", ignored)
    options = ThreadOptions()
    prefetch = given.pop("prefetch_factor", None)
    if prefetch is not None:
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ConfigError(f"prefetch_factor={prefetch!r}: expected an integer >= 1")
        options = ThreadOptions(prefetch_factor=prefetch)
    timeout = given.pop("timeout", 0) or 0
    if not isinstance(timeout, (int, float)) or timeout < 0:
        raise ConfigError(f"timeout={timeout!r}: expected seconds >= 0")
    init = given.pop("worker_init_fn", None)
    if init is not None and not callable(init):
        raise ConfigError(f"worker_init_fn={init!r}: expected a callable taking the worker id")
    options = ThreadOptions(
        options.prefetch_factor,
        bool(given.pop("pin_memory", False)),
        str(given.pop("pin_memory_device", "") or ""),
        float(timeout),
        init,
    )
    if given:
        raise ConfigError(
            f"TorchLoader(workers='threads') does not take {sorted(given)}: thread workers honour "
            "prefetch_factor, pin_memory, pin_memory_device, timeout and worker_init_fn; use "
            "workers='processes' for the others"
        )
    return options


# DataLoader arguments about worker processes, meaningless for threads (accepted, so that switching a
# loader's `workers` needs no other change).
_PROCESS_ONLY = ("multiprocessing_context", "persistent_workers", "generator", "in_order")
