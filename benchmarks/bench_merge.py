"""Benchmark ``profctx merge`` against reading every trace with ``json.load``.

Makes a run of ``--ranks`` real torch captures (one role each, CPU) of about ``--mb`` MB of
trace JSON each, then measures, each in a fresh subprocess: the peak RSS and time of an
interpreter that only imports the CLI (the floor), of ``json.load`` of every trace held at
once (what a non-streaming merge needs), of ``json.load`` one file at a time, of a bare gunzip,
and of ``profctx merge``. Targets: merge peak RSS at most 2x the largest input (uncompressed
JSON), merge time at most 0.5x the one-file-at-a-time ``json.load``.

    python benchmarks/bench_merge.py [--ranks 8] [--mb 25] [--keep DIR] [--old CHECKOUT] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_GENERATE = """
import sys, torch, profctx
save, rank, world, ops = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
profctx.configure(save_path=save, tool="torch", steps=[1], mode="role", ranks="all", rank=rank,
                  world_size=world, run_id="bench", tool_options={"compress_level": 1})
x = torch.ones(4)
with profctx.profile_step(1), profctx.profile_step(role="rollout"):
    for _ in range(ops):
        x = x.add(1)
profctx.reset()
"""

_JSON_LOAD = """
import gzip, json, sys
held = []
for path in sys.argv[1:]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        held.append(json.load(fh))
print(sum(len(t["traceEvents"]) for t in held))
"""

_JSON_LOAD_ONE = """
import gzip, json, sys
count = 0
for path in sys.argv[1:]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        count += len(json.load(fh)["traceEvents"])
print(count)
"""

_ZCAT = """
import gzip, sys
for path in sys.argv[1:]:
    with gzip.open(path, "rb") as fh:
        while fh.read(1 << 20):
            pass
"""

_FLOOR = "import profctx.cli, profctx.analysis._merge"
#: The CLI with the optional fast paths unimportable (a bare install).
_BARE = "import sys; sys.modules['isal'] = None; sys.modules['msgspec'] = None; from profctx.cli import main; " \
        "sys.argv[0] = 'profctx'; sys.exit(main(sys.argv[1:]))"
#: Runs of each command; the fastest counts (the machine is shared: slower runs measure the neighbours).
REPEAT = 3


def measure(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str, float]:
    """Run ``argv`` :data:`REPEAT` times; return the fastest (seconds, peak RSS MB of that child, stdout, CPU seconds).

    CPU seconds (user + system, every thread) are the steadier figure on a shared machine.
    """
    best: tuple[float, float, str, float] | None = None
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        with tempfile.TemporaryFile("w+") as out:
            # cwd: "python -m" puts the working folder first on sys.path; run from a neutral one so that
            # PYTHONPATH alone decides which checkout is measured.
            child = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, text=True, env=env,
                                     cwd=tempfile.gettempdir())
            _, status, usage = os.wait4(child.pid, 0)
            child.returncode = os.waitstatus_to_exitcode(status)
            elapsed = time.perf_counter() - t0
            if child.returncode != 0:
                raise RuntimeError(f"{argv[:4]} exited {child.returncode}")
            out.seek(0)
            result = (elapsed, usage.ru_maxrss / 1024, out.read(), usage.ru_utime + usage.ru_stime)
        if best is None or result[0] < best[0]:
            best = result
    assert best is not None
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--mb", type=float, default=25.0, help="approximate uncompressed MB per trace")
    parser.add_argument("--keep", metavar="DIR", help="make (or reuse) the run here instead of a temporary folder")
    parser.add_argument("--old", metavar="PYTHONPATH", help="also time the merge of another checkout (its root)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each command, the fastest counts")
    parser.add_argument("--bare", action="store_true", help="also time the merge with isal and msgspec unimportable")
    args = parser.parse_args()
    global REPEAT
    REPEAT = max(1, args.repeat)
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="profctx-bench-merge-"))
    # One x.add(1) costs about 1280 bytes of trace JSON (five events of about 256 bytes), measured.
    ops = int(args.mb * 1e6 / 1280)
    traces = sorted(folder.glob("step000001/rollout/*.pt.trace.json.gz"))
    if len(traces) != args.ranks:
        for rank in range(args.ranks):
            subprocess.run([sys.executable, "-c", _GENERATE, str(folder), str(rank), str(args.ranks), str(ops)],
                           check=True, capture_output=True)
        traces = sorted(folder.glob("step000001/rollout/*.pt.trace.json.gz"))
    sizes = []
    for path in traces:
        with gzip.open(path, "rb") as fh:
            sizes.append(sum(len(chunk) for chunk in iter(lambda fh=fh: fh.read(1 << 20), b"")))
    largest = max(sizes) / 1e6
    load_s, load_mb, events, load_cpu = measure([sys.executable, "-c", _JSON_LOAD, *map(str, traces)])
    one_s, one_mb, _, one_cpu = measure([sys.executable, "-c", _JSON_LOAD_ONE, *map(str, traces)])
    zcat_s, _, _, _ = measure([sys.executable, "-c", _ZCAT, *map(str, traces)])
    old_s = old_mb = old_cpu = None
    if args.old:
        old_s, old_mb, _, old_cpu = measure([sys.executable, "-m", "profctx", "merge", str(folder), "--step", "1",
                                    "-o", str(folder / "old.trace.json.gz"), "--no-progress"],
                                   env={**os.environ, "PYTHONPATH": args.old})
    out = folder / "merged.trace.json.gz"
    here = str(Path(__file__).resolve().parent.parent)
    merge_s, merge_mb, _, merge_cpu = measure([sys.executable, "-m", "profctx", "merge", str(folder), "--step", "1",
                                    "-o", str(out), "--no-progress"], env={**os.environ, "PYTHONPATH": here})
    # The same merge written as plain JSON: like the baseline, no output compression.
    plain = folder / "merged.trace.json"
    plain_s, plain_mb, _, plain_cpu = measure(
        [sys.executable, "-m", "profctx", "merge", str(folder), "--step", "1", "-o", str(plain), "--no-progress"],
        env={**os.environ, "PYTHONPATH": here})
    bare = None
    if args.bare:
        bare = measure([sys.executable, "-c", _BARE, "merge", str(folder), "--step", "1", "-o",
                        str(folder / "bare.trace.json.gz"), "--no-progress"], env={**os.environ, "PYTHONPATH": here})
    floor_mb = _floor_peak()
    rows = [
        ("inputs", f"{len(traces)} traces, {sum(sizes) / 1e6:.0f} MB JSON ({events.strip()} events), "
                   f"{sum(p.stat().st_size for p in traces) / 1e6:.1f} MB gzipped; largest {largest:.1f} MB"),
        ("gunzip only (read and drop)", f"{zcat_s:.1f} s"),
        ("json.load of all traces", f"{load_s:.1f} s ({load_cpu:.2f} s CPU), peak RSS {load_mb:.0f} MB "
                                    f"({load_mb / largest:.1f}x largest)"),
        ("json.load one file at a time", f"{one_s:.1f} s ({one_cpu:.2f} s CPU), peak RSS {one_mb:.0f} MB"),
        ("profctx merge", f"{merge_s:.1f} s ({merge_cpu:.2f} s CPU), peak RSS {merge_mb:.0f} MB "
                          f"({merge_mb / largest:.2f}x largest); output {out.stat().st_size / 1e6:.1f} MB gzipped"),
        ("profctx merge -o merged.trace.json (no gzip)",
         f"{plain_s:.1f} s ({plain_cpu:.2f} s CPU), peak RSS {plain_mb:.0f} MB; "
         f"output {plain.stat().st_size / 1e6:.1f} MB"),
        ("interpreter + profctx.cli import", f"peak RSS {floor_mb:.0f} MB"),
        ("merge time / json.load one at a time", f"**{merge_s / one_s:.2f}** (target <= 0.5); "
                                                 f"CPU time: {merge_cpu / one_cpu:.2f}"),
        ("merge to plain JSON / json.load one at a time", f"**{plain_s / one_s:.2f}**; CPU time: "
                                                          f"{plain_cpu / one_cpu:.2f}"),
        ("merge time / gunzip only", f"{merge_s / zcat_s:.1f}"),
    ]
    if bare is not None:
        rows.append(("merge without isal and msgspec", f"{bare[0]:.1f} s ({bare[3]:.2f} s CPU); / json.load one at "
                                                       f"a time: {bare[0] / one_s:.2f}, CPU {bare[3] / one_cpu:.2f}"))
    if old_s is not None and old_mb is not None:
        rows.append(("previous merge (--old)", f"{old_s:.1f} s ({old_cpu:.2f} s CPU), peak RSS {old_mb:.0f} MB; "
                                               f"new/old time {merge_s / old_s:.2f}, CPU "
                                               f"{merge_cpu / (old_cpu or 1):.2f}"))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, run in {folder}")
    print("| what | result |\n|---|---|")
    for what, result in rows:
        print(f"| {what} | {result} |")
    print(json.dumps({"largest_mb": largest, "merge_peak_mb": merge_mb, "load_peak_mb": load_mb,
                      "merge_s": merge_s, "load_s": load_s, "load_one_s": one_s, "zcat_s": zcat_s,
                      "floor_mb": floor_mb, "old_s": old_s, "plain_s": plain_s}))


def _floor_peak() -> float:
    code = f"{_FLOOR}; import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(done.stdout.strip()) / 1024


if __name__ == "__main__":
    main()
