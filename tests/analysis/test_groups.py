"""Worker groups: one row per worker process, never one per rank number; ``--group`` everywhere.

The run is shaped like a Ray job: a driver outside every group, an ``actor`` group of two ranks and
a ``rollout`` group of two ranks, so four processes share the rank number 0 or 1. Records are
written as the writer does (a ``group`` key next to ``rank``; none for the driver).
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest

from profctx.analysis import summarize
from profctx.cli import main
from profctx.manifest import ManifestReader, drivers, process_names

from .synth import trace

ORIGIN = 1_800_000_000.0
#: (group, rank, pid, role, seconds per step): the driver waits on both phases.
PROCESSES = [(None, 0, 100, "train", 1.0), ("actor", 0, 200, "actor_update", 0.3),
             ("actor", 1, 201, "actor_update", 0.3), ("rollout", 0, 300, "rollout", 0.5),
             ("rollout", 1, 301, "rollout", 0.5)]


def write_job(save: Path, run: str = "job", slow: dict[str, float] | None = None) -> Path:
    """Write a two-step run of :data:`PROCESSES`; ``slow`` multiplies a role's time."""
    slow = slow or {}
    for group, rank, pid, role, seconds in PROCESSES:
        lines = []
        for step in (1, 2):
            begin = (step - 1) * 2.0 + (0.6 if role == "actor_update" else 0.0)
            duration = seconds * slow.get(role, 1.0)
            folder = f"step{step:06d}/{role}"
            rel = f"{folder}/{group or 'driver'}-{rank}-{pid}.pt.trace.json.gz"
            path = save / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            doc = trace(pid, begin * 1e6, duration, f"{role}::outer", f"{role}::leaf", 4, False,
                        base_ns=int(ORIGIN) * 10**9, rank=rank)
            path.write_bytes(gzip.compress(json.dumps(doc).encode()))
            common: dict[str, Any] = {"v": 1, "run": run, "rank": rank, "world_size": 1 if group is None else 2,
                                      "host": "node", "pid": pid, "capture": f"{run}-{pid}-{step}", "kind": "role",
                                      "steps": [step], "step": step, "role": role, "backend": "torch",
                                      "folder": folder}
            if group is not None:
                common["group"] = group
            lines.append({**common, "event": "started", "start_time": ORIGIN + begin, "thread": "MainThread"})
            lines.append({**common, "event": "finished", "status": "ok", "start_time": ORIGIN + begin,
                          "end_time": ORIGIN + begin + duration, "duration_s": duration,
                          "files": [{"path": rel, "bytes": path.stat().st_size}], "bytes": path.stat().st_size,
                          "error": None, "notes": []})
        shard = save / ".profctx" / f"{run}.rank{rank}.node.{pid}.jsonl"
        shard.parent.mkdir(parents=True, exist_ok=True)
        shard.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return save


@pytest.fixture
def job(tmp_path: Path) -> Path:
    return write_job(tmp_path / "job")


def test_every_worker_process_gets_its_own_row_and_the_driver_is_named(job: Path) -> None:
    names = process_names(ManifestReader(job))
    assert list(names.values()) == ["driver", "actor rank 0", "actor rank 1", "rollout rank 0", "rollout rank 1"]


def test_a_run_without_groups_keeps_rank_rows_and_has_no_driver(tmp_path: Path) -> None:
    run = tmp_path / "plain"
    write_job(run)
    for shard in (run / ".profctx").iterdir():
        lines = [json.loads(line) for line in shard.read_text().splitlines()]
        shard.write_text("".join(json.dumps({k: v for k, v in x.items() if k != "group"}) + "\n" for x in lines))
    records = list(ManifestReader(run))
    assert drivers(records) == set()
    # Three processes are rank 0 and two rank 1: the roles each ran tell them apart.
    assert sorted(process_names(records).values()) == [
        "rank 0 (actor_update)", "rank 0 (rollout)", "rank 0 (train)", "rank 1 (actor_update)", "rank 1 (rollout)"]


def test_ls_shows_group_and_rank_and_filters_by_group(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls", str(job)]) == 0
    lines = capsys.readouterr().out.splitlines()
    ranks = {line.split()[2] for line in lines[1:-1]}
    assert ranks == {"driver", "actor:0", "actor:1", "rollout:0", "rollout:1"}

    assert main(["ls", str(job), "--group", "rollout"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 4 + 1 and all(" rollout:" in line for line in lines[1:-1])

    # Filtered, the driver is still named the driver (the run's layout comes from all its shards).
    assert main(["ls", str(job), "--group", "driver", "--step", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[1].split()[:3] == ["2", "train", "driver"]

    assert main(["ls", str(job), "--group", "driver", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [(r["role"], r["pid"], r.get("group")) for r in records] == [("train", 100, None)] * 2


def test_summary_rows_per_process_and_group_filter(job: Path) -> None:
    summary = summarize(job)
    assert summary.processes == ["driver", "actor rank 0", "actor rank 1", "rollout rank 0", "rollout rank 1"]
    phase = summary.phase(1, "rollout")
    assert phase is not None and set(phase.per_process) == {"rollout rank 0", "rollout rank 1"}
    doc = summary.to_json()
    assert {c["process"] for c in doc["captures"]} == set(summary.processes)

    actor = summarize(job, groups=["actor"])
    assert actor.processes == ["actor rank 0", "actor rank 1"] and actor.roles == ["actor_update"]
    # Filtered to the driver, it is still named the driver.
    assert summarize(job, groups=["driver"]).processes == ["driver"]


def test_summary_diff_and_check_take_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write_job(tmp_path / "base")
    new = write_job(tmp_path / "new", slow={"rollout": 1.5})
    assert main(["summary", str(new), "--group", "actor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["processes"] == ["actor rank 0", "actor rank 1"]

    assert main(["diff", str(base), str(new), "--group", "rollout", "--json"]) == 0
    roles = json.loads(capsys.readouterr().out)["roles"]
    assert [r["role"] for r in roles] == ["rollout"]

    # Rollout got 50 % slower: the gate fails for the run, passes for the actor group alone.
    assert main(["check", str(new), "--baseline", str(base), "--max-slowdown", "*=10%"]) == 1
    assert "rollout" in capsys.readouterr().out
    assert main(["check", str(new), "--baseline", str(base), "--max-slowdown", "*=10%", "--group", "actor"]) == 0
    assert "check passed" in capsys.readouterr().out


def test_merge_keeps_one_process_per_worker_and_filters_by_group(job: Path, tmp_path: Path) -> None:
    out = tmp_path / "all.json"
    assert main(["merge", str(job), "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names.values()) == ["actor rank 0", "actor rank 1", "driver", "rollout rank 0", "rollout rank 1",
                                      "steps"]
    labels = [e["args"]["labels"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_labels"]
    assert "run job, driver, host node, pid 100" in labels
    assert "run job, group rollout, rank 0 of 2, host node, pid 300" in labels
    # Each worker's operators land in its own process of the merged trace.
    ops = {(names[e["pid"]], e["name"]) for e in doc["traceEvents"] if e.get("cat") == "cpu_op"}
    assert ("rollout rank 0", "rollout::leaf") in ops and ("actor rank 0", "rollout::leaf") not in ops

    part = tmp_path / "rollout.json"
    assert main(["merge", str(job), "--group", "rollout", "--group", "driver", "-o", str(part)]) == 0
    doc = json.loads(part.read_text())
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names.values()) == ["driver", "rollout rank 0", "rollout rank 1", "steps"]
    assert main(["merge", str(job), "--group", "critic"]) == 2


def test_report_rows_per_process_and_group_filter(job: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert main(["report", str(job), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    labels = re.findall(r"<text class=rowlabel[^>]*>([^<]+)</text>", page)
    assert labels == ["driver", "actor rank 0", "actor rank 1", "rollout rank 0", "rollout rank 1"]
    # Hovering a row name shows the process: host and pid, group and rank.
    assert "<title>host node, pid 100, rank 0, run job</title>" in page
    assert "<title>host node, pid 300, group rollout, rank 0, run job</title>" in page
    assert main(["report", str(job), "--group", "driver", "--group", "actor", "-o", str(out)]) == 0
    labels = re.findall(r"<text class=rowlabel[^>]*>([^<]+)</text>", out.read_text(encoding="utf-8"))
    assert labels == ["driver", "actor rank 0", "actor rank 1"]


def test_a_second_process_outside_the_groups_is_not_taken_for_the_driver(job: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    shard = job / ".profctx" / "job.rank0.node.999.jsonl"
    line = {"v": 1, "run": "job", "rank": 0, "world_size": 1, "host": "node", "pid": 999, "capture": "lone",
            "kind": "role", "steps": [1], "step": 1, "role": "reward", "backend": "torch", "event": "finished",
            "status": "ok", "start_time": ORIGIN + 0.1, "end_time": ORIGIN + 0.2, "duration_s": 0.1, "files": []}
    shard.write_text(json.dumps(line) + "\n")
    names = process_names(ManifestReader(job))
    assert "driver" not in names.values() and len(set(names.values())) == 6
    for argv in (["ls", str(job)], ["ls", str(job), "--step", "1"]):
        assert main(argv) == 0
        assert " driver " not in capsys.readouterr().out
