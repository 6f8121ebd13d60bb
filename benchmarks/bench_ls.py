"""Benchmark ``profctx ls`` and the manifest reader on a run of many captures.

Writes ``--captures`` captures (a started and a finished record each, as the writer emits
them) spread over ``--shards`` process shards, then measures, each in a fresh subprocess: the
time and peak RSS of ``profctx ls DIR`` (output to a file), of ``ls --step S`` (filtered while
streaming), and of an interpreter that only imports the CLI (the floor), first with no listing
index (as a run killed before its writers reached a checkpoint leaves it), then with the index
segments a writer appends every ``CHECKPOINT_BYTES`` as its shard grows, without the final one
(as a killed run leaves it; written here by the writer's own builder, whose CPU time is reported),
then with the whole index a writer leaves when it closes. The listings must be the same bytes.
Targets: 100,000 captures listed in at most 1 s and 100 MB.

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


def grow(shards: list[Path]) -> tuple[int, float, int]:
    """Rewrite each shard as its writer grows it, a segment of its index each time it grew by the writer's step.

    As a killed run leaves them: no final segment at close. Returns (segments, CPU seconds spent on
    them, bytes left after the last segment of each shard, summed).
    """
    from profctx.records._listing import IndexBuilder
    from profctx.records._manifest import CHECKPOINT_BYTES

    segments = 0
    cpu = 0.0
    tails = 0
    for shard in shards:
        data = shard.read_bytes()
        shard.write_bytes(b"")
        builder = IndexBuilder(shard)
        written = 0
        at = data.find(b"\n")
        while at >= 0:
            end = at + 1
            if end - builder.covered >= CHECKPOINT_BYTES:  # the writer's test, after each record
                with open(shard, "ab") as fh:
                    fh.write(data[written:end])
                written = end
                t0 = time.process_time()
                if not builder.checkpoint():
                    raise RuntimeError(f"{shard}: the index stopped")
                cpu += time.process_time() - t0
            at = data.find(b"\n", end)
        with open(shard, "ab") as fh:
            fh.write(data[written:])
        segments += builder.segments
        tails += len(data) - builder.covered
    return segments, cpu, tails


def writer_cost(captures: int) -> tuple[float, float, int, float, float]:
    """Return the CPU seconds of a real ``ManifestWriter`` writing ``captures`` captures without and with the index.

    Returns (writes without, writes with, segments, close without (the whole shard indexed at
    exit, as before segments), close with (the final segment)): best of 3 each.
    """
    from profctx.records._manifest import ManifestWriter
    from profctx.util._identity import Identity

    def one(index: bool) -> tuple[float, float, int]:
        writer = ManifestWriter(Path(tempfile.mkdtemp(prefix="profctx-bench-writer-")), "bench",
                                Identity(rank=0, world_size=8, host="node0", pid=1234, source="explicit"))
        if not index:
            writer._index = False  # as a writer whose index stopped: close() indexes the whole shard
        t0 = time.process_time()
        for i in range(captures):
            step = 1 + i // 4
            role = ("rollout", "ref", "actor_update", "critic_update")[i % 4]
            common = {"capture": f"{i:012x}", "kind": "role", "steps": [step], "step": step, "last_step": step,
                      "role": role, "backend": "torch", "folder": f"step{step:06d}/{role}"}
            start = 1.8e9 + i
            writer.write(writer.envelope({**common, "event": "started", "start_time": start, "thread": "MainThread"}))
            writer.write(writer.envelope({
                **common, "event": "finished", "status": "ok", "start_time": start, "end_time": start + 0.3,
                "duration_s": 0.3, "blocked_s": 0.002, "write_s": 0.05, "bytes": 1234567, "ranges": 2, "error": None,
                "files": [{"path": f"step{step:06d}/{role}/rank0-of-8_node_1234.{i}.pt.trace.json.gz",
                           "bytes": 1234567}], "notes": []}))
        writes = time.process_time() - t0
        t0 = time.process_time()
        writer.close()
        return writes, time.process_time() - t0, writer._index.segments if index else 0

    one(True)  # imports the reader and orjson once
    off = min(one(False) for _ in range(3))
    on = min(one(True) for _ in range(3))
    return off[0], on[0], on[2], off[1], on[1]


def measure(argv: list[str], env: dict[str, str] | None = None, repeat: int = 3,
            output: list[bytes] | None = None) -> tuple[float, float, float]:
    """Run ``argv`` ``repeat`` times, output to a file; return the best (seconds, CPU seconds, peak RSS MB).

    ``output``: a list the last run's standard output is appended to.
    """
    best: tuple[float, float, float] | None = None
    for attempt in range(repeat):
        t0 = time.perf_counter()
        with tempfile.TemporaryFile("w+b") as out:
            # A neutral working folder: "python -m" would put the current one first on sys.path.
            child = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, env=env,
                                     cwd=tempfile.gettempdir())
            _, status, usage = os.wait4(child.pid, 0)
            elapsed = time.perf_counter() - t0
            if output is not None and attempt == repeat - 1:
                out.seek(0)
                output.append(out.read())
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
    size = sum(p.stat().st_size for p in (folder / ".profctx").glob("*.jsonl"))
    py = sys.executable
    here = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = here
    sys.path.insert(0, here)
    from profctx.records._listing import INDEX_SUFFIX, write_index

    shards = sorted((folder / ".profctx").glob("*.jsonl"))
    for index in (folder / ".profctx").glob(f"*{INDEX_SUFFIX}"):
        index.unlink()
    listings: list[bytes] = []
    ls = [py, "-m", "profctx", "ls", str(folder)]
    runs = {
        "interpreter + import profctx.cli": measure([py, "-c", "import profctx.cli"]),
        "profctx ls DIR, no index (a killed run)": measure(ls, output=listings),
        "profctx ls DIR --json": measure([*ls, "--json"]),
        "profctx ls DIR --step 7": measure([*ls, "--step", "7"]),
        "profctx.manifest.read(DIR)": measure([py, "-c", f"import profctx.manifest as m; m.read({str(folder)!r})"]),
    }
    segments, checkpointing, tails = grow(shards)
    runs["profctx ls DIR, killed run, segments written as the writer goes"] = measure(ls, output=listings)
    t0 = time.process_time()
    written = sum(write_index(shard) for shard in shards)
    writing = time.process_time() - t0
    runs["profctx ls DIR, with the index"] = measure(ls, output=listings)
    if written != len(shards) or not listings[0] == listings[1] == listings[2]:
        raise RuntimeError(f"{written} of {len(shards)} indexes written; listings equal: "
                           f"{listings[0] == listings[1]}, {listings[0] == listings[2]}")
    if args.old:
        old_env = {**os.environ, "PYTHONPATH": args.old}
        runs["previous profctx ls DIR (--old)"] = measure([py, "-m", "profctx", "ls", str(folder)], env=old_env,
                                                          output=listings)
        if listings[3] != listings[0]:
            raise RuntimeError("the previous ls printed another listing")
        runs["previous profctx ls DIR --json (--old)"] = measure([py, "-m", "profctx", "ls", str(folder), "--json"],
                                                                 env=old_env)
    indexes = sum(p.stat().st_size for p in (folder / ".profctx").glob(f"*{INDEX_SUFFIX}"))
    print(f"{args.captures} captures, {args.shards} shards, manifest {size / 1e6:.1f} MB; best of 3 runs each")
    print(f"indexes: {indexes / 1e6:.1f} MB, written in {writing:.2f} s of CPU ({writing / len(shards) * 1e3:.0f} ms "
          f"per shard of {args.captures // args.shards} captures, at the end of its process)")
    print(f"segments: {segments} written as the shards grew in {checkpointing:.2f} s of CPU "
          f"({checkpointing / segments * 1e3:.2f} ms per segment, {checkpointing / args.captures * 1e6:.0f} ms per "
          f"1,000 captures); a killed run's tails after the last segment: {tails / len(shards) / 1024:.0f} kB per "
          f"shard on average ({tails / size:.1%} of the manifest)")
    plain, indexed, count, whole, final = writer_cost(10_000)
    print(f"writer, 10,000 captures: {plain * 1e3:.0f} ms of CPU without the index's segments, {indexed * 1e3:.0f} ms "
          f"with ({count} segments: {(indexed - plain) / 10 * 1e3:.1f} ms per 1,000 captures, "
          f"{(indexed - plain) / count * 1e3:.2f} ms per segment); close: {final * 1e3:.1f} ms (final segment) "
          f"against {whole * 1e3:.0f} ms (the whole shard indexed at exit)")
    print("| what | time (s) | CPU (s) | peak RSS (MB) |\n|---|---:|---:|---:|")
    for name, (seconds, cpu, rss) in runs.items():
        print(f"| {name} | {seconds:.2f} | {cpu:.2f} | {rss:.0f} |")


if __name__ == "__main__":
    main()
