"""``profctx timeline``: a step profctx captured in role mode is not marked slow for the capture's own cost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from profctx.analysis._timeline import Rules, anomalies, read
from profctx.cli import main

from .tlmem import measure, write

pytest.importorskip("torch")

CAPTURED = 5

#: One process, 10 steps of two roles of 4 ms each; torch captures step 5's roles (role mode), so each role's
#: profiler start and stop fall inside step 5's block (tens of ms on this machine, against 8 ms steps).
ROLE_LOOP = """
    import time, profctx
    profctx.configure(save_path={save!r}, steps=[{captured}], mode="role", tool="torch", warmup=False)
    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    for step in range(10):
        with profctx.profile_step(step):
            with profctx.profile_step(role="gen"):
                spin(0.004)
            with profctx.profile_step(role="train"):
                spin(0.004)
"""


@pytest.fixture(scope="module")
def role_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    save = tmp_path_factory.mktemp("role-run")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROFCTX_")}
    code = textwrap.dedent(ROLE_LOOP.format(save=str(save), captured=CAPTURED))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return save


def test_the_captured_step_is_named_captured_never_anomalous(
        role_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["timeline", str(role_run), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["captured_steps"] == [CAPTURED]
    assert CAPTURED not in doc["anomalies"]
    row = doc["steps"][CAPTURED]
    assert row["step"] == CAPTURED and row["anomaly"] is None
    # The step is still shown as it was: its wall time holds the capture, the roles' own times do not.
    assert row["time_s"] > row["roles"]["gen"]["time_s"] + row["roles"]["train"]["time_s"]
    assert main(["timeline", str(role_run), "--rows", "0"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines()[2:] if x.split()[0] == str(CAPTURED))
    assert "anomaly:" not in line
    if row["captured"] is not None:  # the rule would have marked it: the table says why it does not
        assert "captured" in line and "not an anomaly" in line


def test_the_json_written_a_step_at_a_time_is_the_document(role_run: Path) -> None:
    import io

    from profctx.analysis._timeline import dump_json, rows, to_json

    timelines, rules = read(role_run), Rules()
    document = {**to_json(timelines, rows(timelines, rules), rules), "missing": []}
    written = io.StringIO()
    dump_json(timelines, rows(timelines, rules), rules, written, {"missing": []})
    assert written.getvalue() == json.dumps(document, indent=1)


def test_a_captured_step_is_left_out_of_the_history_of_the_steps_after_it() -> None:
    rules = Rules(window=5, min_history=5)
    times = [0.01] * 5 + [0.5] + [0.01] * 4 + [0.03]
    captured = [False] * 5 + [True] + [False] * 5
    found = anomalies(times, rules, captured)
    assert found[5] is not None and found[5].captured  # shown as the capture's cost, flagged
    # Step 10 (3x) is judged against the five uncaptured steps before it, none of them the 0.5 s one.
    assert found[10] is not None and not found[10].captured and found[10].baseline_s == 0.01
    assert [i for i, a in enumerate(found) if a is not None and not a.captured] == [10]
    assert anomalies(times, rules)[5] is not None and not anomalies(times, rules)[5].captured  # nothing flagged


# -- what reading a long timeline holds --------------------------------------------------------------

#: A peak resident set over 4x the file would mean the reader holds Python objects per step again (it held
#: ~18x before the steps were kept in arrays and the rows made afresh each walk; it holds ~1x now, see
#: docs/performance.md): 4x leaves room for the allocator's slack and the imports' caches, whatever the load.
MEMORY_STEPS = 12_000  # a file of about 2 MB: a few seconds of parsing, well above the constant slack


def test_the_steps_are_held_in_arrays_smaller_than_the_file(tmp_path: Path) -> None:
    size = write(tmp_path, 5_000, 3)
    (process,) = read(tmp_path).processes
    assert len(process.steps) == 5_000 and set(process.steps[4_999].roles) == {"rollout", "ref", "actor_update"}
    held = sum(a.itemsize * len(a) for a in vars(process.steps).values() if hasattr(a, "itemsize"))
    assert held < size


def test_timeline_and_its_json_hold_about_the_bytes_they_read(tmp_path: Path) -> None:
    size = write(tmp_path, MEMORY_STEPS, 3)
    for what in ("timeline", "timeline --json"):
        before, after = measure(what, tmp_path)
        assert after - before < 4 * size, (what, after - before, size)
