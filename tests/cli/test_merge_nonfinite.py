"""``profctx merge`` keeps every valid timestamp of a trace in which one event's time is damaged."""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from profctx.analysis import _merge, _tracejson
from profctx.cli import main

from .tef import problems


def _strict(text: str) -> Any:
    """Parse JSON as Perfetto and orjson do: ``NaN`` and ``Infinity`` are errors."""

    def refuse(token: str) -> Any:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def _rewrite(path: Path, clock: str, damage: str | None) -> None:
    """Rewrite a real torch trace: with its clock as another tool writes it, and one event damaged."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        trace = json.load(fh)
    base_us = trace.pop("baseTimeNanoseconds") / 1000
    events = trace["traceEvents"]
    if clock == "unix-us":  # absolute microseconds, as tools that write no clock base do
        for event in events:
            if event.get("ph") != "M" and isinstance(event.get("ts"), (int, float)):
                event["ts"] = event["ts"] + base_us
    if damage is not None:
        # The first operator in time: the one every other event used to be placed after.
        first = min((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
        first["ts" if damage != "dur" else "dur"] = math.inf if damage == "dur" else math.nan
    path.write_text(json.dumps(trace), encoding="utf-8")  # json writes NaN and Infinity as bare words


def _ops(run: Path, tmp: Path, capsys: pytest.CaptureFixture[str]) -> tuple[list[tuple[str, float]], str]:
    out = tmp / f"{run.name}.json"
    assert main(["merge", str(run), "--step", "1", "-o", str(out)]) == 0
    said = capsys.readouterr().out
    trace = _strict(out.read_text(encoding="utf-8"))
    assert problems(trace) == []
    rollout = {e["pid"] for e in trace["traceEvents"] if e.get("cat") == "profctx" and "rollout" in e["name"]
               and e["args"]["file"].startswith("rank0-")}
    ops = sorted((e["name"], e["ts"]) for e in trace["traceEvents"]
                 if e.get("cat") == "cpu_op" and e["pid"] in rollout)
    return ops, said


@pytest.mark.parametrize("parser", ["orjson", "stdlib"])
@pytest.mark.parametrize("clock", ["relative", "unix-us"])
@pytest.mark.parametrize("damage", ["ts", "dur"])
def test_one_non_finite_time_drops_that_event_only(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch, parser: str, clock: str,
                                                   damage: str) -> None:
    if parser == "stdlib":  # what a core-only install (no 'cli' extra) runs
        monkeypatch.setattr(_tracejson, "_loads", json.loads)
        monkeypatch.setattr(_tracejson, "_ParseError", (ValueError,))
        monkeypatch.setattr(_merge, "_FINITE_BATCHES", False, raising=False)
    runs = {}
    for name, hurt in (("clean", None), ("damaged", damage)):
        copy = tmp_path / name
        shutil.copytree(run_dir, copy)
        victim = next((copy / "step000001" / "rollout").glob("rank0-*.json.gz"))
        _rewrite(victim, clock, hurt)
        runs[name] = _ops(copy, tmp_path, capsys)
    (clean, _), (damaged, said) = runs["clean"], runs["damaged"]
    assert len(clean) > 5 and all(isinstance(ts, (int, float)) and math.isfinite(ts) for _, ts in clean)
    # Every event but the damaged one is kept, at the time it has without the damage.
    assert len(damaged) == len(clean) - 1
    assert set(damaged) < set(clean)
    assert "1 event(s) whose ts or dur is not a finite number left out" in said
    assert "rank0-" in said
