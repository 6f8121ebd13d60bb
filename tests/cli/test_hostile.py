"""A run folder is untrusted input: each way a hostile folder once got through, as a test.

The folder is a copy of a real two-rank run (``run_dir``) with records, files, links and FIFOs
added. Every command runs in-process through :func:`profctx.cli.main`, under a deadline so a
hang fails the test instead of blocking the suite. A canary trace outside the folder holds a
marker that must never reach an output.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import signal
import tracemalloc
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import profctx
from profctx import ConfigError
from profctx.cli import main
from profctx.interop.verl import convert, from_verl

CANARY = "CANARY_OUTSIDE_THE_RUN_FOLDER"
CONTROLS = ("\x1b", "\x07", "\x9b", "\u202e")


class Hang(BaseException):
    """A command still running at its deadline (not an ``OSError``: no reader may take it for a bad file)."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`Hang` when the block runs longer than ``seconds`` (a blocked ``open`` included)."""

    def fire(signum: int, frame: FrameType | None) -> None:
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def hostile_copy(run_dir: Path, tmp: Path) -> tuple[Path, Path]:
    """Return a copy of the run and, beside it, a folder holding the canary trace."""
    folder = tmp / "run"
    shutil.copytree(run_dir, folder)
    outside = tmp / "outside"
    outside.mkdir()
    event = {"ph": "X", "cat": "cpu_op", "name": CANARY, "ts": 1, "dur": 5, "pid": 1, "tid": 1}
    (outside / "canary.pt.trace.json").write_text(json.dumps({"traceEvents": [event]}))
    return folder, outside


def first_record(folder: Path) -> dict[str, Any]:
    shard = sorted((folder / ".profctx").glob("*.jsonl"))[0]
    record: dict[str, Any] = json.loads(shard.read_bytes().splitlines()[0])
    return record


def add_records(folder: Path, *records: dict[str, Any], shard: str | None = None) -> None:
    """Append finished records (of the run's first rank, unless a key says otherwise) to a shard."""
    base = first_record(folder)
    target = folder / ".profctx" / shard if shard else sorted((folder / ".profctx").glob("*.jsonl"))[0]
    start = base["start_time"]
    with open(target, "a", encoding="utf-8") as fh:
        for fields in records:
            record = {**base, "capture": uuid.uuid4().hex[:12], "event": "finished", "status": "ok",
                      "start_time": start, "end_time": start + 0.01, "duration_s": 0.01, "files": []}
            record.pop("thread", None)
            record.update(fields)
            fh.write(json.dumps(record) + "\n")


def run_all(folder: Path, out: Path, capsys: pytest.CaptureFixture[str],
            commands: tuple[str, ...] = ("ls", "ls-json", "summary", "summary-json", "report", "merge", "diff",
                                         "check")) -> dict[str, tuple[int, str]]:
    """Run each command on ``folder`` in-process; return its exit code and everything it printed and wrote."""
    out.mkdir(exist_ok=True)
    argvs = {
        "ls": ["ls", str(folder)], "ls-json": ["ls", str(folder), "--json"],
        "summary": ["summary", str(folder)], "summary-json": ["summary", str(folder), "--json"],
        "report": ["report", str(folder), "-o", str(out / "r.html")],
        "merge": ["merge", str(folder), "-o", str(out / "m.json")],
        "diff": ["diff", str(folder), str(folder)],
        "check": ["check", str(folder), "--baseline", str(folder)],
    }
    results = {}
    for name in commands:
        for written in out.iterdir():
            written.unlink()
        with deadline(20):
            code = main(argvs[name])
        printed = capsys.readouterr()
        files = "".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(out.iterdir()))
        results[name] = (code, printed.out + printed.err + files)
        assert code in (0, 1, 2), (name, code, printed)
    return results


def test_files_outside_the_folder_are_never_read(run_dir: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    folder, outside = hostile_copy(run_dir, tmp_path)
    canary = outside / "canary.pt.trace.json"
    (folder / "step000001" / "rollout" / "link.pt.trace.json").symlink_to(canary)  # a link to outside
    (folder / "step000007").symlink_to(outside, target_is_directory=True)  # a linked folder on the way
    (folder / "step000008").symlink_to(outside, target_is_directory=True)
    add_records(folder,
                {"files": [{"path": str(canary), "bytes": 10}]},  # absolute
                {"files": [{"path": "../outside/canary.pt.trace.json", "bytes": 10}]},  # climbing out
                {"files": [{"path": "step000001/rollout/link.pt.trace.json", "bytes": 10}]},
                {"files": [{"path": "step000007/canary.pt.trace.json", "bytes": 10}]},
                {"kind": "engine", "engine": "vllm", "replica": 0, "folder": str(outside)},  # an older engine record
                {"kind": "engine", "engine": "vllm", "replica": 1, "folder": "step000008"})
    results = run_all(folder, tmp_path / "out", capsys)
    for name, (_, text) in results.items():
        assert CANARY not in text, name
    assert "outside the run folder" in results["summary"][1]
    assert "outside the run folder" in results["merge"][1]
    assert results["merge"][0] == 1  # an input refused is a problem of the merge


def test_a_fifo_anywhere_blocks_no_command(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder, _ = hostile_copy(run_dir, tmp_path)
    os.mkfifo(folder / "step000001" / "rollout" / "fifo.pt.trace.json")
    add_records(folder, {"files": [{"path": "step000001/rollout/fifo.pt.trace.json", "bytes": 10}]})
    index = sorted((folder / ".profctx").glob("*.jsonl.index"))[0]
    index.unlink()
    os.mkfifo(index)  # the listing index, read by ls
    os.mkfifo(folder / ".profctx" / "clirun.rank5-of-6.vm.1.jsonl")  # a shard
    results = run_all(folder, tmp_path / "out", capsys)
    assert "FIFO" in results["summary"][1]
    assert "not read" in results["ls"][1]
    assert results["ls"][1].count("actor_update") >= 3  # the other captures still listed


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("fallback", [False, True], ids=["orjson", "stdlib-json"])
def test_deep_nesting_is_damage_not_a_recursion_error(run_dir: Path, tmp_path: Path, fallback: bool,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    if fallback:  # the parsers profctx falls back to without orjson
        from profctx import manifest
        from profctx.analysis import _tracejson
        monkeypatch.setattr(_tracejson, "_loads", json.loads)
        monkeypatch.setattr(_tracejson, "_ParseError", (ValueError, RecursionError))
        monkeypatch.setattr(manifest, "_parser", lambda: (json.loads, (ValueError, RecursionError)))
    folder, _ = hostile_copy(run_dir, tmp_path)
    rollout = folder / "step000001" / "rollout"
    (rollout / "deep.pt.trace.json").write_text('{"traceEvents": [' + _nested(100_000) + "]}")
    event = {"ph": "X", "cat": "cpu_op", "name": "op", "ts": 1, "dur": 1, "pid": 1, "tid": 1}
    middle = json.dumps({"traceEvents": [event]})[:-2] + ', {"ph": "X", "name": ' + _nested(1000) + "}]}"
    (rollout / "middle.pt.trace.json").write_text(middle)  # deeper than repr or orjson.dumps go
    add_records(folder, {"files": [{"path": "step000001/rollout/deep.pt.trace.json", "bytes": 1},
                                   {"path": "step000001/rollout/middle.pt.trace.json", "bytes": 1}]})
    shard = sorted((folder / ".profctx").glob("*.jsonl"))[0]
    with open(shard, "a", encoding="utf-8") as fh:
        fh.write('{"v": 1, "run": "clirun", "capture": "deep", "notes": ' + _nested(1000) + "}\n")
        fh.write('{"v": 1, "run": "clirun", "capture": "deeper", "notes": ' + _nested(100_000) + "}\n")
    results = run_all(folder, tmp_path / "out", capsys, ("ls", "ls-json", "summary", "report", "merge"))
    assert "nested deeper than 128 levels" in results["summary"][1]
    assert "nested deeper than 128 levels" in results["merge"][1]
    assert "unreadable manifest line" in results["ls-json"][1]


def test_a_gzip_bomb_is_cut_at_the_inflation_cap(run_dir: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from profctx.analysis._tracejson import MAX_RATIO, RATIO_FREE

    folder, _ = hostile_copy(run_dir, tmp_path)
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [squeeze.compress(b'{"traceEvents": [')]
    spaces = b" " * (1 << 20)
    parts += [squeeze.compress(spaces) for _ in range((RATIO_FREE >> 20) + 16)]  # over the cap
    parts.append(squeeze.compress(b"]}") + squeeze.flush())
    bomb = b"".join(parts)
    assert len(bomb) * MAX_RATIO < RATIO_FREE  # inflates far more than the cap allows
    (folder / "step000001" / "rollout" / "bomb.pt.trace.json.gz").write_bytes(bomb)
    add_records(folder, {"files": [{"path": "step000001/rollout/bomb.pt.trace.json.gz", "bytes": len(bomb)}]})
    tracemalloc.start()
    try:
        results = run_all(folder, tmp_path / "out", capsys, ("summary",))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"inflates over {MAX_RATIO} times its size" in results["summary"][1]
    assert peak < 48 << 20, peak  # a few read buffers, not the inflated stream
    assert gzip.decompress(bomb).startswith(b'{"traceEvents": [')  # a real gzip file


def test_control_characters_are_escaped_in_every_terminal_output(run_dir: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    folder, _ = hostile_copy(run_dir, tmp_path)
    title, clear, clipboard = "\x1b]0;owned\x07", "\x1b[2J\x1b[H", "\x1b]52;c;b3duZWQ=\x07"
    add_records(folder,
                {"role": f"rollout{title}", "host": clear, "status": "failed", "error": f"{clipboard}\x9b31m\u202e"},
                {"role": "actor_update", "group": f"g{title}", "status": "skipped", "reason": clear},
                {"files": [{"path": f"step000001/rollout/{title}.pt.trace.json", "bytes": 3}]})
    (folder / "step000001" / "rollout" / f"{title}.pt.trace.json").write_text('{"traceEvents": [{"ph": "X"')
    results = run_all(folder, tmp_path / "out", capsys)
    for name, (_, text) in results.items():
        if name in ("report", "merge"):
            continue  # files checked below: HTML and JSON escape on their own
        for control in CONTROLS:
            assert control not in text, (name, control)
    assert "\\u001b]0;owned\\u0007" in results["ls"][1]
    json.loads(results["ls-json"][1][:results["ls-json"][1].rindex("]") + 1])  # still valid JSON


def test_a_huge_manifest_line_is_skipped_without_being_held(run_dir: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from profctx.manifest import MAX_LINE

    folder, _ = hostile_copy(run_dir, tmp_path)
    shard = folder / ".profctx" / "clirun.rank7-of-8.vm.7.jsonl"
    with open(shard, "wb") as fh:
        fh.write(b'{"v": 1, "run": "clirun", "pad": "')
        block = b"x" * (1 << 20)
        for _ in range(8 * (MAX_LINE >> 20)):
            fh.write(block)
        fh.write(b'"}\n')
    add_records(folder, {"role": "after_the_long_line"}, shard=shard.name)
    tracemalloc.start()
    try:
        results = run_all(folder, tmp_path / "out", capsys, ("ls",))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"{shard.name}:1 (a line over {MAX_LINE >> 20} MB, not read)" in results["ls"][1]
    assert "after_the_long_line" in results["ls"][1]
    assert peak < 3 * MAX_LINE, peak  # the line is 8 times the bound


def test_a_manifest_folder_linked_out_is_no_run(run_dir: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    folder, outside = hostile_copy(run_dir, tmp_path)
    shutil.move(folder / ".profctx", outside / "manifest")
    (folder / ".profctx").symlink_to(outside / "manifest", target_is_directory=True)
    with deadline(60):
        assert main(["ls", str(folder)]) == 2
    assert "not a profctx folder" in capsys.readouterr().err


def test_a_yaml_alias_bomb_is_refused_by_every_reader(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("omegaconf")
    anchors = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    anchors += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(anchors) + "\n")
    assert len(bomb.read_bytes()) < 600
    with deadline(30):
        assert main(["verl-convert", str(bomb)]) == 2
        assert "alias bomb" in capsys.readouterr().err
        for load in (lambda: profctx.configure(bomb), lambda: profctx.configure(verl=bomb), lambda: convert(bomb)):
            with pytest.raises(ConfigError, match="alias bomb"):
                load()


def test_bad_bytes_in_config_sources_are_config_errors(tmp_path: Path) -> None:
    nul = tmp_path / "nul.yaml"
    nul.write_text('steps: "3:6"\x00\n')
    with pytest.raises(ConfigError) as info:
        profctx.configure(nul)
    assert info.value.field == "config"
    for load in (lambda: convert("verl\x00.yaml"), lambda: profctx.configure(verl="verl\x00.yaml"),
                 lambda: from_verl("verl\x00.yaml")):
        with pytest.raises(ConfigError) as info:
            load()
        assert info.value.field == "verl"


def test_a_listing_index_holding_what_no_writer_writes_is_not_used(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from profctx.records._listing import INDEX_VERSION, _line

    (tmp_path / ".profctx").mkdir()
    shard = tmp_path / ".profctx" / "run.rank0-of-1.host.1.jsonl"
    data = b'{"v": 1, "run": "run", "capture": "a", "event": "finished", "status": "ok", "role": "from_the_shard"}\n'
    shard.write_bytes(data)
    crc = zlib.crc32(data) & 0xFFFFFFFF  # a valid index of this shard, but for its rows
    for rows in ([["x"]], [[0.0, 0, "ok", 1, None, "run", 0, None, None, "1", ["role"], "r0", "-", "-", ""]]):
        segment = {"a": 0, "b": len(data), "lines": 1, "crc": crc, "ids": ["a"], "rows": rows, "loose": [],
                   "damaged": [], "open": [], "open_ids": []}
        (shard.parent / (shard.name + ".index")).write_bytes(
            _line({"index": INDEX_VERSION, "shard": shard.name}) + _line(segment))
        with deadline(20):
            assert main(["ls", str(tmp_path)]) == 0
        assert "from_the_shard" in capsys.readouterr().out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.sampled_from([0, 1, 5, 30, 63, 64, 65, 100, 200]), max_size=12),
       end=st.sampled_from([b"\n", b"\r\n"]), last=st.booleans(), piece=st.sampled_from([1, 7, 16, 64, 65, 200]))
def test_a_shard_read_in_pieces_reads_the_lines_a_whole_read_does(lengths: list[int], end: bytes, last: bool,
                                                                   piece: int, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from profctx import manifest

    monkeypatch.setattr(manifest, "MAX_LINE", 64)
    monkeypatch.setattr(manifest, "_PIECE", piece)
    data = end.join(b"x" * n for n in lengths) + (end if last else b"")
    shard = tmp_path / "piece.jsonl"
    shard.write_bytes(data)
    reader = manifest.ManifestReader(tmp_path)
    with open(shard, "rb") as fh:
        lines = reader._pieces(shard.name, fh)
    assert lines == [line if len(line) <= 64 else b"" for line in data.splitlines()]
    assert len(reader.damaged) == sum(1 for line in data.splitlines() if len(line) > 64)
