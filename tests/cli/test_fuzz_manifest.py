"""``ls``, ``report``, ``merge``, ``summary`` never print a traceback, whatever a manifest holds.

Shards are built from real records of a real run, then cut at any byte, filled with garbage
lines, and given values of the wrong type for any key; every command must end with exit code
0, 1 or 2 and say what it found, never raise.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profctx import manifest
from profctx.cli import main
from profctx.records._listing import IndexBuilder, fast_row, index_path, typed_row, write_index

_KEYS = ["capture", "run", "status", "kind", "steps", "step", "role", "rank", "world_size", "host", "pid", "group",
         "seq", "backend", "engine", "version", "replica", "folder", "start_time", "end_time", "duration_s",
         "blocked_s", "files", "bytes", "error", "reason", "notes", "v", "event"]
_ODD = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                 st.text(max_size=8), st.lists(st.one_of(st.integers(), st.text(max_size=3), st.none()), max_size=3),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                 st.just([{"path": 3}]), st.just([{"path": "../../etc/passwd", "bytes": "x"}]))
_GARBAGE = st.one_of(st.binary(max_size=40), st.just(b"[1,2]"), st.just(b'"str"'), st.just(b"null"),
                     st.just(b"\xff\xfe{"), st.just(b'{"v": 99, "capture": "future"}'))


@pytest.fixture(scope="module")
def lines(run_dir: Path) -> list[bytes]:
    out: list[bytes] = []
    for shard in sorted((run_dir / ".profctx").glob("*.jsonl")):
        out.extend(shard.read_bytes().splitlines())
    return out


def _commands(folder: Path, out: Path) -> list[list[str]]:
    return [["ls", str(folder)], ["ls", str(folder), "--json"], ["report", str(folder), "-o", str(out / "r.html")],
            ["merge", str(folder), "--run", "all", "-o", str(out / "m.json")],
            ["summary", str(folder), "--run", "all", "--json"]]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_manifest_content_makes_a_command_raise(data: st.DataObject, lines: list[bytes], run_dir: Path,
                                                    tmp_path_factory: pytest.TempPathFactory,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path_factory.mktemp("fuzz")
    for sub in run_dir.iterdir():
        if sub.is_dir() and sub.name != ".profctx":
            shutil.copytree(sub, folder / sub.name)
    chosen = data.draw(st.lists(st.sampled_from(lines), min_size=1, max_size=12))
    written: list[bytes] = []
    for line in chosen:
        try:
            record: Any = json.loads(line)
        except ValueError:
            record = None
        action = data.draw(st.sampled_from(["keep", "retype", "cut", "garbage"]))
        if action == "retype" and isinstance(record, dict):
            for key in data.draw(st.lists(st.sampled_from(_KEYS), min_size=1, max_size=4)):
                record[key] = data.draw(_ODD)
            written.append(json.dumps(record, default=str).encode())
        elif action == "cut":
            written.append(line[: data.draw(st.integers(0, max(len(line) - 1, 0)))])
        elif action == "garbage":
            written.append(data.draw(_GARBAGE))
        else:
            written.append(line)
    (folder / ".profctx").mkdir()
    shard = folder / ".profctx" / "fuzz.rank0-of-1.h.1.jsonl"
    shard.write_bytes(b"\n".join(written))
    for argv in _commands(folder, folder):
        code = main(argv)
        assert code in (0, 1, 2), argv
    capsys.readouterr()
    # ls reads plain records without a typed record each: the same rows; and the same listing from an index.
    for raw in manifest.ManifestReader(folder, lean=True).merged():
        assert fast_row(raw) == typed_row(manifest.CaptureRecord(raw))
    bare = main(["ls", str(folder)]), capsys.readouterr()
    if write_index(shard):
        assert (main(["ls", str(folder)]), capsys.readouterr()) == bare
        index_path(shard).unlink()
    # Nor from the segments a writer appends as the shard grows, at any points (then read with the tail after them).
    content = shard.read_bytes()
    shard.write_bytes(b"")
    builder = IndexBuilder(shard)
    done = 0
    for cut in sorted(data.draw(st.lists(st.integers(0, len(content)), max_size=6))):
        with open(shard, "ab") as fh:
            fh.write(content[done:cut])
        done = max(done, cut)
        builder.checkpoint()
    with open(shard, "ab") as fh:
        fh.write(content[done:])
    assert shard.read_bytes() == content
    assert (main(["ls", str(folder)]), capsys.readouterr()) == bare
    index_path(shard).unlink(missing_ok=True)
    # ls reads lean (started records that a finished one covers are not parsed): same typed fields.
    full = {r.capture: _typed(r) for r in manifest.ManifestReader(folder)}
    lean = {r.capture: _typed(r) for r in manifest.ManifestReader(folder, lean=True)}
    assert lean == full
    # The typed reader never lets a wrong type through.
    for record in manifest.read(folder):
        assert isinstance(record.capture, str) and isinstance(record.status, str)
        assert all(isinstance(s, int) for s in record.steps)
        assert record.rank is None or isinstance(record.rank, int)
        assert record.start_time is None or isinstance(record.start_time, float)
        assert all(isinstance(f.path, str) for f in record.files)


def _typed(record: manifest.CaptureRecord) -> tuple[Any, ...]:
    return (record.status, record.run, record.kind, record.steps, record.role, record.rank, record.group,
            record.host, record.pid, record.backend, record.engine, record.replica, record.begin, record.files,
            record.bytes, record.duration_s, record.error, record.reason, record.notes)


def test_a_started_record_between_two_finishing_ones_is_read_by_the_lean_reader(tmp_path: Path) -> None:
    # Found by the fuzz test above: a finished record, the capture started again, then a record
    # of no event (which finishes it too). Only a finished record may stand for the started one.
    base = {"v": 1, "run": "r", "capture": "c1", "kind": "role", "steps": [1], "role": "a", "start_time": 1.0}
    records = [{**base, "event": "finished", "status": "ok", "end_time": 2.0},
               {**base, "event": "started", "start_time": 3.0},
               {**base, "event": None, "start_time": 3.0}]
    (tmp_path / ".profctx").mkdir()
    (tmp_path / ".profctx" / "r.rank0-of-1.h.1.jsonl").write_bytes(
        b"\n".join(json.dumps(r, separators=(",", ":")).encode() for r in records))
    full = [_typed(r) for r in manifest.ManifestReader(tmp_path)]
    lean = [_typed(r) for r in manifest.ManifestReader(tmp_path, lean=True)]
    assert lean == full and full[0][0] == "open"


def test_a_capture_started_again_after_a_record_of_it_is_read_by_the_lean_reader(tmp_path: Path) -> None:
    # Found by the fuzz test above: a finished record (with a key the writer's records lack), then
    # the capture started and finished again. A whole read starts afresh at the started record;
    # the lean reader must read it too, not merge the last record into the first.
    base = {"v": 1, "run": "r", "capture": "c1", "kind": "role", "steps": [1], "role": "a", "start_time": 1.0}
    records = [{**base, "event": "finished", "status": "ok", "end_time": 2.0, "engine": "odd"},
               {**base, "event": "started", "start_time": 3.0},
               {**base, "event": "finished", "status": "ok", "start_time": 3.0, "end_time": 4.0}]
    (tmp_path / ".profctx").mkdir()
    (tmp_path / ".profctx" / "r.rank0-of-1.h.1.jsonl").write_bytes(
        b"\n".join(json.dumps(r, separators=(",", ":")).encode() for r in records))
    full = [_typed(r) for r in manifest.ManifestReader(tmp_path)]
    lean = [_typed(r) for r in manifest.ManifestReader(tmp_path, lean=True)]
    assert lean == full and full[0][10] is None


def test_a_duration_too_large_for_milliseconds_is_listed(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # Found by the fuzz test above: a duration of -1.8e305 s overflowed to -inf in milliseconds.
    record = {"v": 1, "run": "r", "capture": "c1", "kind": "role", "steps": [1], "role": "a", "event": "finished",
              "status": "ok", "start_time": 1.0, "end_time": 2.0, "duration_s": -1.797693134862316e305}
    (tmp_path / ".profctx").mkdir()
    (tmp_path / ".profctx" / "r.rank0-of-1.h.1.jsonl").write_text(json.dumps(record) + "\n")
    assert main(["ls", str(tmp_path)]) == 0
    assert "1 captures" in capsys.readouterr().out
