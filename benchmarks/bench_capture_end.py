"""Capture end: how long the training thread is held when a capture ends, profctx against torch's own handler.

For each trace size (about 1, 10 and 100 MB of uncompressed Chrome trace, made of many small CPU
ops: ``x.add(1).mul(1)`` on a 4-element tensor, with ``record_shapes``) and each of ``--repeat``
rounds, three captures of the same loop, interleaved so that load on a shared machine hits all
alike:

- ``handler``: ``torch.profiler.profile(record_shapes=True, on_trace_ready=tensorboard_trace_handler(
  use_gzip=False))``, the plain JSON handler: ``prof.stop()`` exports on the training thread;
- ``profctx``: ``with profctx.profile_step(1):`` with the default settings (``compress=true``,
  ``contents=["shapes"]``);
- ``profctx json``: the same with ``compress=false``.

Two figures per capture:

- **exit**: the time from the start of the block's exit (``prof.stop()`` for the handler) to its
  return: what the training thread waits for, the figure the target is about (≤ 0.9x the handler);
- **stall**: exit plus every gap over 50 µs the training thread sees afterwards, spinning in
  Python until profctx's writer thread has written the files (+50 ms): what a loop that needs
  the GIL the whole time would lose to the work done off the training thread.

Medians of the rounds; ratios are to the handler. Run: ``python benchmarks/bench_capture_end.py
[--sizes 1,10,100] [--repeat 3]``. Prints one Markdown table.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import profctx
from profctx.process._owner import OWNER
from profctx.records._manifest import read

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_core import Spinner, tiny_ops


def _after(until: Callable[[], bool]) -> float:
    """Spin on the training thread until ``until()`` (at least 50 ms); return the gaps it saw."""
    spinner = Spinner()
    spinner.spin(until, 0.05)
    return spinner.stalled


def handler(folder: str, n: int) -> tuple[float, float, int]:
    """One capture through torch's plain JSON handler: (exit, stall, trace bytes)."""
    from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                   on_trace_ready=tensorboard_trace_handler(folder, use_gzip=False))
    prof.start()
    tiny_ops(n)
    gc.collect()
    t0 = time.perf_counter()
    prof.stop()
    exit_s = time.perf_counter() - t0
    stall = exit_s + _after(lambda: True)
    return exit_s, stall, sum(p.stat().st_size for p in Path(folder).iterdir())


def ours(save: str, n: int, compress: bool) -> tuple[float, float, int, dict[str, Any]]:
    """One capture through ``profctx.profile_step``: (exit, stall, file bytes, its manifest record)."""
    profctx.configure(steps=[1], save_path=save, compress=compress, contents=["shapes"], exit_hooks=False)
    block = profctx.profile_step(1)
    block.__enter__()
    tiny_ops(n)
    gc.collect()
    t0 = time.perf_counter()
    block.__exit__(None, None, None)
    exit_s = time.perf_counter() - t0
    runtime = OWNER.runtime
    assert runtime is not None
    stall = exit_s + _after(lambda: not runtime.writer.pending())
    profctx.reset()
    (record,) = [r for r in read(save) if r.get("status") == "ok"]
    return exit_s, stall, int(record["bytes"]), record


def calibrate(tmp: str) -> float:
    """Return loop iterations per MB of the handler's JSON."""
    folder = os.path.join(tmp, "calibrate")
    _, _, size = handler(folder, 5000)
    return 5000 / (size / 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,10,100", help="trace sizes in MB of uncompressed JSON")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import torch

    from profctx.util import _codec

    print(f"Python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} cores, "
          f"gzip by {_codec.name()}\n")
    print("| trace (handler JSON) | handler exit | profctx exit | x | profctx json exit | x | handler stall "
          "| profctx stall | x | profctx json stall | x | profctx file | blocked_s | write_s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        per_mb = calibrate(tmp)
        profctx.configure(steps=[1], save_path=os.path.join(tmp, "warm"), exit_hooks=False)  # torch's first start
        with profctx.profile_step(1):
            tiny_ops(10)
        profctx.reset()
        for mb in (float(s) for s in args.sizes.split(",")):
            n = int(per_mb * mb)
            rows: dict[str, list[Any]] = {"handler": [], "gz": [], "json": []}
            for i in range(args.repeat):
                rows["handler"].append(handler(os.path.join(tmp, f"tb-{mb}-{i}"), n))
                rows["gz"].append(ours(os.path.join(tmp, f"gz-{mb}-{i}"), n, True))
                rows["json"].append(ours(os.path.join(tmp, f"json-{mb}-{i}"), n, False))

            def med(key: str, index: int, rows: dict[str, list[Any]] = rows) -> float:
                return float(statistics.median(r[index] for r in rows[key]))

            h_exit, h_stall = med("handler", 0), med("handler", 1)
            blocked = statistics.median(r[3]["blocked_s"] for r in rows["gz"])
            write = statistics.median(r[3]["write_s"] for r in rows["gz"])
            print(f"| {med('handler', 2) / 1e6:.1f} MB | {h_exit * 1e3:.1f} ms | {med('gz', 0) * 1e3:.1f} ms "
                  f"| {med('gz', 0) / h_exit:.2f} | {med('json', 0) * 1e3:.1f} ms | {med('json', 0) / h_exit:.2f} "
                  f"| {h_stall * 1e3:.1f} ms | {med('gz', 1) * 1e3:.1f} ms | {med('gz', 1) / h_stall:.2f} "
                  f"| {med('json', 1) * 1e3:.1f} ms | {med('json', 1) / h_stall:.2f} "
                  f"| {med('gz', 2) / 1e6:.2f} MB | {blocked * 1e3:.1f} ms | {write * 1e3:.1f} ms |", flush=True)


if __name__ == "__main__":
    main()
