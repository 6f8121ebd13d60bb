"""The manifest: shards per process, merged per capture, tolerant of a crash-cut last line."""

from __future__ import annotations

import json
from pathlib import Path

import profctx
from profctx.records._manifest import iter_records, read


def run(save: Path, rank: int) -> None:
    profctx.configure(steps=[1, 2], save_path=save, tool="noop", rank=rank, world_size=2, ranks="all",
                      run_id="r1")
    for step in (1, 2, 3):
        with profctx.profile_step(step):
            pass
    profctx.reset()


def test_one_shard_per_process_identity_and_merged_records(tmp_path: Path) -> None:
    run(tmp_path, 0)
    run(tmp_path, 1)
    shards = sorted(p.name for p in (tmp_path / ".profctx").glob("*.jsonl"))
    assert len(shards) == 2 and all(s.startswith("r1.rank") for s in shards)
    records = read(tmp_path)
    assert sorted((r["rank"], r["step"], r["status"]) for r in records) == [
        (0, 1, "ok"), (0, 2, "ok"), (1, 1, "ok"), (1, 2, "ok")]
    assert all(r["run"] == "r1" and r["backend"] == "noop" and r["files"] == [] for r in records)
    assert len(list(iter_records(tmp_path))) == 8  # a started and a finished record each


def test_a_cut_last_line_is_skipped(tmp_path: Path) -> None:
    run(tmp_path, 0)
    shard = next((tmp_path / ".profctx").glob("*.jsonl"))
    lines = shard.read_text().splitlines()
    last = json.loads(lines[-1])
    shard.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])
    records = {r["capture"]: r for r in read(tmp_path)}
    assert records[last["capture"]]["status"] == "open"
    assert sum(r["status"] == "ok" for r in records.values()) == 1


def test_missing_folder_reads_as_empty(tmp_path: Path) -> None:
    assert read(tmp_path / "nowhere") == []
