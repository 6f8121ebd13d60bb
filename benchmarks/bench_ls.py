"""Benchmark ``profctx ls`` and the manifest reader on a run of many captures.

Writes ``--captures`` captures (a started and a finished record each, as the writer emits
them) spread over ``--shards`` process shards, then measures, each in a fresh subprocess: the
time and peak RSS of ``profctx ls DIR`` (output to a file), of ``ls --step S`` (filtered while
streaming), and of an interpreter that only imports the CLI (the floor). Targets: 100,000
captures listed in at most 1 s and 100 MB.

    python benchmarks/bench_ls.py [--captures 100000] [--shards 64] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write(folder: Path, captures: int, shards: int) -> None:
    """Write the manifest of a run with ``captures`` captures over ``shards`` shards."""
    manifest = folder / ".profctx"
    manifest.mkdir(parents=True, exist_ok=True)
    roles = ("rollout", "ref", "actor_update", "critic_update")
    per = captures // shards
    for shard in range(shards):
        lines = []
        for i in range(per):
            step = 1 + i // len(roles)
            role = roles[i % len(roles)]
            start = 1.8e9 + shard * 0.001 + i * 0.5
            common = {"v": 1, "run": "bench", "rank": shard, "world_size": shards, "host": f"node{shard // 8}",
                      "pid": 1000 + shard, "capture": f"{shard:04d}{i:08d}", "kind": "role", "steps": [step],
                      "step": step, "last_step": step, "role": role, "backend": "torch",
                      "folder": f"step{step:06d}/{role}"}
            lines.append(json.dumps({**common, "event": "started", "start_time": start, "thread": "MainThread"},
                                    separators=(",", ":")))
            name = (f"step{step:06d}/{role}/rank{shard}-of-{shards}_node_{1000 + shard}."
                    f"{int(start * 1000)}.pt.trace.json.gz")
            lines.append(json.dumps({**common, "event": "finished", "status": "ok", "start_time": start,
                                     "end_time": start + 0.3, "duration_s": 0.3, "blocked_s": 0.002, "write_s": 0.05,
                                     "files": [{"path": name, "bytes": 1234567}], "bytes": 1234567, "ranges": 2,
                                     "error": None, "notes": []}, separators=(",", ":")))
        (manifest / f"bench.rank{shard}-of-{shards}.node.{1000 + shard}.jsonl").write_text("\n".join(lines) + "\n")


def measure(argv: list[str], env: dict[str, str] | None = None, repeat: int = 3) -> tuple[float, float, float]:
    """Run ``argv`` ``repeat`` times, output to a file; return the best (seconds, CPU seconds, peak RSS MB)."""
    best: tuple[float, float, float] | None = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        with tempfile.TemporaryFile("w+") as out:
            # A neutral working folder: "python -m" would put the current one first on sys.path.
            child = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, env=env,
                                     cwd=tempfile.gettempdir())
            _, status, usage = os.wait4(child.pid, 0)
        elapsed = time.perf_counter() - t0
        code = os.waitstatus_to_exitcode(status)
        if code not in (0, 1):
            raise RuntimeError(f"{argv} exited {code}")
        result = (elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)
        if best is None or result[0] < best[0]:
            best = result
    assert best is not None
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--captures", type=int, default=100_000)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--keep", metavar="DIR")
    parser.add_argument("--old", metavar="PYTHONPATH", help="also time 'ls' of another checkout (its root)")
    args = parser.parse_args()
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="profctx-bench-ls-"))
    if not (folder / ".profctx").is_dir():
        write(folder, args.captures, args.shards)
    size = sum(p.stat().st_size for p in (folder / ".profctx").iterdir())
    py = sys.executable
    here = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = here
    floor = measure([py, "-c", "import profctx.cli"])
    runs = {
        "interpreter + import profctx.cli": floor,
        "profctx ls DIR": measure([py, "-m", "profctx", "ls", str(folder)]),
        "profctx ls DIR --json": measure([py, "-m", "profctx", "ls", str(folder), "--json"]),
        "profctx ls DIR --step 7": measure([py, "-m", "profctx", "ls", str(folder), "--step", "7"]),
        "profctx.manifest.read(DIR)": measure([py, "-c", f"import profctx.manifest as m; m.read({str(folder)!r})"]),
    }
    if args.old:
        old_env = {**os.environ, "PYTHONPATH": args.old}
        runs["previous profctx ls DIR (--old)"] = measure([py, "-m", "profctx", "ls", str(folder)], env=old_env)
        runs["previous profctx ls DIR --json (--old)"] = measure([py, "-m", "profctx", "ls", str(folder), "--json"],
                                                                 env=old_env)
    print(f"{args.captures} captures, {args.shards} shards, manifest {size / 1e6:.1f} MB; best of 3 runs each")
    print("| what | time (s) | CPU (s) | peak RSS (MB) |\n|---|---:|---:|---:|")
    for name, (seconds, cpu, rss) in runs.items():
        print(f"| {name} | {seconds:.2f} | {cpu:.2f} | {rss:.0f} |")


if __name__ == "__main__":
    main()
