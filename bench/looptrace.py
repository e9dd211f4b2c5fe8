"""Run `shardcached` with every event-loop step timed: how long the loop is held, whatever the machine does.

A benchmark-only wrapper (`harness.devservers.start_daemon(..., wrapper=looptrace.wrapper(path))`): it runs
the daemon's own `main` unchanged except that `uvloop.run` becomes `asyncio.run` with
`asyncio.events.Handle._run` wrapped, since uvloop runs its callbacks in C where nothing can time them. Every
callback the loop runs (a task's step, a transport's read, a timer) is timed twice:

- CPU time of the loop's thread (`time.thread_time`): what the daemon's code costs on the loop. Time the OS
  gave another process, and time spent waiting for the GIL that a worker thread holds, are not in it, so it
  does not depend on how busy the machine is;
- wall time (`time.perf_counter`): what a request on another connection really waited behind it.

Only the daemon's loop is traced: callbacks of other threads' loops (fsspec's) pass through untimed.
Each step's start (monotonic clock, comparable across processes), CPU and wall seconds are written as three
float64 arrays when the daemon exits (`<path>.steps`), and the steps over `DETAIL_S` of CPU or wall with a
label naming the code (`<path>.json`): for a task, the innermost coroutine frames where the step resumed and
where it suspended again; for a plain callback, the callback. Garbage-collector passes (any thread: they hold
the GIL) are listed there too with their generation and duration.
"""

from __future__ import annotations

import array
import asyncio
import gc
import json
import runpy
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

DETAIL_S = 0.002  # steps with more CPU or wall time than this are listed with their label
FRAMES = 3  # innermost coroutine frames named in a step's label


def wrapper(trace: Path) -> list[str]:
    """The `start_daemon(wrapper=...)` prefix that runs the daemon under this tracer, writing to `trace`."""
    return [sys.executable, str(Path(__file__).resolve()), str(trace)]


def _chain(task: object) -> str:
    """The innermost `FRAMES` coroutine frames of `task`'s await chain, outer first: `file:line function`."""
    get_coro = getattr(task, "get_coro", None)
    obj: Any = get_coro() if get_coro is not None else None
    frames: list[str] = []
    while obj is not None:
        frame = (
            getattr(obj, "cr_frame", None) or getattr(obj, "gi_frame", None) or getattr(obj, "ag_frame", None)
        )
        if frame is None:
            break
        frames.append(f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} {frame.f_code.co_name}")
        obj = (
            getattr(obj, "cr_await", None)
            or getattr(obj, "gi_yieldfrom", None)
            or getattr(obj, "ag_await", None)
        )
    return " > ".join(frames[-FRAMES:]) or "?"


class Tracer:
    """Times every loop step and every garbage-collector pass; `dump` writes them out."""

    def __init__(self, trace: Path) -> None:
        self.trace = trace
        self.starts = array.array("d")
        self.cpu = array.array("d")
        self.wall = array.array("d")
        self.detail: list[dict[str, object]] = []
        self.gcs: list[dict[str, object]] = []
        self._gc_started = 0.0

    def install(self) -> None:
        handle_run = asyncio.events.Handle._run
        tracer = self

        loop_thread = threading.get_ident()  # the daemon's loop runs in the thread that starts it

        def timed_run(handle: asyncio.events.Handle) -> None:
            if threading.get_ident() != loop_thread:
                # fsspec's own loop (thread `fsspecIO`: s3fs, aiohttp) runs its callbacks here too; they
                # hold no step of the daemon's loop (only the GIL, in 5 ms switches), so are not counted.
                handle_run(handle)
                return
            callback = handle._callback  # type: ignore[attr-defined]
            task = getattr(callback, "__self__", None)
            before = _chain(task) if isinstance(task, asyncio.Task) else None
            wall0, cpu0 = time.perf_counter(), time.thread_time()
            handle_run(handle)
            cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
            tracer.starts.append(wall0)
            tracer.cpu.append(cpu)
            tracer.wall.append(wall)
            if cpu > DETAIL_S or wall > DETAIL_S:
                if isinstance(task, asyncio.Task):
                    after = "returned" if task.done() else _chain(task)
                    label = f"task {task.get_name()}: [{before}] -> [{after}]"
                else:
                    label = repr(callback)[:200]
                tracer.detail.append({"start": wall0, "cpu": cpu, "wall": wall, "what": label})

        asyncio.events.Handle._run = timed_run  # type: ignore[method-assign,assignment]
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        took = time.perf_counter() - self._gc_started
        if took > DETAIL_S:
            self.gcs.append(
                {
                    "start": self._gc_started,
                    "wall": took,
                    "generation": info["generation"],
                    "thread": threading.current_thread().name,
                }
            )

    def dump(self) -> None:
        with open(f"{self.trace}.steps", "wb") as out:
            for column in (self.starts, self.cpu, self.wall):
                column.tofile(out)
        Path(f"{self.trace}.json").write_text(json.dumps({"steps": self.detail, "gc": self.gcs}))


def main() -> None:
    """`looptrace.py TRACE python -m shardcached ARGS...`: run the daemon's main with the loop traced."""
    trace, command = Path(sys.argv[1]), sys.argv[2:]
    module = command.index("-m")
    tracer = Tracer(trace)
    tracer.install()
    import uvloop

    def traced_run(main: Coroutine[Any, Any, Any], **_: Any) -> Any:
        try:
            return asyncio.run(main)
        finally:
            tracer.dump()

    run: Callable[..., Any] = traced_run
    uvloop.run = run  # type: ignore[assignment]
    sys.argv = [command[module + 1], *command[module + 2 :]]
    runpy.run_module(command[module + 1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
