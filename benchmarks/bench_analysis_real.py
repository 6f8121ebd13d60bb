"""Benchmark ``profctx summary`` and ``report`` on real torch.profiler traces against the parse floor.

Makes real CPU captures once (one per role, in a child running torch.profiler through profctx,
role mode), then lays them out as ``--ranks`` x ``--steps`` x roles captures (the trace files
hard-linked, the manifest records rewritten per rank and step), plus, in a folder of its own, the
same run with one gzip bomb (a valid trace that inflates to ``--bomb-mb`` MB).

Measured, each in a fresh subprocess, best of ``--repeat`` by CPU (user + system of the child and
of the children it waited for: a process pool's workers count):

- the floor: ``orjson.loads`` of every trace after inflating it (the CPU of both, and of the
  parse alone, as the child measures them with ``time.process_time``);
- ``profctx summary --json`` and ``profctx report``, as installed (by default), with one process
  (``--jobs 1``, when the command has that option), and with the optional fast paths hidden
  (``--bare``: isal and msgspec made unimportable, what a bare install does; and numpy too, which
  the nesting pass uses when installed);
- peak RSS (of the largest process: with a pool, per worker) against the largest trace's JSON,
  on the run and on the run with the bomb.

Targets (issue 22): CPU <= 0.3x the floor; wall <= 0.6x CPU on 2 cores; memory <= 2x the largest
trace, also with the bomb. Read only ratios within one run: the machine is shared.

    python benchmarks/bench_analysis_real.py [--ranks 4] [--steps 2] [--mb 10] [--shapes] [--keep DIR] [--old DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

ROLES = ("rollout", "ref", "actor_update", "critic_update")

#: One capture per role, rank 0 of 1, step 1; ``iters`` per role sized to about ``mb`` MB of JSON.
_GENERATE = """
import sys, torch, profctx
save, mb, shapes = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
contents = ["cpu", "shapes"] if shapes else ["cpu"]
profctx.configure(save_path=save, tool="torch", steps=[1], mode="role", ranks="all", rank=0, world_size=1,
                  run_id="real", contents=contents, tool_options={"compress_level": 1})
# Bytes of trace JSON per iteration, measured on torch 2.13 CPU (with shapes about 1.6x).
per = {"rollout": 4400, "ref": 3000, "actor_update": 7700, "critic_update": 2600}
scale = 1.6 if shapes else 1.0
x = torch.ones(64, 64)
w = torch.ones(64, 64, requires_grad=True)
with profctx.profile_step(1):
    with profctx.profile_step(role="rollout"):
        for _ in range(int(mb * 1e6 / per["rollout"] / scale)):
            x = torch.relu(x.matmul(x) * 0.01 + 1)
    with profctx.profile_step(role="ref"):
        with torch.no_grad():
            for _ in range(int(mb * 1e6 / per["ref"] / scale)):
                torch.nn.functional.linear(x, x).softmax(-1)
    with profctx.profile_step(role="actor_update"):
        for _ in range(int(mb * 1e6 / per["actor_update"] / scale)):
            (w * 2).sum().backward()
    with profctx.profile_step(role="critic_update"):
        for _ in range(int(mb * 1e6 / per["critic_update"] / scale)):
            x = (x - x.mean()).clamp(-1, 1)
profctx.reset()
"""

#: The floor: inflate and ``orjson.loads`` every trace; prints CPU seconds of inflating and of parsing.
_FLOOR = """
import sys, time, zlib, orjson
inflate = parse = 0.0
for path in sys.argv[1:]:
    with open(path, "rb") as fh:
        packed = fh.read()
    t0 = time.process_time()
    data = zlib.decompress(packed, 31) if packed[:2] == b"\\x1f\\x8b" else packed
    t1 = time.process_time()
    orjson.loads(data)
    t2 = time.process_time()
    inflate += t1 - t0
    parse += t2 - t1
print(inflate, parse)
"""

#: Run the CLI with the optional fast paths unimportable (a bare install; numpy too for the ``NUMPY`` variant).
_BARE = "import sys; sys.modules['isal'] = None; sys.modules['msgspec'] = None; NUMPY; from profctx.cli import main; " \
        "sys.argv[0] = 'profctx'; sys.exit(main())"


def measure(argv: list[str], repeat: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``argv`` ``repeat`` times; return the run with the least CPU: wall, cpu, peak RSS MB, stdout."""
    best: dict[str, Any] | None = None
    for _ in range(repeat):
        with tempfile.TemporaryFile("w+") as out:
            t0 = time.perf_counter()
            child = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, text=True, env=env,
                                     cwd=tempfile.gettempdir())
            _, status, usage = os.wait4(child.pid, 0)
            wall = time.perf_counter() - t0
            code = os.waitstatus_to_exitcode(status)
            if code not in (0, 1):  # report exits 1 when a capture failed: still a measured run
                raise RuntimeError(f"{argv[:6]} exited {code}")
            out.seek(0)
            run = {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss": usage.ru_maxrss / 1024,
                   "out": out.read()}
        if best is None or run["cpu"] < best["cpu"]:
            best = run
    assert best is not None
    return best


def generate(folder: Path, mb: float, shapes: bool) -> Path:
    """Make the real captures (one per role) under ``folder/source``, once; return that folder."""
    source = folder / "source"
    if not (source / ".profctx").is_dir():
        subprocess.run([sys.executable, "-c", _GENERATE, str(source), str(mb), "1" if shapes else "0"], check=True,
                       capture_output=True)
    return source


def lay_out(source: Path, run: Path, ranks: int, steps: int) -> list[Path]:
    """Lay the source captures out as ``ranks`` x ``steps`` captures under ``run``; return the trace files."""
    if run.exists():
        shutil.rmtree(run)
    (run / ".profctx").mkdir(parents=True)
    records = [json.loads(line) for shard in sorted((source / ".profctx").glob("*.jsonl"))
               for line in shard.read_text().splitlines() if line.strip()]
    traces: list[Path] = []
    for rank in range(ranks):
        pid = 10_000 + rank
        lines = []
        for step in range(1, steps + 1):
            shift = (step - 1) * 10.0
            for record in records:
                new = dict(record, rank=rank, world_size=ranks, pid=pid, steps=[step], step=step, last_step=step,
                           capture=f"{record['capture']}-{rank}-{step}", folder=f"step{step:06d}/{record['role']}")
                for key in ("start_time", "end_time"):
                    if new.get(key):
                        new[key] = new[key] + shift
                files = []
                for item in record.get("files") or []:
                    name = Path(item["path"]).name.replace("rank0-of-1", f"rank{rank}-of-{ranks}")
                    rel = f"{new['folder']}/{name}"
                    target = run / rel
                    if not target.exists():
                        target.parent.mkdir(parents=True, exist_ok=True)
                        os.link(source / item["path"], target)
                        traces.append(target)
                    files.append({**item, "path": rel})
                if "files" in new:
                    new["files"] = files
                lines.append(json.dumps(new))
        (run / ".profctx" / f"real.rank{rank}-of-{ranks}.vm.{pid}.jsonl").write_text("\n".join(lines) + "\n")
    return sorted(traces)


def add_bomb(run: Path, bomb: Path, mb: float) -> None:
    """Copy ``run`` to ``bomb`` and replace one trace by a valid one that inflates to ``mb`` MB (gzip level 9)."""
    if bomb.exists():
        shutil.rmtree(bomb)
    shutil.copytree(run, bomb, copy_function=os.link)
    victim = sorted(bomb.rglob("*.pt.trace.json.gz"))[0]
    # One event over and over (inflating about 1000 times); of no duration, so that none nests in another.
    event = b'{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1.5, "dur": 0}'
    chunk = b",\n".join([event] * 10_000) + b",\n"
    zipper = zlib.compressobj(9, zlib.DEFLATED, 31)
    victim.unlink()
    with open(victim, "wb") as out:
        out.write(zipper.compress(b'{"traceEvents": [\n'))
        for _ in range(int(mb * 1e6 / len(chunk))):
            out.write(zipper.compress(chunk))
        out.write(zipper.compress(event + b"\n]}\n"))
        out.write(zipper.flush())


def add_large(run: Path, large: Path, mb: float) -> float:
    """Copy ``run`` to ``large`` and replace one trace by a real one's events repeated (each copy after the
    last) to about ``mb`` MB of JSON; return its MB."""
    if large.exists():
        shutil.rmtree(large)
    shutil.copytree(run, large, copy_function=os.link)
    victim = sorted(large.rglob("*.pt.trace.json.gz"))[0]
    with gzip.open(victim, "rb") as fh:
        doc = json.load(fh)
    events = doc.pop("traceEvents")
    meta = [e for e in events if e.get("ph") == "M"]
    timed = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    first = min(e["ts"] for e in timed)
    span = max(e["ts"] + e["dur"] for e in timed) - first + 1.0
    victim.unlink()
    written = 0
    zipper = zlib.compressobj(1, zlib.DEFLATED, 31)
    with open(victim, "wb") as out:
        head = json.dumps({k: v for k, v in doc.items()})[:-1].encode() + b', "traceEvents": [\n'
        out.write(zipper.compress(head + json.dumps(meta)[1:-1].encode()))
        copy = 0
        while written < mb * 1e6:
            shifted = [dict(e, ts=round(e["ts"] + copy * span, 3)) for e in timed]
            text = b",\n" + json.dumps(shifted, indent=1)[1:-1].encode()
            out.write(zipper.compress(text))
            written += len(text)
            copy += 1
        out.write(zipper.compress(b"\n]}\n"))
        out.write(zipper.flush())
    return written / 1e6


def json_size(path: Path) -> float:
    """Return the MB of JSON in a ``.json.gz``."""
    with gzip.open(path, "rb") as fh:
        return sum(len(c) for c in iter(lambda: fh.read(1 << 20), b"")) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--mb", type=float, default=10.0, help="approximate MB of JSON per real trace")
    parser.add_argument("--shapes", action="store_true", help="record shapes (torch's larger args)")
    parser.add_argument("--bomb-mb", type=float, default=1024.0, help="MB the gzip bomb inflates to (0: none)")
    parser.add_argument("--large-mb", type=float, default=150.0,
                        help="MB of JSON of one large trace made of real events, for the memory bound (0: none)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each command; the least CPU counts")
    parser.add_argument("--bare", action="store_true", help="also time the commands without isal and msgspec")
    parser.add_argument("--keep", metavar="DIR", help="make (or reuse) the captures here")
    parser.add_argument("--old", metavar="PYTHONPATH", help="also time the commands of another checkout (its root)")
    args = parser.parse_args()
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="profctx-bench-real-"))
    source = generate(folder, args.mb, args.shapes)
    run = folder / "run"
    traces = lay_out(source, run, args.ranks, args.steps)
    here = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    py = sys.executable
    distinct = {os.stat(p).st_ino: p for p in traces}
    sizes = {ino: json_size(p) for ino, p in distinct.items()}
    largest = max(sizes.values())
    total_mb = sum(sizes[os.stat(p).st_ino] for p in traces)
    jobs = "--jobs" in subprocess.run([py, "-m", "profctx", "summary", "--help"], capture_output=True, text=True,
                                      env=env, cwd=tempfile.gettempdir()).stdout
    floor = measure([py, "-c", _FLOOR, *map(str, traces)], args.repeat, env)
    inflate_s, parse_s = map(float, floor["out"].split())
    html = folder / "report.html"
    commands: dict[str, list[str]] = {
        "summary": ["summary", str(run), "--json", "--no-progress"],
        "report": ["report", str(run), "-o", str(html), "--no-progress"],
    }
    results: dict[str, dict[str, Any]] = {}
    for label, argv in commands.items():
        results[label] = measure([py, "-m", "profctx", *argv], args.repeat, env)
        if jobs:
            results[f"{label} --jobs 1"] = measure([py, "-m", "profctx", *argv, "--jobs", "1"], args.repeat, env)
        if args.bare:
            results[f"{label}, no isal/msgspec"] = measure([py, "-c", _BARE.replace("NUMPY", "pass"), *argv],
                                                           args.repeat, env)
            results[f"{label}, no isal/msgspec/numpy"] = measure(
                [py, "-c", _BARE.replace("NUMPY", "sys.modules['numpy'] = None"), *argv], args.repeat, env)
        if args.old:
            results[f"{label}, --old checkout"] = measure([py, "-m", "profctx", *argv], args.repeat,
                                                          {**os.environ, "PYTHONPATH": args.old})
    bomb_rss = None
    if args.bomb_mb:
        bomb = folder / "bomb"
        add_bomb(run, bomb, args.bomb_mb)
        bombed = measure([py, "-m", "profctx", "summary", str(bomb), "--json", "--no-progress"], 1, env)
        bomb_rss = bombed["rss"]
        results["summary, one trace a gzip bomb"] = bombed
    large_mb = None
    if args.large_mb:
        # Made in a child: a child's peak RSS as wait4 reads it starts from its parent's at the fork, so this
        # process must not hold the trace's JSON (it made every later figure read about 157 MB).
        maker = os.fork()
        if maker == 0:
            code = 1
            try:
                add_large(run, folder / "large", args.large_mb)
                code = 0
            finally:
                os._exit(code)
        if os.waitpid(maker, 0)[1] != 0:
            raise RuntimeError("making the large trace failed")
        large_mb = json_size(sorted((folder / "large").rglob("*.pt.trace.json.gz"))[0])
        results[f"summary, one trace of {large_mb:.0f} MB"] = measure(
            [py, "-m", "profctx", "summary", str(folder / "large"), "--json", "--no-progress"], 1, env)
    floor_cpu = floor["cpu"]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, run in {folder}")
    print(f"inputs: {len(traces)} real torch CPU traces ({args.ranks} ranks x {args.steps} steps x {len(ROLES)} "
          f"roles{', shapes recorded' if args.shapes else ''}), {total_mb:.0f} MB of JSON, largest "
          f"{largest:.1f} MB; floor (child) {floor_cpu:.2f} s CPU: inflate {inflate_s:.2f} s + orjson.loads "
          f"{parse_s:.2f} s")
    print("| command | CPU s | CPU / floor | CPU / orjson.loads alone | wall / CPU | peak RSS MB | RSS / largest |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, r in results.items():
        print(f"| {label} | {r['cpu']:.2f} | {r['cpu'] / floor_cpu:.2f} | {r['cpu'] / parse_s:.2f} | "
              f"{r['wall'] / r['cpu']:.2f} | {r['rss']:.0f} | {r['rss'] / largest:.2f} |")
    if large_mb:
        print(f"large trace: {large_mb:.0f} MB of JSON; peak RSS / it: "
              f"{results[f'summary, one trace of {large_mb:.0f} MB']['rss'] / large_mb:.2f}")
    print(json.dumps({"floor_cpu": floor_cpu, "inflate_s": inflate_s, "parse_s": parse_s, "largest_mb": largest,
                      "bomb_rss": bomb_rss,
                      "results": {k: {f: v[f] for f in ("wall", "cpu", "rss")} for k, v in results.items()}}))


if __name__ == "__main__":
    main()
