"""A run folder costs what it holds and shows only what it holds: hard links, copies of records, bombs, bad times.

Each case is a copy of a real two-rank torch run (``run_dir``) with one hostile thing added. The
commands run in-process through :func:`profctx.cli.main` (under the deadline of ``run_all``); what
each costs is read from what it says (the events it counted, where it stopped inflating), never
from a clock.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import zlib
from pathlib import Path
from typing import Any

import pytest

from profctx.cli import main
from profctx.util._untrusted import INFLATE_FREE, INFLATE_RATIO

from .test_hostile import CANARY, add_records, first_record, hostile_copy, run_all


def _trace(folder: Path, role: str = "rollout", rank: int = 0) -> Path:
    return next((folder / "step000001" / role).glob(f"rank{rank}-*.json.gz"))


def _strict(text: str) -> Any:
    """Parse JSON refusing ``NaN`` and ``Infinity`` (as Perfetto and orjson do)."""

    def refuse(token: str) -> Any:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def _summary(folder: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    main(["summary", str(folder), "--json"])
    found: dict[str, Any] = _strict(capsys.readouterr().out)
    return found


def _op_counts(summary: dict[str, Any]) -> dict[tuple[str, str], int]:
    return {(role, op["name"]): op["count"] for role, ops in summary["role_ops"].items() for op in ops}


def _merged_ops(folder: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    main(["merge", str(folder), "-o", str(out)])
    said = capsys.readouterr()
    with gzip.open(out, "rt", encoding="utf-8") if out.name.endswith(".gz") else open(out, encoding="utf-8") as fh:
        trace = _strict(fh.read())
    return sum(1 for e in trace["traceEvents"] if e.get("cat") == "cpu_op"), said.out + said.err


def test_a_hard_link_to_a_file_outside_is_refused_by_every_reader(run_dir: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    folder, outside = hostile_copy(run_dir, tmp_path)
    canary = outside / "canary.pt.trace.json"
    os.link(canary, folder / "step000001" / "rollout" / "hard.pt.trace.json")
    add_records(folder, {"files": [{"path": "step000001/rollout/hard.pt.trace.json", "bytes": 10}]})
    # A manifest shard and a timeline: hard links to files outside that name the canary.
    record = {**first_record(folder), "capture": "planted", "role": CANARY, "files": []}
    (outside / "manifest.jsonl").write_text(json.dumps(record) + "\n")
    os.link(outside / "manifest.jsonl", folder / ".profctx" / "clirun.rank7-of-9.vm.7.jsonl")
    header = {"v": 1, "schema": "profctx.timeline", "run": "clirun", "rank": 7, "host": "vm", "pid": 7}
    step = {"step": 1, "start": 1.0, "time_s": 0.5, "roles": {CANARY: [0.1, 1]}}
    (outside / "secret.timeline").write_text(json.dumps(header) + "\n" + json.dumps(step) + "\n")
    os.link(outside / "secret.timeline", folder / ".profctx" / "clirun.rank7-of-9.vm.7.timeline")
    results = run_all(folder, tmp_path / "out", capsys)
    main(["timeline", str(folder), "--json"])
    printed = capsys.readouterr()
    results["timeline"] = (0, printed.out + printed.err)
    for name, (_, text) in results.items():
        assert CANARY not in text, name
    for name in ("summary", "merge", "ls", "timeline"):
        assert "hard links" in results[name][1], name  # the reason is said where damage is reported


def test_a_trace_many_records_name_is_read_and_written_once(run_dir: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    clean, _ = hostile_copy(run_dir, tmp_path / "clean")
    folder, _ = hostile_copy(run_dir, tmp_path / "hostile")
    victim = _trace(folder)
    rel = victim.relative_to(folder).as_posix()
    # Twelve more records naming the same file, spelled in every way that reaches it.
    spellings = [rel, f"./{rel}", f"step000001/../{rel}", str(victim)]
    add_records(folder, *({"files": [{"path": spellings[i % 4], "bytes": victim.stat().st_size}]}
                          for i in range(12)))
    base, copied = _summary(clean, capsys), _summary(folder, capsys)
    assert _op_counts(copied) == _op_counts(base)  # every event counted once, as in the clean run
    assert [(p["step"], p["role"], p["time_s"]) for p in copied["phases"]] == \
        [(p["step"], p["role"], p["time_s"]) for p in base["phases"]]
    # Each repeat is said once: by the manifest reader (the same name) or by the trace reader (the same file).
    assert sum("named by more than one capture record" in p or "names already: a damaged entry" in p
               for p in copied["problems"]) == 12
    clean_ops, _ = _merged_ops(clean, tmp_path / "clean.json.gz", capsys)
    merged_ops, said = _merged_ops(folder, tmp_path / "hostile.json.gz", capsys)
    assert merged_ops == clean_ops > 0  # the file's events written once
    assert said.count("merged once, for the first") + said.count("names already: a damaged entry") == 12


def _bomb(path: Path, inflated_mb: int) -> int:
    """Write a valid gzip trace holding ``inflated_mb`` MB of JSON whitespace; return its compressed size."""
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 31)
    spaces = b" " * (1 << 20)
    parts = [squeeze.compress(b'{"traceEvents": [')]
    parts += [squeeze.compress(spaces) for _ in range(inflated_mb)]
    parts.append(squeeze.compress(b"]}") + squeeze.flush())
    path.write_bytes(b"".join(parts))
    return path.stat().st_size


def test_inflation_is_budgeted_for_the_whole_command(run_dir: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder, _ = hostile_copy(run_dir, tmp_path)
    # Each bomb alone inflates to less than the free allowance a file read alone has (64 MB), so a cap per
    # file lets all of them through: 8 x 16 MB from about 130 kB.
    names = [f"step000001/rollout/b{i}.pt.trace.json.gz" for i in range(8)]
    for name in names:
        _bomb(folder / name, 16)
    add_records(folder, *({"files": [{"path": name, "bytes": 1}]} for name in names))
    assert INFLATE_FREE > 16 << 20
    main(["summary", str(folder)])
    said = capsys.readouterr()
    text = said.out + said.err
    cut = [int(mb) for mb in re.findall(r"read stopped after (\d+) MB", text)]
    assert len(cut) == len(names), text  # every bomb stopped at its share
    traces = [p for p in folder.rglob("*.json*") if p.is_file()]
    on_disk = sum(p.stat().st_size for p in traces)
    # What the command inflated is bounded by what the folder holds (its whole traces' bytes counted at
    # INFLATE_RATIO, plus one INFLATE_FREE for the command), read off what it says it read (+1 MB a file:
    # the figure is rounded down and the last read overshoots by at most one buffer).
    assert sum(cut) <= (INFLATE_RATIO * on_disk + INFLATE_FREE >> 20) + len(cut), (cut, on_disk)


def _damage(path: Path, field: str, value: float) -> str:
    """Rewrite a real torch trace with the first CPU operator's ``field`` set to ``value``; return its name."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        trace = json.load(fh)
    first = min((e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    first[field] = value
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump(trace, fh)  # json writes NaN and Infinity as bare words, as a damaged producer would
    return str(first["name"])


@pytest.mark.parametrize(("field", "value"), [("dur", math.inf), ("dur", -5.0), ("ts", math.nan)],
                         ids=["dur-inf", "dur-negative", "ts-nan"])
def test_a_non_finite_time_is_damage_and_the_other_operators_keep_their_times(
        run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: float) -> None:
    clean, _ = hostile_copy(run_dir, tmp_path / "clean")
    folder, _ = hostile_copy(run_dir, tmp_path / "hostile")
    name = _damage(_trace(folder), field, value)
    base, hurt = _summary(clean, capsys), _summary(folder, capsys)
    assert any("not a finite number" in p for p in hurt["problems"]), hurt["problems"]
    before, after = _op_counts(base), _op_counts(hurt)
    assert after[("rollout", name)] == before[("rollout", name)] - 1  # the one damaged event left out
    times = {(role, op["name"]): op["self_s"] for role, ops in hurt["role_ops"].items() for op in ops}
    for (role, op), seconds in times.items():
        assert math.isfinite(seconds) and seconds >= 0, (role, op, seconds)
    assert all(math.isfinite(p["time_s"]) for p in hurt["phases"])
    results = run_all(folder, tmp_path / "out", capsys, ("summary", "report", "diff", "check", "merge"))
    for command, (_, text) in results.items():
        assert not re.search(r"\b(?:inf|nan)\b|\binf s\b", text, re.IGNORECASE), command


def test_a_non_finite_role_time_in_a_timeline_is_damage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "run"
    (folder / ".profctx").mkdir(parents=True)
    header = {"v": 1, "schema": "profctx.timeline", "run": "r", "rank": 0, "world_size": 1, "host": "h", "pid": 1}
    lines = [json.dumps(header)]
    for step in range(1, 9):
        role = math.inf if step == 4 else 0.25
        lines.append(json.dumps({"step": step, "start": 100.0 + step, "time_s": 0.5, "roles": {"train": [role, 1]}}))
    (folder / ".profctx" / "r.rank0-of-1.h.1.timeline").write_text("\n".join(lines) + "\n")
    main(["timeline", str(folder), "--json"])
    found = _strict(capsys.readouterr().out)
    assert [row["step"] for row in found["steps"]] == [1, 2, 3, 5, 6, 7, 8]
    assert any("line 5" in d for d in found["damaged"]), found["damaged"]
    assert all(row["roles"]["train"]["time_s"] == 0.25 for row in found["steps"])


def _peak(folder: Path) -> int:
    """Return the peak resident bytes of ``profctx timeline FOLDER --json`` in a fresh process (Linux: kB)."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    child = subprocess.Popen([sys.executable, "-m", "profctx", "timeline", str(folder), "--json"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(child.pid, 0)
    assert os.waitstatus_to_exitcode(status) in (0, 1, 2)
    return usage.ru_maxrss * 1024


def _timeline(path: Path, rank: int, steps: int) -> None:
    header = {"v": 1, "schema": "profctx.timeline", "run": "r", "rank": rank, "world_size": 2, "host": "h",
              "pid": 100 + rank}
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(header) + "\n")
        for step in range(steps):
            fh.write(f'{{"step":{step},"start":{1000.0 + step:.6f},"time_s":0.500000,'
                     f'"roles":{{"rollout":[0.100000,1],"actor_update":[0.200000,2]}}}}\n')


def test_timeline_memory_follows_the_bytes_it_reads_not_the_names_a_file_has(tmp_path: Path) -> None:
    if not hasattr(os, "wait4"):
        pytest.skip("reads a child's peak memory with os.wait4")
    folder, empty = tmp_path / "run", tmp_path / "empty"
    (folder / ".profctx").mkdir(parents=True)
    (empty / ".profctx").mkdir(parents=True)
    _timeline(folder / ".profctx" / "r.rank0-of-2.h.100.timeline", 0, 10_000)  # about 1 MB, read
    linked = folder / ".profctx" / "r.rank1-of-2.h.101.timeline"
    _timeline(linked, 1, 10_000)
    for i in range(40):  # one more MB under 40 more names: refused (a hard link), so never read 41 times
        os.link(linked, folder / ".profctx" / f"r.rank1-of-2.h.{200 + i}.timeline")
    read = (folder / ".profctx" / "r.rank0-of-2.h.100.timeline").stat().st_size
    # The same command on a folder with nothing to read: what starting and importing cost (ru_maxrss is a peak).
    grown = _peak(folder) - _peak(empty)
    # The reader keeps each step as Python objects, and the command builds its rows and JSON document (about
    # 20x the file's bytes, measured in one process after a warm-up run): 40x leaves room for the allocator.
    # Reading the linked file under each of its 41 names, as before, grows it by over 100x.
    assert grown <= 40 * read, (grown, read)


def test_ls_says_a_linked_shard_is_a_link_not_a_line_cut_by_a_crash(run_dir: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder, outside = hostile_copy(run_dir, tmp_path)
    (folder / ".profctx" / "clirun.rank7-of-9.vm.7.jsonl").symlink_to(outside / "canary.pt.trace.json")
    main(["ls", str(folder)])
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "rank7-of-9" in line]
    assert len(said) == 1 and "symbolic link" in said[0] and "not read" in said[0], err
    assert "cut by a crash" not in said[0]


@pytest.mark.parametrize("what", ["config", "override"])
def test_verl_convert_reads_its_inputs_capped_and_never_waits_on_them(tmp_path: Path, what: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from profctx.core._config import MAX_YAML_BYTES

    from .test_hostile import deadline

    pytest.importorskip("omegaconf")
    config = tmp_path / "verl.yaml"
    config.write_text("global_profiler:\n  steps: [1, 2]\n")
    big = tmp_path / "big.yaml"
    with open(big, "w", encoding="utf-8") as fh:  # 5 MB of YAML: over the cap configure() puts on a file
        fh.write("a:\n")
        fh.writelines(f"  k{i}: {i}\n" for i in range(420_000))
    assert big.stat().st_size > MAX_YAML_BYTES
    os.mkfifo(tmp_path / "fifo")
    for source, cause in ((big, "of at most 4 MiB"), (Path("/dev/zero"), "a device"), (tmp_path / "fifo", "FIFO")):
        argv = ["verl-convert", str(source)] if what == "config" else ["verl-convert", str(config), f"@{source}"]
        with deadline(20):  # a FIFO opened for reading blocks until a writer comes: the test must not hang
            assert main(argv) == 2
        err = capsys.readouterr().err
        assert cause in err and "Traceback" not in err, (source, err)
