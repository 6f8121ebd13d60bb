"""A fuzz of hostile run folders through ``ls``, ``summary``, ``report``, ``merge``, ``diff`` and ``check``.

Each example is a copy of a real run with a few hostile things added: files listed outside the
folder (absolute, ``../``, links to a file or a folder outside), FIFOs, folders where files
should be, JSON nested too deep, a gzip bomb over the inflation cap, old engine records naming
folders outside, manifest lines nested too deep, control characters in any manifest field, hard
links to files outside (a trace, a manifest shard), records naming a trace of the run again (spelled
another way) and events whose times are no finite number. Every command must end (a deadline
catches a hang), print no traceback, leave the canary outside unread and everything outside the
folder unchanged, print no raw control character, write no ``NaN`` or infinity, and stay within
its bounds: a memory bound, and no more events counted (``summary --json``) or written (``merge``)
than the folder holds once each.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from .test_hostile import CANARY, CONTROLS, add_records, first_record, hostile_copy, run_all

_FIELDS = ["run", "role", "host", "group", "backend", "engine", "version", "error", "reason", "status", "kind",
           "folder", "capture", "notes"]
_NASTY = st.sampled_from(["\x1b]0;title\x07", "\x1b[2J", "\x1b]52;c;eA==\x07", "\x9b1m", "\u202eevil", "a\rb",
                          "tab\there", "new\nline", "\x00", "\x7f"])
_FILES = ["absolute", "climb", "link-out", "linked-folder", "fifo", "folder", "deep", "bomb", "control-name",
          "missing", "link-in", "hard-link-out", "again", "non-finite"]
#: Events a "non-finite" file adds that a reader may count: one of its two (the other's ``dur`` is infinite).
_VALID_PER_NON_FINITE = 1
_CPU_OP = re.compile(r'"cat":\s*"cpu_op"')
_ENGINES = ["absolute", "climb", "linked-folder", "manifest"]


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A gzip trace of a few hundred kB inflating to 80 MB of JSON whitespace: over the cap, quick to reject."""
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 31)
    spaces = b" " * (1 << 20)
    parts = [squeeze.compress(b'{"traceEvents": [')]
    parts += [squeeze.compress(spaces) for _ in range(80)]
    parts.append(squeeze.compress(b"]}") + squeeze.flush())
    path = tmp_path_factory.mktemp("bomb") / "bomb.pt.trace.json.gz"
    path.write_bytes(b"".join(parts))
    return path


def _plant_file(folder: Path, outside: Path, kind: str, index: int, bomb: Path) -> str:
    """Create one hostile thing for a record to list; return the name the record gives."""
    canary = outside / "canary.pt.trace.json"
    here = folder / "step000001" / "rollout"
    name = f"h{index}.pt.trace.json"
    if kind == "absolute":
        return str(canary)
    if kind == "climb":
        return "../outside/canary.pt.trace.json"
    if kind == "link-out":
        (here / name).symlink_to(canary)
    elif kind == "link-in":  # a link to a trace of the run itself: not followed either
        (here / name).symlink_to(next(p for p in sorted(here.iterdir()) if p.name.endswith(".gz")))
    elif kind == "linked-folder":
        (folder / f"step9{index:05d}").symlink_to(outside, target_is_directory=True)
        return f"step9{index:05d}/canary.pt.trace.json"
    elif kind == "fifo":
        os.mkfifo(here / name)
    elif kind == "folder":
        (here / name).mkdir()
    elif kind == "deep":
        (here / name).write_text('{"traceEvents": [' + "[" * 5000 + "]" * 5000 + "]}")
    elif kind == "bomb":
        name += ".gz"
        shutil.copyfile(bomb, here / name)
    elif kind == "control-name":
        name = f"\x1b]0;x\x07{index}.pt.trace.json"
        (here / name).write_text('{"traceEvents": []}')
    elif kind == "hard-link-out":  # one file under two names, one outside: refused as a hard link
        os.link(canary, here / name)
    elif kind == "again":  # a trace of the run, named by one more record, spelled another way
        rel = next(p for p in sorted(here.iterdir()) if p.name.endswith(".gz")).relative_to(folder).as_posix()
        return [rel, f"./{rel}", f"step000001/../{rel}", str(folder / rel)][index % 4]
    elif kind == "non-finite":
        bad = {"ph": "X", "cat": "cpu_op", "name": "bad_time", "ts": 1, "dur": float("inf"), "pid": 1, "tid": 1}
        good = {**bad, "name": "good_time", "ts": 2, "dur": 3}
        (here / name).write_text(json.dumps({"traceEvents": [bad, good]}))  # json writes bare Infinity
    return f"step000001/rollout/{name}"


def _engine_folder(folder: Path, outside: Path, kind: str, index: int) -> str:
    if kind == "absolute":
        return str(outside)
    if kind == "climb":
        return "../outside"
    if kind == "linked-folder":
        (folder / f"step8{index:05d}").symlink_to(outside, target_is_directory=True)
        return f"step8{index:05d}"
    return ".profctx"


@pytest.fixture(scope="module")
def clean_counts(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, int]:
    """Return the events ``summary --json`` counts and the CPU operators ``merge`` writes for the run as it is."""
    import profctx.cli

    out = tmp_path_factory.mktemp("clean") / "m.json"
    with contextlib.redirect_stdout(io.StringIO()) as said:
        profctx.cli.main(["summary", str(run_dir), "--json"])
    counted = _counted(json.loads(said.getvalue()))
    with contextlib.redirect_stdout(io.StringIO()):
        profctx.cli.main(["merge", str(run_dir), "-o", str(out)])
    return counted, len(_CPU_OP.findall(out.read_text(encoding="utf-8")))


def _counted(summary: dict[str, Any]) -> int:
    return sum(op["count"] for ops in summary["role_ops"].values() for op in ops)


def _strict(text: str) -> Any:
    def refuse(token: str) -> Any:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def _outside_state(outside: Path) -> dict[str, Any]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(outside.iterdir())}


_ENTRY = st.one_of(
    st.tuples(st.just("file"), st.sampled_from(_FILES)),
    st.tuples(st.just("shard"), st.sampled_from(["link-out", "fifo", "folder", "hard-link-out"])),
    st.tuples(st.just("engine"), st.sampled_from(_ENGINES)),
    st.tuples(st.just("field"), st.sampled_from(_FIELDS), _NASTY),
    st.tuples(st.just("deep-line"), st.integers(200, 20_000)),
)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(_ENTRY, min_size=1, max_size=4))
@example(entries=[("file", "hard-link-out"), ("file", "again"), ("file", "non-finite"), ("shard", "hard-link-out")])
@example(entries=[("file", "again"), ("file", "again"), ("file", "bomb")])
def test_no_hostile_folder_gets_through(entries: list[tuple[Any, ...]], run_dir: Path, bomb: Path,
                                        clean_counts: tuple[int, int], tmp_path_factory: pytest.TempPathFactory,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    tmp = tmp_path_factory.mktemp("hostile")
    folder, outside = hostile_copy(run_dir, tmp)
    records: list[dict[str, Any]] = []
    lines: list[str] = []
    for index, entry in enumerate(entries):
        if entry[0] == "file":
            records.append({"files": [{"path": _plant_file(folder, outside, entry[1], index, bomb), "bytes": 1}]})
        elif entry[0] == "engine":
            records.append({"kind": "engine", "engine": "vllm", "replica": index,
                            "folder": _engine_folder(folder, outside, entry[1], index)})
        elif entry[0] == "shard":  # a manifest shard that is no regular file inside the folder
            shard_path = folder / ".profctx" / f"clirun.rank{index}-of-9.vm.{index}.jsonl"
            if entry[1] == "link-out":
                shard_path.symlink_to(outside / "canary.pt.trace.json")
            elif entry[1] == "hard-link-out":  # a manifest outside, naming the canary as a role
                planted = outside / f"shard{index}.jsonl"
                planted.write_text(json.dumps({**first_record(folder), "capture": f"p{index}", "role": CANARY}) + "\n")
                os.link(planted, shard_path)
            elif entry[1] == "fifo":
                os.mkfifo(shard_path)
            else:
                shard_path.mkdir()
        elif entry[0] == "field":
            records.append({entry[1]: entry[2] if entry[1] != "notes" else [entry[2]]})
        else:
            lines.append('{"v": 1, "run": "clirun", "capture": "deep", "notes": '
                         + "[" * entry[1] + "]" * entry[1] + "}")
    add_records(folder, *records)
    shard = sorted((folder / ".profctx").glob("*.jsonl"))[0]
    with open(shard, "a", encoding="utf-8") as fh:
        fh.writelines(line + "\n" for line in lines)
    before = _outside_state(outside)
    (tmp / "out").mkdir()
    siblings = sorted(p.name for p in tmp.iterdir())
    tracemalloc.start()
    try:
        results = run_all(folder, tmp / "out", capsys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    for name, (_, text) in results.items():
        assert CANARY not in text, name
        assert "Traceback" not in text, name
        if name not in ("report", "merge"):  # their files are HTML and JSON, escaped on their own terms
            for control in CONTROLS:
                assert control not in text, (name, repr(control))
    json.loads(results["ls-json"][1][:results["ls-json"][1].rindex("]") + 1])
    for name in ("summary", "summary-json", "report", "diff", "check", "merge"):
        assert not re.search(r"\b(?:inf|nan|infinity)\b", results[name][1], re.IGNORECASE), name
    # Within the bound: each file counted and written once, bad times left out, nothing from outside.
    planted = _VALID_PER_NON_FINITE * sum(1 for entry in entries if entry == ("file", "non-finite"))
    text = results["summary-json"][1]
    assert _counted(_strict(text[:text.rindex("}") + 1])) <= clean_counts[0] + planted
    assert len(_CPU_OP.findall(results["merge"][1])) <= clean_counts[1] + planted
    assert _outside_state(outside) == before  # nothing outside read into, written or replaced
    assert sorted(p.name for p in tmp.iterdir()) == siblings
    assert peak < 96 << 20, peak
    shutil.rmtree(tmp, ignore_errors=True)
