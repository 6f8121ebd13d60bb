"""merge's fast path (batches read as heads, copied unparsed) writes what the full parse writes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from analysis.synth import Spec, write_run

from profctx.analysis import _tracedecode
from profctx.cli import main
from profctx.util import _codec


def _merged(save_path: Path, out: Path, *extra: str) -> dict[str, Any]:
    assert main(["merge", str(save_path), "-o", str(out), "--no-progress", *extra]) == 0
    data: dict[str, Any] = json.loads(gzip.decompress(out.read_bytes()))
    return data


def _hide_fast_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    for attr in ("_EVENTS", "_HEADS", "_RAWS"):
        monkeypatch.setattr(_tracedecode, attr, None)
    monkeypatch.setattr(_codec, "_isal", None)


@pytest.fixture
def flows_run(tmp_path: Path) -> Path:
    """A run whose traces span several read buffers, one of them with flow events all through it."""
    run = write_run(tmp_path / "run", Spec(ranks=2, steps=(1,), roles={"rollout": 0.2}, events=2500))
    path = sorted(run.rglob("rank0-*.pt.trace.json.gz"))[0]
    doc = json.loads(gzip.decompress(path.read_bytes()))
    events = doc["traceEvents"]
    pid = events[-2]["pid"]
    for i in range(len(events) - 2, 2, -97):
        ts = events[i].get("ts", 0)
        events.insert(i, {"ph": "s" if i % 2 else "f", "id": i, "pid": pid, "tid": pid, "ts": ts, "cat": "fwdbwd",
                          "name": "fwdbwd", "bp": "e"})
    path.write_bytes(gzip.compress(json.dumps(doc, indent=1).encode(), 1))
    return run


def test_fast_merge_writes_what_the_full_parse_writes(flows_run: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _merged(flows_run, tmp_path / "fast.trace.json.gz")
    flows = [e for e in fast["traceEvents"] if e.get("ph") in ("s", "f")]
    assert len(flows) > 40
    _hide_fast_paths(monkeypatch)
    plain = _merged(flows_run, tmp_path / "plain.trace.json.gz")
    assert fast == plain


def test_fast_merge_of_real_traces_writes_what_the_full_parse_writes(run_dir: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _merged(run_dir, tmp_path / "fast.trace.json.gz", "--run", "all")
    _hide_fast_paths(monkeypatch)
    assert _merged(run_dir, tmp_path / "plain.trace.json.gz", "--run", "all") == fast
