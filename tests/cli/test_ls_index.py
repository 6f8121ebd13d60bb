"""The listing index a process writes beside its shard: ``ls`` reads the same with it, without it, or stale."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from profctx.cli import main
from profctx.core._layout import MANIFEST_DIR
from profctx.records._listing import IndexBuilder, index_path, read_index, write_index
from profctx.records._manifest import CHECKPOINT_BYTES


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
    # A line was appended to rank 1's shard after its process ended: the index covers all but it.
    found = read_index(rank1)
    assert found is not None and found.tail.startswith(b'{"v":1,"run":"clirun","capture":"cut-by-a-cra')
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
    found = read_index(rank0)
    assert found is not None and b"LateError" in found.tail  # the index covers the rest; ls reads the tail
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
        index.write_bytes(_signed(head.rpartition(b"\t")[0].replace(b'"index":2', b'"index":99')) + body)
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


def test_a_shard_holding_an_open_capture_carries_it_in_its_index(run: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    rank0 = _shard(run, 0)
    started = next(line for line in rank0.read_bytes().splitlines() if b'"event":"started"' in line)
    record = {**json.loads(started), "capture": "never-finished"}
    with open(rank0, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, separators=(",", ":")) + "\n")
    assert write_index(rank0)
    found = read_index(rank0)
    assert found is not None and found.open_ids == ["never-finished"] and not found.tail
    listed = _ls(run, capsys)
    assert listed == _without_index(run, capsys)
    assert "started, never finished" in listed[1]


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


def _signed(body: bytes) -> bytes:
    """Return ``body`` as a line of the index, with its CRC (an index line someone rewrote with care)."""
    return body + b"\t%08x\n" % (zlib.crc32(body) & 0xFFFFFFFF)


def _grow(shard: Path, data: bytes, cuts: list[int]) -> IndexBuilder:
    """Write ``data`` to ``shard`` as a writer would, a checkpoint of its index at each of ``cuts`` (byte counts)."""
    shard.write_bytes(b"")
    builder = IndexBuilder(shard)
    done = 0
    for cut in [*cuts, len(data)]:
        with open(shard, "ab") as fh:
            fh.write(data[done:cut])
        done = cut
        if cut < len(data):
            builder.checkpoint()
    return builder


def _records(count: int, run_id: str = "seg") -> bytes:
    """Return the shard of a process that made ``count`` captures (a started and a finished record each)."""
    lines = []
    for i in range(count):
        common = {"v": 1, "run": run_id, "rank": 0, "world_size": 1, "host": "h", "pid": 7, "capture": f"c{i:05d}",
                  "kind": "role", "steps": [1 + i // 2], "step": 1 + i // 2, "last_step": 1 + i // 2,
                  "role": ("rollout", "actor_update")[i % 2], "backend": "torch", "folder": f"step{i:06d}"}
        start = 1.8e9 + i
        lines.append({**common, "event": "started", "start_time": start, "thread": "MainThread"})
        lines.append({**common, "event": "finished", "status": "ok", "start_time": start, "end_time": start + 0.25,
                      "duration_s": 0.25, "files": [{"path": f"step{i:06d}/t.json", "bytes": 100 + i}],
                      "bytes": 100 + i, "error": None, "notes": []})
    return b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in lines)


def _boundaries(data: bytes, every: int) -> list[int]:
    """Return the byte offsets after every ``every``-th line of ``data``: where a writer's checkpoints fall."""
    ends = [i + 1 for i, c in enumerate(data) if c == 0x0A]
    return ends[every - 1::every]


@pytest.fixture
def grown(tmp_path: Path) -> Path:
    """A run of one shard of 60 captures whose index got a segment every 25 lines, and a final one, as it grew."""
    folder = tmp_path / "grown"
    (folder / MANIFEST_DIR).mkdir(parents=True)
    shard = folder / MANIFEST_DIR / "seg.rank0-of-1.h.7.jsonl"
    data = _records(60)
    builder = _grow(shard, data, _boundaries(data, 25))
    assert builder.checkpoint() and builder.segments == 5 and builder.covered == len(data)
    return folder


def test_segments_list_the_same_as_the_shard_and_are_used(grown: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shard = next((grown / MANIFEST_DIR).glob("*.jsonl"))
    found = read_index(shard)
    assert found is not None and found.segments == 5 and not found.tail and len(found.ids) == 60
    listed = _ls(grown, capsys)
    assert listed == _without_index(grown, capsys) and "60 captures (60 ok)" in listed[1]
    # ls takes the rows from the segments: a row rewritten in one (its CRC made right) shows.
    index = index_path(shard)
    lines = index.read_bytes().splitlines(keepends=True)
    lines[2] = _signed(lines[2].rpartition(b"\t")[0].replace(b'"actor_update"', b'"from_the_index"', 1))
    index.write_bytes(b"".join(lines))
    assert "from_the_index" in _ls(grown, capsys)[1]


@pytest.mark.parametrize("damage", ["torn", "altered", "cut", "appended", "refinished", "reopened", "header"])
def test_a_damaged_or_stale_segment_never_changes_the_listing(grown: Path, damage: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    shard = next((grown / MANIFEST_DIR).glob("*.jsonl"))
    index = index_path(shard)
    text = index.read_bytes()
    lines = text.splitlines(keepends=True)
    data = shard.read_bytes()
    records = data.splitlines(keepends=True)
    used = 5
    if damage == "torn":  # killed while appending its last segment
        index.write_bytes(text[:-40])
        used = 4
    elif damage == "altered":  # a byte of the second segment changed: it and those after it are not used
        lines[2] = lines[2].replace(b'"ok"', b'"no"', 1)
        index.write_bytes(b"".join(lines))
        used = 1
    elif damage == "cut":  # the shard lost its last records: the segments still within it are used
        shard.write_bytes(b"".join(records[:-30]))
        used = 3
    elif damage == "appended":
        finished = json.loads(records[-1])
        late = {**finished, "capture": "late", "status": "failed", "error": "LateError: after the index"}
        with open(shard, "ab") as fh:
            fh.write(json.dumps(late, separators=(",", ":")).encode() + b"\n")
    elif damage == "refinished":  # the shard's last word wins: the index's row is stale, the shard is read
        first = json.loads(records[1])
        with open(shard, "ab") as fh:
            fh.write(json.dumps({**first, "status": "failed", "error": "Late: rewritten"}).encode() + b"\n")
        used = 0
    elif damage == "reopened":  # the shard was replaced by another one of the same name
        shard.write_bytes(data.replace(b'"host":"h"', b'"host":"x"'))
        used = 0
    else:
        index.write_bytes(text.replace(b'"index":2', b'"index":1', 1))
        used = 0
    found = read_index(shard)
    if damage == "refinished":
        assert found is not None and b"Late: rewritten" in found.tail
    else:
        assert (found.segments if found is not None else 0) == used
    listed = _ls(grown, capsys)
    assert listed == _without_index(grown, capsys)
    if damage == "appended":
        assert "LateError: after the index" in listed[1]
    if damage == "refinished":
        assert "Late: rewritten" in listed[1] and "60 captures" in listed[1]


def test_open_captures_carry_across_segments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Captures started before a checkpoint and finished after it (or never): merged as reading the shard whole.
    folder = tmp_path / "open"
    (folder / MANIFEST_DIR).mkdir(parents=True)
    shard = folder / MANIFEST_DIR / "seg.rank0-of-1.h.7.jsonl"
    records = _records(40).splitlines(keepends=True)
    # Each capture's finished record moves three captures later; the last three never finish.
    order = [line for i in range(40) for line in (records[2 * i], records[2 * i - 5] if i >= 3 else b"")]
    data = b"".join(order)
    builder = _grow(shard, data, _boundaries(data, 7))
    assert builder.segments > 4
    found = read_index(shard)
    assert found is not None and found.open_ids and found.tail
    listed = _ls(folder, capsys)
    assert listed == _without_index(folder, capsys) and "37 ok, 3 open" in listed[1]


KILLED = """
import sys
import profctx
import profctx.testing

profctx.configure(save_path=sys.argv[1], tool="recording", steps="0:100000", mode="role", exit_hooks=False,
                  warmup=False, run_id="killed")
step = 0
while True:
    step += 1
    with profctx.profile_step(step):
        with profctx.profile_step(role="rollout"):
            pass
        with profctx.profile_step(role="actor_update"):
            pass
    if step == 300:
        profctx.flush()  # the captures' finished records are written on the writer's thread: wait for them
        print("ready", flush=True)
"""


def test_a_killed_run_lists_the_same_with_the_segments_its_writer_left(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "killed"
    child = subprocess.Popen([sys.executable, "-c", KILLED, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    shard = next((folder / MANIFEST_DIR).glob("killed.*.jsonl"))
    found = read_index(shard)
    size = shard.stat().st_size
    assert found is not None and found.segments >= 4 and len(found.ids) >= 300
    # The tail not covered is what the process wrote after its last checkpoint: less than one more record.
    assert found.covered >= max(size - CHECKPOINT_BYTES - 4096, size // 2) and found.covered + len(found.tail) == size
    listed = _ls(folder, capsys)
    assert listed == _without_index(folder, capsys)
    # The captures started after the last segment are listed too (finished, or open where the kill cut them).
    shown = int(re.search(r"(\d+) captures", listed[1]).group(1))  # type: ignore[union-attr]
    later = {key.decode() for key in re.findall(rb'"capture":"(\w+)","event":"started"', found.tail)}
    assert shown == len(found.ids) + len(later | set(found.open_ids)) > len(found.ids)
    # And ls took the rows from the segments: one rewritten in the first segment (CRC made right) shows.
    index = index_path(shard)
    lines = index.read_bytes().splitlines(keepends=True)
    lines[1] = _signed(lines[1].rpartition(b"\t")[0].replace(b'"rollout"', b'"from_the_index"', 1))
    index.write_bytes(b"".join(lines))
    assert "from_the_index" in _ls(folder, capsys)[1]


def _lines(*records: dict[str, Any] | bytes) -> list[bytes]:
    return [(r if isinstance(r, bytes) else json.dumps(r, separators=(",", ":")).encode()) + b"\n" for r in records]


_BASE = {"v": 1, "run": "odd", "rank": 0, "host": "h", "pid": 7, "kind": "role", "steps": [1], "role": "a",
         "backend": "torch", "start_time": 5.0}


@pytest.mark.parametrize("case", ["keyless-tail", "damaged-started", "refinished", "two-ids", "list-id"])
def test_records_a_writer_never_writes_list_the_same_through_segments(tmp_path: Path, case: str,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # Each shard: a first part indexed by a segment, then the rest (indexed by a second one, or the tail).
    ok = {**_BASE, "event": "finished", "status": "ok", "files": []}
    if case == "keyless-tail":  # a record without id comes first in a whole read, whatever its place
        first = _lines({**ok, "capture": "k1", "role": "indexed"})
        rest = _lines({**ok, "capture": 7, "role": "keyless"})
    elif case == "damaged-started":  # unreadable, but a later record of its id means a whole read never parses it
        first = _lines(b'{"event":"started","capture":"k1","cut short"}')
        rest = _lines({**ok, "capture": "k1"})
    elif case == "refinished":  # the shard's last word wins
        first = _lines({**ok, "capture": "k1"})
        rest = _lines({**ok, "capture": "k1", "status": "failed", "error": "Late: rewritten"})
    elif case == "list-id":  # found by the fuzz test: an id of another type, in a started record left open
        first = _lines({**_BASE, "event": "started", "capture": [1]}, {**_BASE, "event": "started", "capture": "k1"})
        rest = _lines({**ok, "capture": "k1"})
    else:  # a started line naming two ids: the lean reader goes by the first, the record by the last
        two = b'{"capture":"a","event":"started","group":"g","capture":"b","v":1,"run":"odd","start_time":5.0}'
        finished = {key: value for key, value in ok.items() if key != "start_time"}
        first = _lines(two, {**finished, "capture": "b"})
        rest = _lines({**ok, "capture": "a"})
    folder = tmp_path / case
    (folder / MANIFEST_DIR).mkdir(parents=True)
    shard = folder / MANIFEST_DIR / "odd.rank0-of-1.h.7.jsonl"
    data = b"".join(first + rest)
    builder = _grow(shard, data, [len(b"".join(first))])
    listed = _ls(folder, capsys)  # the rest read as the shard's tail
    assert listed == _without_index(folder, capsys)
    builder.checkpoint()  # the rest in a second segment (when the first did not stop the index)
    assert _ls(folder, capsys) == listed
    index_path(shard).unlink(missing_ok=True)
    if write_index(shard):  # one segment over the whole shard
        assert _ls(folder, capsys) == listed
