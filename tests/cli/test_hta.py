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
