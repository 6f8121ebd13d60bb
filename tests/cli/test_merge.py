"""``profctx merge``: one valid, clock-aligned trace of every rank and role of a step."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from profctx.analysis import _tracejson
from profctx.analysis._tracejson import TraceFormatError, TraceStream
from profctx.cli import main
from profctx.records._manifest import read

from .tef import problems


def _load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def test_merge_writes_a_valid_trace_of_every_rank_and_role(run_dir: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "step1.json.gz"
    assert main(["merge", str(run_dir), "--step", "1", "-o", str(out)]) == 0
    assert "4 traces" in capsys.readouterr().out
    trace = _load(out)
    assert problems(trace) == []
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    # One process per worker process (never one per capture), after the steps process.
    order = {e["pid"]: e["args"]["sort_index"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_sort_index"}
    assert [names[p] for p in sorted(order, key=order.get)] == ["steps", "rank 0", "rank 1"]
    # Each capture is a span on the process's "profctx captures" thread.
    spans = sorted((names[e["pid"]], e["name"]) for e in trace["traceEvents"] if e.get("cat") == "profctx"
                   and e["pid"] != 1)
    assert spans == [("rank 0", "step 1 · actor_update"), ("rank 0", "step 1 · rollout"),
                     ("rank 1", "step 1 · actor_update"), ("rank 1", "step 1 · rollout")]
    steps = [e for e in trace["traceEvents"] if e["pid"] == 1 and e["ph"] == "X"]
    assert [e["name"] for e in steps] == ["step 1"]
    assert trace["profctx"]["steps"] == [1] and trace["profctx"]["runs"] == ["clirun"]
    labels = [e["args"]["labels"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_labels"]
    assert all("run clirun" in label and "of 2" in label for label in labels)
    captures = trace["profctx"]["captures"]
    assert {(c["rank"], c["role"]) for c in captures} == {(0, "rollout"), (0, "actor_update"), (1, "rollout"),
                                                         (1, "actor_update")}
    assert all(c["trace_distributedInfo"]["rank"] == c["rank"] and c["trace_profctx"]["capture"] == c["capture"]
               for c in captures)
    ops = {e["name"] for e in trace["traceEvents"] if e.get("cat") == "cpu_op"}
    assert {"aten::mm", "aten::relu"} <= ops


def test_merge_aligns_every_capture_to_wall_clock(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "step2.json"
    assert main(["merge", str(run_dir), "--step", "2", "-o", str(out)]) == 0
    trace = json.loads(out.read_text())
    base_us = trace["baseTimeNanoseconds"] / 1000
    captures = [r for r in read(run_dir) if 2 in r["steps"] and r.get("files")]
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    checked = 0
    first: dict[int, float] = {}
    for event in trace["traceEvents"]:
        if event.get("cat") != "cpu_op":
            continue
        rank = int(names[event["pid"]].split()[1])
        wall = (base_us + event["ts"]) / 1e6
        # Every operation lies inside a capture of its rank's manifest interval (50 ms slack for clock reads).
        assert any(r["start_time"] - 0.05 <= wall <= r["end_time"] + 0.05 for r in captures if r["rank"] == rank)
        first[rank] = min(first.get(rank, event["ts"]), event["ts"])
        checked += 1
    assert checked > 5
    # Captures were made one rank after the other: rank 0's first op precedes rank 1's in the merged clock.
    assert first[0] < first[1]


def _trace_file(path: Path, events: list[dict[str, Any]], *, head: dict[str, Any] | None = None,
                tail: dict[str, Any] | None = None, bare: bool = False) -> None:
    whole: Any = events if bare else {**(head or {}), "traceEvents": events, **(tail or {})}
    path.write_text(json.dumps(whole, indent=2))


def _fake_run(tmp_path: Path, traces: dict[str, tuple[dict[str, Any], float]]) -> Path:
    """Write a manifest for hand-made trace files: name -> (writer kwargs, start_time)."""
    run = tmp_path / "run"
    (run / ".profctx").mkdir(parents=True)
    lines = []
    for rank, (name, (kwargs, start)) in enumerate(traces.items()):
        folder = run / "step000004" / "rollout"
        folder.mkdir(parents=True, exist_ok=True)
        _trace_file(folder / name, **kwargs)
        lines.append({"v": 1, "run": "r", "rank": rank, "world_size": 2, "host": "h", "pid": 10 + rank,
                      "capture": f"c{rank}", "kind": "role", "steps": [4], "step": 4, "role": "rollout",
                      "event": "finished", "status": "ok", "start_time": start, "end_time": start + 1,
                      "files": [{"path": f"step000004/rollout/{name}", "bytes": 1}]})
    (run / ".profctx" / "r.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def test_merge_clock_conventions_and_unique_flow_ids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flow = [{"ph": "s", "id": 7, "pid": 5, "tid": 1, "ts": 10, "name": "f", "cat": "ac2g"},
            {"ph": "f", "id": 7, "pid": 5, "tid": 2, "ts": 20, "name": "f", "cat": "ac2g", "bp": "e"}]
    x = {"ph": "X", "name": "op", "pid": 5, "tid": "stream 7", "ts": 100.0, "dur": 5.0}
    run = _fake_run(tmp_path, {
        # torch convention: ts relative to baseTimeNanoseconds, which comes after the events here.
        "a.json": ({"events": [x, *flow], "tail": {"baseTimeNanoseconds": 1_000_000_000_000_000_000}}, 1e9),
        # already Unix microseconds, no base.
        "b.json": ({"events": [{**x, "ts": 1_000_000_000_000_200.0},
                               *({**f, "ts": f["ts"] + 1e15} for f in flow)], "bare": True}, 1e9),
        # neither: placed at the capture's start time.
        "c.json": ({"events": [{**x, "ts": 3.0}]}, 1e9 + 0.5),
    })
    out = tmp_path / "m.json.gz"
    assert main(["merge", str(run), "--step", "4", "-o", str(out)]) == 0
    assert "c.json has no clock base" in capsys.readouterr().out
    trace = _load(out)
    assert problems(trace) == []
    assert trace["baseTimeNanoseconds"] == 1_000_000_000_000_000_000
    ops = sorted(e["ts"] for e in trace["traceEvents"] if e["name"] == "op")
    assert ops == [100.0, 200.0, 500_000.0]
    ids = [e["id"] for e in trace["traceEvents"] if e["ph"] in "sf"]
    assert len(ids) == 4 and len(set(ids)) == 2  # pairs kept together, captures kept apart
    threads = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "stream 7" in threads


def test_merge_of_plain_batches_keeps_flows_apart_and_every_thread(tmp_path: Path) -> None:
    # Torch-like: metadata first, then many events of one pid with flows between threads, in two
    # captures that reuse the same flow ids; the reader cuts the array into several batches.
    def events(pid: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"ph": "M", "name": "thread_name", "pid": pid, "tid": 1, "args": {"name": "main"}}]
        for i in range(12000):
            out.append({"ph": "X", "name": "op", "pid": pid, "tid": 1 + i % 3, "ts": 10.0 + i, "dur": 0.5})
            if i % 400 == 0:
                out += [{"ph": "s", "id": i, "pid": pid, "tid": 1, "ts": 10.0 + i, "name": "f", "cat": "ac2g"},
                        {"ph": "f", "id": i, "pid": pid, "tid": 3, "ts": 11.0 + i, "name": "f", "cat": "ac2g",
                         "bp": "e"}]
        return out

    head = {"baseTimeNanoseconds": 10**18}
    run = _fake_run(tmp_path, {"a.json": ({"events": events(5), "head": head}, 1e9),
                               "b.json": ({"events": events(6), "head": head}, 1e9)})
    out = tmp_path / "m.json"
    assert main(["merge", str(run), "--step", "4", "-o", str(out)]) == 0
    trace = json.loads(out.read_text())
    assert problems(trace) == []
    assert sum(1 for e in trace["traceEvents"] if e["name"] == "op") == 24000
    flows: dict[Any, list[str]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] in "sf":
            flows.setdefault(e["id"], []).append(e["ph"])
    assert len(flows) == 60 and all(sorted(v) == ["f", "s"] for v in flows.values())
    threads = {(e["pid"], e["tid"]) for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(pid, tid) for pid in (5, 6) for tid in (1, 2, 3)} <= threads


def test_merge_reports_a_damaged_input_and_keeps_the_rest(run_dir: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    victim = next((copy / "step000001" / "rollout").glob("rank1-*.gz"))
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    missing = next((copy / "step000001" / "actor_update").glob("rank1-*.gz"))
    missing.unlink()
    out = tmp_path / "m.json.gz"
    assert main(["merge", str(copy), "--step", "1", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert victim.name in err and f"{missing}: missing" in err
    trace = _load(out)
    assert problems(trace) == []
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"rank 0", "rank 1"} <= names


def test_merge_usage_errors(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["merge", str(run_dir), "--step", "9"]) == 2
    err = capsys.readouterr().err
    assert "no trace files for step 9" in err and "steps with captures: 1, 2)" in err
    assert main(["merge", str(run_dir), "--step", "1", "-o", str(tmp_path / "x.txt")]) == 2
    assert "must end in .json.gz or .json" in capsys.readouterr().err


def test_merge_progress_bar_is_drawn_when_asked(run_dir: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["merge", str(run_dir), "--step", "1", "-o", str(tmp_path / "m.json"), "--progress"]) == 0
    err = capsys.readouterr().err
    assert "merging" in err and "100%" in err


@pytest.mark.parametrize("window", [1, 1 << 14])
@pytest.mark.parametrize("parser", ["orjson", "stdlib"])
@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_stream_reader_survives_any_chunk_boundary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   chunk: int, parser: str, window: int) -> None:
    monkeypatch.setattr(_tracejson, "_WINDOW", window)
    if parser == "stdlib":  # what a core-only install (no 'cli' extra) runs
        monkeypatch.setattr(_tracejson, "_loads", json.loads)
        monkeypatch.setattr(_tracejson, "_ParseError", (ValueError,))
    # Names holding "}, {" and nested lists of objects put false element boundaries in the text.
    events = [{"ph": "X", "name": f"op{i} \u00e9\\\" }}, {{", "pid": 1, "tid": 2, "ts": 12345.678 + i,
               "dur": 1e-3 * i, "args": {"nested": [1, {"a": None}, {"b": "}, {"}]}} for i in range(20)]
    head = {"schemaVersion": 1, "baseTimeNanoseconds": 1234567890123456789,
            "deviceProperties": [{"name": f"gpu \u00e9 {i}", "memory": 8 * 10**9 + i} for i in range(300)]}
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump({**head, "traceEvents": events, "traceName": "x"}, fh, indent=1)
    monkeypatch.setattr(_tracejson, "CHUNK", chunk)
    with TraceStream(path) as stream:
        items = list(stream.items())
    assert [v for k, v in items if k == "traceEvents"] == events
    assert {k: v for k, v in items if k != "traceEvents"} == {**head, "traceName": "x"}


def test_stream_reader_refuses_what_is_not_a_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text('"just a string"')
    with pytest.raises(TraceFormatError, match="not a Chrome trace"), TraceStream(path) as stream:
        list(stream.items())
    path.write_text('{"traceEvents": [{"ph": "X"}, {"ph"')
    with pytest.raises(TraceFormatError), TraceStream(path) as stream:
        list(stream.items())


def test_merge_finds_engine_traces_in_their_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = {"ph": "X", "name": "op", "pid": 5, "tid": 1, "ts": 100.0, "dur": 5.0}
    run = _fake_run(tmp_path, {"rank.json": ({"events": [x], "head": {"baseTimeNanoseconds": 10**18}}, 1e9)})
    # An engine adapter records no files: the engine writes them itself into the capture's folder.
    engine_trace = run / "step000004" / "rollout" / "vllm" / "engine.pt.trace.json"
    engine_trace.parent.mkdir()
    _trace_file(engine_trace, [{**x, "name": "engine_op", "pid": 77}], head={"baseTimeNanoseconds": 10**18})
    record = {"v": 1, "run": "r", "rank": 0, "world_size": 2, "host": "h", "pid": 10, "capture": "e1",
              "kind": "engine", "engine": "vllm", "version": "0.17.1", "replica": 1, "steps": [4], "step": 4,
              "role": "rollout", "folder": "step000004/rollout", "event": "finished", "status": "ok",
              "start_time": 1e9, "end_time": 1e9 + 1}
    with open(run / ".profctx" / "r.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
    out = tmp_path / "m.json"
    assert main(["merge", str(run), "--step", "4", "-o", str(out)]) == 0
    trace = json.loads(out.read_text())
    assert problems(trace) == []
    names = [e["args"]["name"] for e in sorted(trace["traceEvents"], key=lambda e: e["pid"])
             if e["ph"] == "M" and e["name"] == "process_name"]
    assert names == ["steps", "rank 0", "vllm replica 1"]  # the rank's own file is not taken twice
    assert sum(e["name"] == "op" for e in trace["traceEvents"]) == 1
    assert main(["ls", str(run)]) == 0
    engine_line = next(line for line in capsys.readouterr().out.splitlines() if "vllm" in line)
    assert "vllm 0.17.1" in engine_line and " r1 " in engine_line


def test_merge_takes_exactly_the_files_an_engine_record_lists(tmp_path: Path) -> None:
    x = {"ph": "X", "name": "op", "pid": 5, "tid": 1, "ts": 100.0, "dur": 5.0}
    run = _fake_run(tmp_path, {"rank.json": ({"events": [x], "head": {"baseTimeNanoseconds": 10**18}}, 1e9)})
    launch = run / "vllm-launch"  # the engine's own folder holds traces of other steps and sessions too
    launch.mkdir()
    for name in ("mine", "other_step", "foreign"):
        _trace_file(launch / f"{name}.pt.trace.json", [{**x, "name": f"{name}_op", "pid": 77}],
                    head={"baseTimeNanoseconds": 10**18})
    base = {"v": 1, "run": "r", "rank": 0, "world_size": 2, "host": "h", "pid": 10, "kind": "engine",
            "engine": "vllm", "version": "0.32.0", "steps": [4], "step": 4, "role": "rollout",
            "folder": "vllm-launch", "event": "finished", "status": "ok", "start_time": 1e9, "end_time": 1e9 + 1}
    with open(run / ".profctx" / "r.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps({**base, "capture": "e1", "replica": 0,
                             "files": [{"path": "vllm-launch/mine.pt.trace.json", "bytes": 1}]}) + "\n")
        fh.write(json.dumps({**base, "capture": "e2", "replica": 1, "files": []}) + "\n")  # wrote nothing
    out = tmp_path / "m.json"
    assert main(["merge", str(run), "--step", "4", "-o", str(out)]) == 0
    names = {e["name"] for e in json.loads(out.read_text())["traceEvents"] if e.get("ph") == "X"}
    assert "mine_op" in names
    assert not {"other_step_op", "foreign_op"} & names


def test_a_cut_gzip_trace_yields_every_event_before_the_cut(tmp_path: Path) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 5, "tid": 1, "ts": float(i), "dur": 0.5,
               "args": {"shape": [[i, 2]], "nested": {"k": "},{"}}} for i in range(30_000)]
    data = gzip.compress(json.dumps({"baseTimeNanoseconds": 10**18, "traceEvents": events}, indent=1).encode())
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) // 2])
    seen: list[dict[str, Any]] = []
    with pytest.raises(TraceFormatError, match="ends early"), TraceStream(path) as stream:
        for key, value in stream.batches():
            if key == "traceEvents":
                seen.extend(value)
    assert 5_000 < len(seen) < 30_000
    assert seen == events[: len(seen)]  # a clean prefix: nothing dropped, nothing invented


def test_merge_keeps_the_events_of_a_cut_gzip_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 5, "tid": 1, "ts": float(i), "dur": 0.5}
              for i in range(30_000)]
    run = _fake_run(tmp_path, {"a.json": ({"events": events[:10], "head": {"baseTimeNanoseconds": 10**18}}, 1e9)})
    whole = json.dumps({"baseTimeNanoseconds": 10**18, "traceEvents": events}).encode()
    cut = gzip.compress(whole)
    (run / "step000004" / "rollout" / "a.json").unlink()
    gz = run / "step000004" / "rollout" / "a.json.gz"
    gz.write_bytes(cut[: len(cut) * 2 // 3])
    manifest = run / ".profctx" / "r.jsonl"
    manifest.write_text(manifest.read_text().replace("rollout/a.json", "rollout/a.json.gz"))
    out = tmp_path / "m.json"
    assert main(["merge", str(run), "-o", str(out)]) == 1
    assert "ends early" in capsys.readouterr().err
    trace = json.loads(out.read_text())
    assert problems(trace) == []
    kept = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "cpu_op"]
    assert len(kept) > 10_000 and kept == [f"op{i}" for i in range(len(kept))]


def _run_with_two_runs(tmp_path: Path) -> Path:
    run = tmp_path / "two"
    (run / ".profctx").mkdir(parents=True)
    for index, run_id in enumerate(("old", "new")):
        lines = []
        for step in (1, 2):
            for rank in (0, 1):
                rel = f"step{step:06d}/rollout/{run_id}-{rank}.json"
                event = {"ph": "X", "name": f"{run_id}-op", "cat": "cpu_op", "pid": 7, "tid": 1, "ts": 10.0,
                         "dur": 5.0}
                (run / rel).parent.mkdir(parents=True, exist_ok=True)
                _trace_file(run / rel, [event], head={"baseTimeNanoseconds": 10**18})
                start = 1e9 + index * 100 + step * 10 + rank
                lines.append({"v": 1, "run": run_id, "rank": rank, "world_size": 2, "host": "h", "pid": 7,
                              "group": "actor", "capture": f"{run_id}{step}{rank}", "kind": "role", "steps": [step],
                              "role": "rollout", "event": "finished", "status": "ok", "start_time": start,
                              "end_time": start + 1, "files": [{"path": rel, "bytes": 1}]})
        (run / ".profctx" / f"{run_id}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def test_merge_a_whole_run_latest_by_default_and_two_runs_stay_apart(tmp_path: Path) -> None:
    run = _run_with_two_runs(tmp_path)
    assert main(["merge", str(run)]) == 0
    out = run / "merged" / "new-all.trace.json.gz"
    trace = _load(out)
    assert problems(trace) == []
    assert {e["name"] for e in trace["traceEvents"] if e.get("cat") == "cpu_op"} == {"new-op"}
    assert [e["name"] for e in trace["traceEvents"] if e["pid"] == 1 and e["ph"] == "X"] == ["step 1", "step 2"]
    names = sorted(e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name")
    # Both ranks ran in one OS process here (same host and pid): the rank and group keep them apart.
    assert names == ["actor rank 0", "actor rank 1", "steps"]

    both = tmp_path / "both.json"
    assert main(["merge", str(run), "--run", "all", "--step", "2", "-o", str(both)]) == 0
    trace = json.loads(both.read_text())
    assert problems(trace) == []
    names = sorted(e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name")
    assert names == ["actor rank 0 · run new", "actor rank 0 · run old", "actor rank 1 · run new",
                     "actor rank 1 · run old", "steps"]
    assert sorted(e["name"] for e in trace["traceEvents"] if e["pid"] == 1 and e["ph"] == "X") == [
        "step 2 · run new", "step 2 · run old"]
    assert main(["merge", str(run), "--run", "nope"]) == 2


def test_a_damaged_gzip_trace_reads_in_batches_up_to_the_damage(tmp_path: Path) -> None:
    # Zeroed bytes in the middle of the gzip data decode to garbage before zlib's final check
    # fails. The reader used to fall back to one event at a time before the damage, parsing
    # its whole buffer again for each (50 s for 200,000 events): now it stops at the damage.
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 5, "tid": 1, "ts": float(i), "dur": 0.5,
               "args": {"nested": {"k": "},{"}}} for i in range(60_000)]
    data = bytearray(gzip.compress(json.dumps({"traceEvents": events}).encode(), 3))
    data[len(data) // 2: len(data) // 2 + 64] = bytes(64)
    path = tmp_path / "damaged.json.gz"
    path.write_bytes(bytes(data))
    seen: list[dict[str, Any]] = []
    batches = 0
    with pytest.raises(TraceFormatError, match="damaged"), TraceStream(path) as stream:
        for key, value in stream.batches():
            if key == "traceEvents":
                seen.extend(value)
                batches += 1
    assert 10_000 < len(seen) < 60_000
    assert seen == events[: len(seen)]  # a clean prefix
    assert batches < 100  # read in bulk up to the damage, not one event per batch


def test_merge_keeps_every_event_it_need_not_rewrite_exactly_as_written(tmp_path: Path) -> None:
    """Events that need no change (kept pid, int tids, no clock shift, no flow) reach the merged
    trace as they were, whatever their strings, numbers and nested args hold."""
    odd = ["ü ß 漢字", "quote \" and backslash \\\\", "line\u2028sep", "tab\tnew\nline", "\x00 nul", "emoji 🎉"]
    events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": 5, "tid": 0, "args": {"name": "w"}}]
    for i in range(6000):
        events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7} {odd[i % len(odd)]}", "pid": 5,
                       "tid": 1 + i % 2, "ts": 10.0 + i, "dur": 0.25,
                       "args": {"Input Dims": [[i, 2], [], [[1]]], "big": 2**62 + i, "neg": -1.5e-7, "none": None,
                                "flag": i % 2 == 0, odd[i % len(odd)]: {"nested": [odd[(i + 1) % len(odd)]]}}})
    run = _fake_run(tmp_path, {"a.json": ({"events": events, "head": {"baseTimeNanoseconds": 10**18}}, 1e9)})
    out = tmp_path / "m.json"
    assert main(["merge", str(run), "--step", "4", "-o", str(out)]) == 0
    trace = json.loads(out.read_text(encoding="utf-8"))
    assert problems(trace) == []
    assert [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"] == events[1:]
