"""``profctx demo`` end to end: real Ray cluster, real torch traces, the manifest and the printed table."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from profctx.records import _manifest

pytest.importorskip("ray")
pytest.importorskip("torch")

pytestmark = pytest.mark.slow


def test_demo_writes_traces_for_every_role_and_rank_and_lists_them(tmp_path: Path) -> None:
    save = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "profctx", "demo", "--steps", "3", "--window", "2:3", "--rollouts", "1",
         "--save-path", str(save)],
        capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    records = _manifest.read(save)
    got = sorted((r["step"], r["role"], r.get("group"), r["rank"], r["status"]) for r in records)
    assert got == [(2, "actor_update", "actor", 0, "ok"), (2, "actor_update", "actor", 1, "ok"),
                   (2, "ref_compute_log_prob", "actor", 0, "ok"), (2, "ref_compute_log_prob", "actor", 1, "ok"),
                   (2, "rollout", "rollout", 0, "ok")]
    assert len({r["run"] for r in records}) == 1  # every process of the run shares the driver's run id
    assert {r["world_size"] for r in records if r["role"] != "rollout"} == {2}
    expected = {"rollout": "aten::multinomial", "ref_compute_log_prob": "aten::_log_softmax",
                "actor_update": "Optimizer.step#Adam.step"}
    for record in records:
        (entry,) = record["files"]
        path = save / entry["path"]
        assert path.name.endswith(".pt.trace.json.gz") and path.stat().st_size == entry["bytes"]
        trace = json.loads(gzip.decompress(path.read_bytes()))
        names = {e.get("name", "") for e in trace["traceEvents"]}
        assert expected[record["role"]] in names  # each capture holds its own role's work
        meta = json.loads(trace["profctx"]) if isinstance(trace.get("profctx"), str) else trace.get("profctx")
        assert meta["rank"] == record["rank"] and meta["role"] == record["role"]
    table = done.stdout[done.stdout.index("step  role"):]
    assert len([line for line in table.splitlines() if " ok " in line]) == len(records)
    assert str(save) in done.stdout
