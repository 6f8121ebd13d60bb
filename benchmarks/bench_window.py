"""Configure-time cost of a step window by its length (issue 25): parse time, configure time, peak memory.

Each row is measured against ``configure(steps="3:6")`` in the same run (``x small``), so the ratio
shows what grows with the window. ``1:10000000`` is past ``MAX_STEPS``: its row is the refusal.

Run by hand: ``python benchmarks/bench_window.py``.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
import tracemalloc
from collections.abc import Callable

import profctx
from profctx import ConfigError, StepWindow

SPECS = ("3:6", "1:10:2", "1:100000", "1:100000:7", "1:10000000")


def best(fn: Callable[[], object], repeat: int = 15) -> float:
    """Return the fastest of ``repeat`` calls, in seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def configure(spec: str, save: str) -> None:
    """Configure a noop capture of ``spec`` in this process, then reset."""
    with contextlib.suppress(ConfigError):
        profctx.configure(steps=spec, save_path=save, tool="noop", exit_hooks=False, timeline=False)
    profctx.reset()


def parse(spec: str) -> None:
    """Parse ``spec`` alone."""
    with contextlib.suppress(ConfigError):
        StepWindow.parse(spec)


def main() -> None:
    save = tempfile.mkdtemp()
    configure("3:6", save)
    small = best(lambda: configure("3:6", save))
    print("| steps | parse | configure | x small | configure peak |")
    print("|---|---|---|---|---|")
    for spec in SPECS:
        tracemalloc.start()
        configure(spec, save)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        took = best(lambda spec=spec: configure(spec, save))
        print(f"| `{spec}` | {best(lambda spec=spec: parse(spec)) * 1e6:.1f} us | "
              f"{took * 1e3:.3f} ms | {took / small:.2f} | {peak / 1e6:.2f} MB |")


if __name__ == "__main__":
    main()
