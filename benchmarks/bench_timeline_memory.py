"""What ``profctx timeline`` (and the report's step-timeline section) holds in memory against the bytes it reads.

Writes a timeline in the writer's format (a header line, then one line per step with its wall-clock start and
each role's ``[seconds, count, first entry, last exit]``), ``--steps`` steps of ``--roles`` roles in each of
``--processes`` files, then runs each command in a fresh interpreter and reads its peak resident set
(``ru_maxrss``) before the command (after the imports) and after it. The growth over the bytes of the files is
the figure; the floor is what the parsed steps take as the reader keeps them (``--floor``: the arrays alone).

Run by hand: ``PYTHONPATH=. python benchmarks/bench_timeline_memory.py [--steps 200000] [--roles 3]``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tests.cli.tlmem import measure, write


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--roles", type=int, default=3)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--what", nargs="*", default=["read", "timeline", "report section", "timeline --json"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        size = write(folder, args.steps, args.roles, args.processes)
        print(f"{args.processes} timeline(s), {args.steps} steps x {args.roles} roles: {size / 1e6:.1f} MB\n")
        print("| command | peak RSS growth | x the bytes read |")
        print("|---|---:|---:|")
        for what in args.what:
            before, after = measure(what, folder)
            print(f"| `{what}` | {(after - before) / 1e6:.1f} MB | {(after - before) / size:.2f} |")


if __name__ == "__main__":
    main()
