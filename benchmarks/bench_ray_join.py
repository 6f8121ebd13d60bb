"""What a member's join costs: the modules it imports (each timed), and registration of fresh actors.

A user's fresh actor class (``_ray_fresh.Fresh``: it imports ``profctx`` for ``@profiled``, not
``profctx.ray``) on a local Ray cluster (2 CPUs, no dashboard):

- ``imports``: the modules an actor process holds before its join and after (``sys.modules``
  diff, the actor not selected, so no backend), then each added module's own import time
  (``python -X importtime`` in a fresh process that first imports what the actor held before the
  join, then ``profctx.ray._worker``, the module Ray loads to run the join), median of
  ``--repeat`` processes;
- ``register``: for each N in ``--sizes``, N fresh actors; one no-op ``__ray_call__`` to each
  (Ray's round, the actors started), then ``profctx.ray.group()`` of them until every member
  joined (reading ``members``), one member selected (``noop`` backend); the ratio is registration
  over Ray's round, median of ``--rounds`` rounds on fresh actors.

Run: ``PYTHONPATH=. python benchmarks/bench_ray_join.py [--only imports,register] [--sizes 8,16]``.
"""

from __future__ import annotations

import argparse
import compileall
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ray

import profctx
import profctx.ray

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _ray_fresh import Fresh, modules, nothing  # noqa: E402 - the folder is on sys.path only from here

_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)")


def _configure(save: str) -> None:
    profctx.configure(steps="1:100", mode="step", ranks={"actor": [0]}, profile_driver=False, tool="noop",
                      save_path=save, warmup=False)


def bench_imports(save: str, repeat: int) -> None:
    _configure(save)
    actor = ray.remote(num_cpus=0)(Fresh).options(name=None).remote()
    other = ray.remote(num_cpus=0)(Fresh).remote()  # rank 1: not selected
    before = set(ray.get(other.__ray_call__.remote(modules)))
    assert all(m.pid is not None for m in profctx.ray.group("actor", [actor, other]).members)
    added = sorted(set(ray.get(other.__ray_call__.remote(modules))) - before - {"_ray_fresh"})
    profctx.reset()
    for a in (actor, other):
        ray.kill(a)
    tops = sorted({m.split(".")[0] for m in before if not m.startswith(("_", "profctx"))} - {"__main__"})
    prelude = "".join(f"try:\n    import {m}\nexcept Exception:\n    pass\n" for m in tops)
    prelude += "".join(f"try:\n    import {m}\nexcept Exception:\n    pass\n" for m in sorted(before)
                       if m.startswith("profctx") or m.startswith("ray"))
    runs: dict[str, list[float]] = {}
    totals = []
    for _ in range(repeat):
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", prelude + "import profctx.ray._worker"],
                              capture_output=True, text=True, check=True, env={**os.environ})
        own: dict[str, float] = {}
        lines = done.stderr.splitlines()
        for line in lines:
            match = _LINE.match(line)
            if match:
                own[match.group(4)] = int(match.group(1)) / 1e3
        for name in added:
            runs.setdefault(name, []).append(own.get(name, 0.0))
        totals.append(sum(own.get(name, 0.0) for name in added))
    print(f"modules the join adds to a member that is not selected: {len(added)}; their import time "
          f"(median of {repeat} fresh processes): {statistics.median(totals):.1f} ms")
    print("| module | own import time (ms) |")
    print("|---|---|")
    for name in sorted(added, key=lambda n: -statistics.median(runs[n])):
        print(f"| `{name}` | {statistics.median(runs[name]):.2f} |")


def bench_register(save: str, sizes: list[int], rounds: int) -> None:
    print("| actors | Ray: one call to each (ms) | group() until every member joined (ms) | ratio |")
    print("|---|---|---|---|")
    for n in sizes:
        ratios, rays, regs = [], [], []
        for _ in range(rounds):
            _configure(save)
            actors = [ray.remote(num_cpus=0)(Fresh).remote() for _ in range(n)]
            ray.get([a.__ray_call__.remote(nothing) for a in actors])  # started: process start-up is not a join
            t0 = time.perf_counter()
            ray.get([a.__ray_call__.remote(nothing) for a in actors])
            t1 = time.perf_counter()
            grp = profctx.ray.group("actor", actors)
            assert all(m.pid is not None for m in grp.members)
            t2 = time.perf_counter()
            profctx.reset()
            for a in actors:
                ray.kill(a)
            rays.append(t1 - t0)
            regs.append(t2 - t1)
            ratios.append((t2 - t1) / (t1 - t0))
        print(f"| {n} | {statistics.median(rays) * 1e3:.1f} | {statistics.median(regs) * 1e3:.1f} | "
              f"{statistics.median(ratios):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default="imports,register")
    parser.add_argument("--sizes", default="8,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    # Bytecode as an installed package has it (pip compiles on install): under PYTHONDONTWRITEBYTECODE each
    # actor would compile profctx's sources at its join, a cost no user pays.
    compileall.compile_dir(str(Path(profctx.__file__).parent), quiet=2)
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        with tempfile.TemporaryDirectory() as save:
            only = set(args.only.split(","))
            if "imports" in only:
                bench_imports(save, args.repeat)
            if "register" in only:
                bench_register(save, [int(s) for s in args.sizes.split(",")], args.rounds)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
