"""A long step timeline in the writer's format, and the peak memory of a command reading it (tests, benchmarks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

#: Run in a fresh interpreter: the peak resident set after the imports, then after the command.
CHILD = r"""
import io, json, resource, sys, contextlib
from profctx.cli import main
from profctx.analysis._timeline import html_section, read
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
what, folder = sys.argv[1], sys.argv[2]
sink = open("/dev/null", "w")
with contextlib.redirect_stdout(sink):
    if what == "timeline":
        main(["timeline", folder])
    elif what == "timeline --json":
        main(["timeline", folder, "--json"])
    elif what == "report section":
        html_section(folder, None)
    elif what == "read":
        read(folder)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"before": before, "after": after}))
"""

ROLE_NAMES = ("rollout", "ref", "actor_update", "critic", "reward", "log")


def write(folder: Path, steps: int, roles: int, processes: int = 1) -> int:
    """Write ``processes`` timelines of ``steps`` steps of ``roles`` roles under ``folder``; return their bytes."""
    manifest = folder / ".profctx"
    manifest.mkdir(parents=True, exist_ok=True)
    total = 0
    for rank in range(processes):
        path = manifest / f"bench.rank{rank}-of-{processes}.host.{100 + rank}.timeline"
        with open(path, "w") as handle:
            handle.write(json.dumps({"v": 2, "schema": "profctx.timeline", "run": "bench", "rank": rank,
                                     "world_size": processes, "group": None, "host": "host", "pid": 100 + rank,
                                     "time": 1.8e9}, separators=(",", ":")) + "\n")
            start = 1.8e9
            for step in range(steps):
                each = 0.01 + (step % 7) * 1e-4 + rank * 1e-5
                spent = {}
                at = 0.0
                for r in range(roles):
                    spent[ROLE_NAMES[r % len(ROLE_NAMES)] + ("" if r < len(ROLE_NAMES) else str(r))] = [
                        round(each, 6), 1, round(at + 1e-5, 6), round(at + each, 6)]
                    at += each + 2e-5
                handle.write(f'{{"step":{step},"start":{start:.6f},"time_s":{at:.6f},"roles":'
                             f'{json.dumps(spent, separators=(",", ":"))}}}\n')
                start += at + 1e-3
        total += path.stat().st_size
    return total


def measure(what: str, folder: Path) -> tuple[int, int]:
    """Return the peak resident set of ``what`` over ``folder`` in a fresh interpreter: before and after."""
    done = subprocess.run([sys.executable, "-c", CHILD, what, str(folder)], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", ".")})
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return figures["before"], figures["after"]
