"""Benchmark the run summary (``profctx summary``) at scale, on synthetic torch-shaped traces.

Writes a run of ``--ranks`` x ``--steps`` x ``--roles`` role-mode captures (the trace bytes of
one shape are written once and copied, so making the run is quick) plus one large trace of
about ``--large-mb`` MB of JSON, then measures, in a fresh subprocess, the time and peak RSS of
``profctx summary --json`` over the whole run, and the same for ``json.load`` of the largest
trace alone. Target: peak memory at most 2x the largest single trace (uncompressed JSON).

    python benchmarks/bench_analysis.py [--ranks 64] [--steps 10] [--roles 4] [--mb 2] [--large-mb 150]
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from analysis.synth import Spec, write_run

#: JSON bytes per synthetic event pair (outer + leaf op with torch's args), measured on the generator.
_PAIR_BYTES = 560


def measure(argv: list[str]) -> tuple[float, float]:
    """Run ``argv``; return (seconds, peak RSS MB of that child)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        child = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, cwd=tempfile.gettempdir())
        _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise RuntimeError(f"{argv[:5]} failed")
    return time.perf_counter() - t0, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--roles", type=int, default=4)
    parser.add_argument("--mb", type=float, default=2.0, help="uncompressed MB of JSON per trace")
    parser.add_argument("--large-mb", type=float, default=150.0, help="uncompressed MB of the one large trace")
    parser.add_argument("--keep", metavar="DIR")
    parser.add_argument("--generate-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="profctx-bench-analysis-"))
    names = ["rollout", "ref", "actor_update", "critic_update", "reward", "values"][: args.roles]
    if not (folder / ".profctx").is_dir() and not args.generate_only:
        # Generated in a child: Linux carries a process's peak RSS over fork and exec, so a parent
        # grown by the generator would inflate every child's figure below.
        subprocess.run([sys.executable, __file__, *sys.argv[1:], "--keep", str(folder), "--generate-only"],
                       check=True)
    if args.generate_only:
        spec = Spec(run="scale", steps=tuple(range(1, args.steps + 1)), ranks=args.ranks,
                    roles={n: 0.2 + 0.1 * i for i, n in enumerate(names)},
                    slow={(args.ranks - 1, names[-1]): 1.5}, events=int(args.mb * 1e6 / _PAIR_BYTES))
        write_run(folder, spec, cache={})
        # One trace much larger than the rest: the memory bound is relative to the largest trace.
        large = Spec(run="scale", steps=(1,), ranks=1, roles={names[0]: 0.2},
                     events=int(args.large_mb * 1e6 / _PAIR_BYTES))
        scratch = folder.parent / (folder.name + "-large")
        write_run(scratch, large)
        big = next((scratch / "step000001" / names[0]).glob("*.gz"))
        target = next((folder / "step000001" / names[0]).glob("rank0-*.gz"))
        shutil.copyfile(big, target)
        shutil.rmtree(scratch)
        return
    traces = sorted(folder.rglob("*.pt.trace.json.gz"))
    largest = max(traces, key=lambda p: p.stat().st_size)
    with gzip.open(largest, "rb") as fh:
        largest_mb = sum(len(c) for c in iter(lambda: fh.read(1 << 20), b"")) / 1e6
    disk = sum(p.stat().st_size for p in traces) / 1e6
    here = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = here
    py = sys.executable
    floor_s, floor_mb = measure([py, "-c", "import profctx.cli, profctx.analysis"])
    load_s, load_mb = measure([py, "-c", f"import gzip, json; json.load(gzip.open({str(largest)!r}, 'rt'))"])
    summary_s, summary_mb = measure([py, "-m", "profctx", "summary", str(folder), "--json", "--no-progress"])
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, run in {folder}")
    print("| what | result |\n|---|---|")
    print(f"| inputs | {len(traces)} traces ({args.ranks} ranks x {args.steps} steps x {args.roles} roles), "
          f"{disk:.0f} MB gzipped; largest {largest_mb:.0f} MB of JSON |")
    print(f"| interpreter + imports | {floor_s:.1f} s, peak RSS {floor_mb:.0f} MB |")
    print(f"| json.load of the largest trace alone | {load_s:.1f} s, peak RSS {load_mb:.0f} MB |")
    print(f"| profctx summary --json of the run | {summary_s:.1f} s, peak RSS {summary_mb:.0f} MB "
          f"(**{summary_mb / largest_mb:.2f}x the largest trace**; target <= 2x) |")


if __name__ == "__main__":
    main()
