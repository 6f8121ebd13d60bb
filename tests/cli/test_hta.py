"""profctx's per-capture torch traces load in Holistic Trace Analysis, one rank per trace.

HTA (``holistictraceanalysis``) pulls jupyterlab and about 500 MB of packages, so it is an
optional test group (``pip install 'profctx[hta]'``). It runs in this interpreter when HTA
imports here, or in the interpreter named by ``PROFCTX_HTA_PYTHON`` (a separate environment
with HTA), and is skipped otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

_PROBE = """
import json, sys
from hta.trace_analysis import TraceAnalysis
analysis = TraceAnalysis(trace_dir=sys.argv[1])
ranks = sorted(analysis.t.get_all_traces()) if hasattr(analysis.t, "get_all_traces") else sorted(analysis.t.traces)
names = set()
for rank in ranks:
    frame = analysis.t.get_trace(rank)
    names |= {analysis.t.symbol_table.sym_table[i] for i in frame["name"].unique()}
print(json.dumps({"ranks": [int(r) for r in ranks], "names": sorted(names)}))
"""


def _interpreter() -> str | None:
    if importlib.util.find_spec("hta") is not None:
        return sys.executable
    return os.environ.get("PROFCTX_HTA_PYTHON") or None


@pytest.mark.skipif(_interpreter() is None, reason="HTA is not installed (optional group 'hta' or PROFCTX_HTA_PYTHON)")
def test_each_rank_of_a_role_loads_in_hta(run_dir: Path) -> None:
    interpreter = _interpreter()
    assert interpreter is not None
    folder = run_dir / "step000001" / "rollout"
    done = subprocess.run([interpreter, "-c", _PROBE, str(folder)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded["ranks"] == [0, 1]  # from each trace's distributedInfo.rank
    assert "aten::mm" in loaded["names"]


_KERNELS = """
import json, sys
from hta.trace_analysis import TraceAnalysis
analysis = TraceAnalysis(trace_dir=sys.argv[1])
_, kernels = analysis.get_gpu_kernel_breakdown(visualize=False, num_kernels=1000, duration_ratio=1.0)
print(json.dumps(kernels.to_dict(orient="records")))
"""


@pytest.mark.skipif(_interpreter() is None, reason="HTA is not installed (optional group 'hta' or PROFCTX_HTA_PYTHON)")
def test_device_time_per_kernel_matches_hta(tmp_path: Path) -> None:
    from analysis.synth import Spec, write_run

    from profctx.analysis import summarize

    spec = Spec(steps=(1,), ranks=3, roles={"actor_update": 0.3}, kernels=True, events=30,
                slow={(1, "actor_update"): 1.7, (2, "actor_update"): 0.6})
    write_run(tmp_path, spec)
    interpreter = _interpreter()
    assert interpreter is not None
    done = subprocess.run([interpreter, "-c", _KERNELS, str(tmp_path / "step000001" / "actor_update")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    hta = {(row["rank"], row["name"]): row["sum (us)"] for row in json.loads(done.stdout.strip().splitlines()[-1])}
    ours = {(c.record.rank, op.name): op.total_s * 1e6
            for c in summarize(tmp_path).captures for op in c.device_ops}
    assert len(hta) == 3 and set(hta) == set(ours)
    for key, value in hta.items():
        assert ours[key] == pytest.approx(value, rel=1e-6, abs=1.0)  # HTA rounds ts/dur down to whole us
