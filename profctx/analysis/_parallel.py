"""Read many traces in a process pool, results in input order; one process where a pool cannot help.

Parsing a trace is CPU-bound Python (the GIL holds it), so threads do not help and processes
do: each worker reads whole files and sends back only their figures, which are small (a few
hundred operators per trace). A pool costs a fork and a round trip per file, so it is used only
when there are at least two files and enough bytes to pay for it (:func:`jobs_for`).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Final, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Estimated JSON bytes under which reading stays in one process (a pool's start and round trips
#: cost tens of milliseconds; this much JSON takes a few hundred).
AUTO_MIN_BYTES: Final = 32 << 20
#: How many times its size a ``.gz`` trace inflates to, for the estimate (torch traces: 10 to 20).
GZIP_RATIO: Final = 10
#: ``jobs`` meaning "automatic, and this process's main module may be imported again" (a command line):
#: where forking is not safe, workers may then start from a fork server. ``None`` is automatic too,
#: but reads in this process where forking is not safe: another start method imports the caller's
#: main module again, which re-runs a script without a ``__main__`` guard.
AUTO: Final = 0


def cpus() -> int:
    """Return the number of CPUs this process may run on."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        try:
            return max(1, len(affinity(0)))
        except OSError:  # pragma: no cover - a platform that lists none
            pass
    return max(1, os.cpu_count() or 1)


def jobs_for(paths: Sequence[str | os.PathLike[str]], jobs: int | None) -> int:
    """Return how many processes read ``paths``: ``jobs`` when given (at least 1, at most one per file),
    else (``None`` or :data:`AUTO`) one per CPU when there are two files or more and about
    :data:`AUTO_MIN_BYTES` of JSON to read, and 1 otherwise."""
    if jobs:
        return max(1, min(jobs, len(paths)))
    if len(paths) < 2:
        return 1
    estimate = 0
    for path in paths:
        try:
            size = os.stat(path).st_size
        except OSError:
            continue
        estimate += size * GZIP_RATIO if str(path).endswith(".gz") else size
        if estimate >= AUTO_MIN_BYTES:
            return max(1, min(cpus(), len(paths)))
    return 1


def _context(server: bool) -> Any:
    """Fork where it is safe (Linux, this process has one thread: a forked copy inherits its imports for
    free); else, when ``server``, a fork server where there is one (a fresh process forks the workers), else
    spawn; else ``None`` (no pool)."""
    methods = multiprocessing.get_all_start_methods()
    if sys.platform.startswith("linux") and threading.active_count() == 1 and "fork" in methods:
        return multiprocessing.get_context("fork")
    if not server:
        return None
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def ordered_map(fn: Callable[[T], R], items: Sequence[T], jobs: int, *,
                server: bool = False) -> Generator[R, None, None]:
    """Yield ``fn(item)`` for each of ``items``, in order, computed by ``jobs`` processes (in this one for 1).

    Where forking is not safe (threads running, not Linux) workers start from a fork server or by
    spawning only when ``server`` says this process's main module may be imported again; else the
    items are computed here.

    ``fn`` and the items must pickle (a module-level function, or a ``functools.partial`` of one).
    An exception raised by ``fn`` is raised here. If a worker dies (killed, out of memory), the
    items not yet yielded are computed in this process.
    """
    context = _context(server) if jobs > 1 and len(items) > 1 else None
    if context is None:
        yield from map(fn, items)
        return
    done = 0
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(items)), mp_context=context)
    try:
        # One item a task: traces differ in size by orders of magnitude, so chunks would balance badly.
        for result in pool.map(fn, items):
            yield result
            done += 1
    except BrokenProcessPool:
        pool.shutdown(wait=True, cancel_futures=True)
        yield from map(fn, items[done:])
    finally:
        # A caller that stops early (an error, a closed generator) does not wait for the files left.
        pool.shutdown(wait=True, cancel_futures=True)


class Prefetched(Generic[T, R]):
    """Call ``fn`` on items asked for in a known order, computed ahead by :func:`ordered_map`.

    ``prefetched(item)`` returns ``fn(item)``: the next result of the pool when ``item`` is the next
    planned one, else computed here (an item out of the plan). Use as a context manager: leaving
    it stops the pool, the items not asked for included.
    """

    def __init__(self, fn: Callable[[T], R], items: Sequence[T], jobs: int, *, server: bool = False) -> None:
        self._fn = fn
        self._planned: deque[T] = deque(items)
        self._results = ordered_map(fn, items, jobs, server=server)

    def __call__(self, item: T) -> R:
        if self._planned and self._planned[0] == item:
            self._planned.popleft()
            return next(self._results)
        return self._fn(item)

    def close(self) -> None:
        """Stop the pool (results not asked for are dropped)."""
        self._results.close()

    def __enter__(self) -> Prefetched[T, R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
