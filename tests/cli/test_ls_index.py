"""The listing index a process writes beside its shard: ``ls`` reads the same with it, without it, or stale."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from profctx._layout import MANIFEST_DIR
from profctx._listing import index_path, read_index, write_index
from profctx.cli import main


def _ls(folder: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["ls", str(folder), *args])
    out, err = capsys.readouterr()
    return code, out, err


def _without_index(folder: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Return what ``ls`` prints once every index under ``folder`` is gone (read from the shards alone)."""
    bare = folder.parent / f"{folder.name}-bare"
    shutil.copytree(folder, bare)
    for index in (bare / MANIFEST_DIR).glob("*.index"):
        index.unlink()
    code, out, err = _ls(bare, capsys, *args)
    return code, out.replace(str(bare), str(folder)), err.replace(str(bare), str(folder))


@pytest.fixture
def run(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    return copy


def _shard(folder: Path, rank: int) -> Path:
    return next((folder / MANIFEST_DIR).glob(f"*.rank{rank}-*.jsonl"))


def test_a_process_that_ends_leaves_an_index_and_ls_reads_the_same(run: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rank0, rank1 = _shard(run, 0), _shard(run, 1)
    assert index_path(rank0).is_file() and index_path(rank1).is_file()
    assert read_index(rank0) is not None
    assert read_index(rank1) is None  # a line was appended to rank 1's shard after its process ended
    listed = _ls(run, capsys)
    assert listed == _without_index(run, capsys)
    assert listed[0] == 1 and "9 captures" in listed[1] and "cut by a crash" in listed[2]


def test_an_index_covering_damaged_lines_still_reports_them(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rank1 = _shard(run, 1)
    assert write_index(rank1)  # now covers the cut last line
    assert read_index(rank1) is not None
    code, out, err = _ls(run, capsys)
    assert (code, out, err) == _without_index(run, capsys)
    assert f"{rank1.name}:" in err and "cut by a crash" in err


def test_records_written_after_the_index_are_listed(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rank0 = _shard(run, 0)
    first = json.loads(rank0.read_bytes().splitlines()[0])
    late = {**first, "capture": "late", "event": "finished", "status": "failed", "error": "LateError: after exit",
            "steps": [9], "step": 9, "last_step": 9, "start_time": 2e9}
    with open(rank0, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(late) + "\n")
    assert read_index(rank0) is None
    code, out, err = _ls(run, capsys)
    assert (code, out, err) == _without_index(run, capsys)
    assert "LateError: after exit" in out and "10 captures" in out


def test_a_shard_rewritten_to_the_same_size_is_read_again(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rank0 = _shard(run, 0)
    data = rank0.read_bytes()
    assert b'"status":"ok"' in data[-2000:]
    at = data.rindex(b'"status":"ok"')
    rank0.write_bytes(data[:at] + b'"status":"no"' + data[at + len(b'"status":"ok"'):])
    assert read_index(rank0) is None
    code, out, _ = _ls(run, capsys)
    assert " no " in out and (code, out) == _without_index(run, capsys)[:2]


@pytest.mark.parametrize("damage", ["cut", "garbage", "newer", "altered", "empty"])
def test_a_damaged_index_is_ignored(run: Path, damage: str, capsys: pytest.CaptureFixture[str]) -> None:
    index = index_path(_shard(run, 0))
    text = index.read_bytes()
    head, _, body = text.partition(b"\n")
    if damage == "cut":
        index.write_bytes(text[: len(text) // 2])
    elif damage == "garbage":
        index.write_bytes(b"\xff\x00not json\n{")
    elif damage == "newer":
        index.write_bytes(head.replace(b'"index":1', b'"index":99') + b"\n" + body)
    elif damage == "altered":
        index.write_bytes(head + b"\n" + body.replace(b'"ok"', b'"no"', 1))
    else:
        index.write_bytes(b"")
    assert read_index(_shard(run, 0)) is None
    assert _ls(run, capsys) == _without_index(run, capsys)


def test_a_killed_process_leaves_no_index_and_its_cut_shard_lists(run: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # Killed mid-run: its shard ends in a started record cut short, and the index (here one from an
    # earlier life of the shard) no longer matches.
    rank0 = _shard(run, 0)
    lines = rank0.read_bytes().splitlines(keepends=True)
    started = next(line for line in lines if b'"event":"started"' in line)
    rank0.write_bytes(b"".join(lines[:-1]) + started + started[: len(started) // 2])
    assert read_index(rank0) is None
    listed = _ls(run, capsys)
    assert listed == _without_index(run, capsys)
    assert f"{rank0.name}:{len(lines) + 1}" in listed[2] and "captures" in listed[1]
    index_path(rank0).unlink()
    assert _ls(run, capsys) == listed


def test_a_shard_holding_an_open_capture_gets_no_index(run: Path) -> None:
    rank0 = _shard(run, 0)
    started = next(line for line in rank0.read_bytes().splitlines() if b'"event":"started"' in line)
    record = {**json.loads(started), "capture": "never-finished"}
    with open(rank0, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
    assert not write_index(rank0)
    assert not index_path(rank0).exists()


def test_a_capture_finished_in_a_later_shard_merges_across_the_index(run: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    rank0 = _shard(run, 0)
    finished = next(json.loads(line) for line in rank0.read_bytes().splitlines()
                    if b'"event":"finished"' in line and b'"status":"ok"' in line)
    assert "group" not in finished
    started = {**finished, "event": "started", "group": "early"}
    started.pop("status")
    for key in ("files", "bytes", "duration_s", "end_time"):
        started.pop(key, None)
    # A shard whose name sorts first starts the capture; rank 0's indexed shard finishes it.
    (run / MANIFEST_DIR / "clirun.aaa.h.1.jsonl").write_text(json.dumps(started) + "\n")
    assert read_index(rank0) is not None
    listed = _ls(run, capsys)
    assert listed == _without_index(run, capsys)
    assert f"early:{finished['rank']}" in listed[1]  # the started record's keys are merged in
