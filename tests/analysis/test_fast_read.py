"""The analysis's trace reading through the typed decoder and the isal codec: the same figures as the plain parser."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from profctx.analysis import _trace, _tracedecode, read_figures, summarize
from profctx.util import _codec

from .synth import Spec, trace, write_run


def _doc(events: int = 3000) -> dict[str, Any]:
    doc = trace(pid=7, start_us=1000.0, seconds=0.5, outer="aten::linear", leaf="aten::mm", events=events,
                kernels=True, role_range="rollout")
    odd = [
        {"ph": "X", "cat": "cpu_op", "name": 12, "pid": 7, "tid": 7, "ts": 1100.0, "dur": 1.0},  # name a number
        {"ph": "X", "cat": "cpu_op", "name": "aten::odd", "pid": 7, "tid": 7, "ts": "1200", "dur": 1.0},  # ts text
        {"ph": "X", "cat": "cpu_op", "name": "aten::bool", "pid": 7, "tid": 7, "ts": 1300.0, "dur": True},
        17, "not an event", [1, 2],
    ]
    # Spread through the array: batches of the trace hold odd events among plain ones.
    every = len(doc["traceEvents"]) // (len(odd) + 1)
    for i, value in enumerate(odd, start=1):
        doc["traceEvents"].insert(i * every, value)
    return doc


def _figures(path: Path) -> Any:
    got = read_figures(path)
    return (got.span_us, got.events, got.ops, got.roles, got.steps, got.device, got.device_us, got.problem)


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_typed_decoder_and_codec_read_what_the_plain_parser_reads(tmp_path: Path, suffix: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    text = json.dumps(_doc(), indent=1).encode()
    path = tmp_path / f"t.pt.trace{suffix}"
    path.write_bytes(gzip.compress(text, 1) if suffix.endswith(".gz") else text)
    fast = _figures(path)
    assert fast[-1] is None and fast[1] > 6000
    assert any(name == "12" for (_, _, name) in fast[2])  # a name that is a number is read as its text
    assert not any(name in ("aten::odd", "aten::bool") for (_, _, name) in fast[2])  # a time that is no number
    # Without msgspec and isal: the fallback parser's unchecked batches, checked in C or event by event.
    with monkeypatch.context() as patched:
        for attr in ("_EVENTS", "_HEADS", "_RAWS"):
            patched.setattr(_tracedecode, attr, None)
        patched.setattr(_codec, "_isal", None)
        assert _figures(path) == fast
        patched.setattr(_trace, "_batch", lambda *args: None)
        assert _figures(path) == fast
    # Batches of one thread's operators are taken in C; the loop over each event must agree.
    monkeypatch.setattr(_trace, "_batch", lambda *args: None)
    assert _figures(path) == fast


def test_a_damaged_gzip_trace_reads_up_to_the_damage(tmp_path: Path) -> None:
    packed = bytearray(gzip.compress(json.dumps(_doc(8000)).encode(), 1))
    packed[len(packed) // 2:len(packed) // 2 + 64] = b"\x00" * 64
    path = tmp_path / "t.pt.trace.json.gz"
    path.write_bytes(bytes(packed))
    got = read_figures(path)
    assert got.problem and "gzip" in got.problem
    assert got.events > 500  # what came before the damage


def test_without_msgspec_and_isal_installed_the_summary_is_the_same(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", Spec(ranks=2, steps=(1,), events=200))
    code = ("import sys; sys.modules['isal'] = None; sys.modules['msgspec'] = None\n"
            "from profctx.util import _codec\n"
            "from profctx.analysis import _tracedecode\n"
            "assert _codec.name() == 'zlib' and not _tracedecode.typed()\n"
            "from profctx.cli import main\n"
            f"sys.exit(main(['summary', {str(run)!r}, '--json', '--no-progress']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    bare = json.loads(done.stdout)
    assert bare["phases"] and bare == summarize(run).to_json()


def test_events_out_of_time_order_read_as_in_order(tmp_path: Path) -> None:
    doc = _doc(1000)
    last = doc["traceEvents"][-2]  # an operator; a parent and its child starting with it follow
    start = last["ts"] + last["dur"] + 10
    doc["traceEvents"][-1:-1] = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::parent", "pid": 7, "tid": 7, "ts": start, "dur": 10.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::child", "pid": 7, "tid": 7, "ts": start, "dur": 4.0},
    ]
    ordered = tmp_path / "ordered.pt.trace.json"
    ordered.write_text(json.dumps(doc))
    # Reversed: parents (longer) and children (shorter) at one start must still nest the same way.
    doc["traceEvents"].reverse()
    shuffled = tmp_path / "shuffled.pt.trace.json"
    shuffled.write_text(json.dumps(doc))
    got = _figures(ordered)
    assert _figures(shuffled) == got
    parent = next(v for (_, _, name), v in got[2].items() if name == "aten::parent")
    assert parent[0] == 6.0  # its self time: the child at the same start nests in it


def test_a_deep_value_the_typed_decoder_skips_is_read_past_and_built_values_are_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not _tracedecode.typed():
        pytest.skip("msgspec is not installed")
    event = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0}
    deep = dict(event, ts=5.0, args="@")
    text = json.dumps({"traceEvents": [event, deep, dict(event, ts=9.0)]}).replace('"@"', "[" * 300 + "]" * 300)
    path = tmp_path / "t.pt.trace.json"
    path.write_text(text)
    # Typed: the 300-deep args are skipped, never built: every event is read.
    got = read_figures(path)
    assert got.problem is None and got.events == 3
    # Without msgspec the parser builds the args: past the reader's depth bound, that is damage.
    monkeypatch.setattr(_tracedecode, "_EVENTS", None)
    got = read_figures(path)
    assert got.problem is not None and "nested deeper than 128 levels" in got.problem
