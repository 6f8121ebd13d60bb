"""SIGTERM storms, many times: the loop of ``tests/test_exit.py`` killed by bursts of SIGTERM.

Each run starts the test's training loop (slow manifest appends, tiny or large roles, step or
role mode by seed), waits a random time, sends 1-6 SIGTERMs a few ms apart and records: whether
the process ended within 60 s (else it hung and is killed), its return code, the time from the
first signal to exit, and the status of every capture in its manifest (``open`` would be a
capture left in progress; the manifest reader folds ``started`` without ``finished`` into it).

Run: ``PYTHONPATH=. python benchmarks/storm.py [--runs 100] [--first-seed 0]``. Prints one line
per run and a summary; the figures go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from profctx.records._manifest import read

HERE = Path(__file__).resolve().parent


def loop_script() -> str:
    """The training loop the suite's storm test runs (one source for both)."""
    spec = importlib.util.spec_from_file_location("storm_test_exit", HERE.parent / "tests" / "test_exit.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return textwrap.dedent(module.LOOP)


def storm(seed: int, script: str) -> dict[str, Any]:
    """Run one storm (the suite's test with this seed); return what happened."""
    rng = random.Random(seed)
    mode = "role" if seed % 2 else "step"
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen([sys.executable, "-c", script, tmp, mode, str(rng.choice([1, 50]))],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out: dict[str, Any] = {"seed": seed, "mode": mode}
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                line = proc.stdout.readline() if proc.stdout else ""
                if "looping" in line or (not line and proc.poll() is not None):
                    break
            time.sleep(rng.uniform(0, 0.3))
            sent = time.monotonic()
            signals = rng.randint(1, 6)
            for _ in range(signals):
                proc.send_signal(signal.SIGTERM)
                time.sleep(rng.uniform(0, 0.03))
            try:
                out["rc"] = proc.wait(timeout=60)
                out["hung"] = False
            except subprocess.TimeoutExpired:
                out["hung"] = True
                proc.kill()
                out["rc"] = proc.wait()
            out["exit_s"] = time.monotonic() - sent
            out["signals"] = signals
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        records = read(tmp)
        out["statuses"] = dict(collections.Counter(r["status"] for r in records))
        out["missing_files"] = sum(
            1 for r in records if r["status"] == "ok" and r["kind"] != "engine"
            for f in r["files"] if not (Path(tmp) / f["path"]).is_file())
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--first-seed", type=int, default=0)
    args = parser.parse_args()
    script = loop_script()
    results = []
    for seed in range(args.first_seed, args.first_seed + args.runs):
        r = storm(seed, script)
        results.append(r)
        print(r, flush=True)
    hung = sum(r["hung"] for r in results)
    bad_rc = [r["seed"] for r in results if r["rc"] != -signal.SIGTERM]
    left_open = [r["seed"] for r in results if set(r["statuses"]) - {"ok", "interrupted", "skipped"}]
    empty = [r["seed"] for r in results if not r["statuses"]]
    exits = sorted(r["exit_s"] for r in results)
    print(f"\n{len(results)} runs: {hung} hung; rc != -SIGTERM in {len(bad_rc)} {bad_rc}; "
          f"a capture not ok/interrupted/skipped in {len(left_open)} {left_open}; "
          f"no record in {len(empty)} {empty}; missing files {sum(r['missing_files'] for r in results)}; "
          f"exit after first signal: median {exits[len(exits) // 2]:.2f} s, max {exits[-1]:.2f} s")
    total = collections.Counter()
    for r in results:
        total.update(r["statuses"])
    print(f"capture statuses over all runs: {dict(total)}")


if __name__ == "__main__":
    main()
