"""Benchmark what reading each trace once and budgeting inflation per command add to ``profctx summary``.

The reader side of a run folder checks each trace's link count after opening (the ``fstat`` it made
anyway), and looks each trace up once by device and inode before reading (a ``stat`` a file, whose
size also gives the command's inflation budget). This writes a run of many
small synthetic torch-shaped traces (``--ranks`` x ``--steps`` x 2 roles, ``--events`` events each) and
times ``summarize`` in this process, alternating runs with those look-ups and runs with them switched
off, and prints the median of each and the difference per trace.

    python benchmarks/bench_read_once.py [--ranks 50] [--steps 10] [--events 40] [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from analysis.synth import Spec, write_run

from profctx.analysis import _summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=50)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--events", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="profctx-bench-read-once-"))
    spec = Spec(steps=tuple(range(1, args.steps + 1)), ranks=args.ranks, roles={"rollout": 0.4, "actor_update": 0.3},
                events=args.events)
    write_run(folder, spec)
    traces = sum(1 for p in folder.rglob("*.json*") if p.is_file())
    once = _summary._once

    def timed(checks: bool) -> float:
        _summary._once = once if checks else (lambda find, chosen, problems: (chosen, 0))  # type: ignore[assignment]
        try:
            started = time.perf_counter()
            _summary.summarize(folder, jobs=1)
            return time.perf_counter() - started
        finally:
            _summary._once = once

    timed(True)  # warm the page cache and the imports
    with_checks, without = [], []
    for _ in range(args.repeat):
        with_checks.append(timed(True))
        without.append(timed(False))
    a, b = statistics.median(with_checks), statistics.median(without)
    print(f"{traces} traces: summary {a * 1e3:.1f} ms with the look-ups, {b * 1e3:.1f} ms without "
          f"(median of {args.repeat}); {(a - b) / traces * 1e6:+.1f} us a trace ({(a - b) / b:+.1%})")
    # The look-ups alone, on the same files: the difference above is within the noise of a whole summary.
    names = [[p.relative_to(folder).as_posix()] for p in sorted(folder.rglob("*.json*")) if p.is_file()]
    alone = []
    for _ in range(args.repeat):
        find = _summary._finder(folder)
        for name in names:  # resolved once per command whether or not the look-ups run: not theirs
            find(name[0])
        started = time.perf_counter()
        once(find, names, [])
        alone.append(time.perf_counter() - started)
    c = statistics.median(alone)
    print(f"the look-ups alone: {c * 1e3:.2f} ms for {len(names)} traces ({c / len(names) * 1e6:.2f} us a trace, "
          f"{c / b:.2%} of the summary)")


if __name__ == "__main__":
    main()
