"""``profctx merge --hta``: a run laid out as HTA loads a job, one file per rank, each step named.

Checked three ways: by reading the files as HTA and TensorBoard's profiler plugin read them (the
first ``"rank": N`` of a file is its rank; an operator's step is the ``ProfilerStep#N`` range it
lies in), always; with the real HTA, when it is installed (the optional group ``hta``, or the
interpreter named by ``PROFCTX_HTA_PYTHON``); and with torch-tb-profiler's loader when it imports
(here or in the interpreter named by ``PROFCTX_TB_PYTHON``, else ``PROFCTX_HTA_PYTHON``).

The runs are real, made by profctx with the torch backend on CPU: the session's two-rank role-mode
run (``run_dir``), and, once for this module, a job shaped like a Ray one: a driver outside every
group, an ``actor`` group in step mode and a ``rollout`` group whose steps 1-2 are one contiguous
capture.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import profctx  # noqa: E402
from profctx.cli import main  # noqa: E402
from profctx.records._manifest import read  # noqa: E402

#: How HTA 0.5.0 finds a file's rank (hta/common/trace_file.py): the first match, line by line.
HTA_RANK = re.compile(r'"rank":\s+(\d+)')
JOB = "job"


def _job(save: Path) -> Path:
    common = {"save_path": str(save), "tool": "torch", "steps": "1:3", "ranks": "all", "run_id": JOB,
              "compress": True}
    profctx.configure(**common, mode="step", rank=0, world_size=1)  # the driver
    for step in (1, 2):
        with profctx.profile_step(step):
            pass
    profctx.flush()
    profctx.reset()
    for group, contiguous in (("actor", False), ("rollout", True)):
        for rank in (0, 1):
            profctx.configure(**common, mode="step", contiguous=contiguous, group=group, rank=rank, world_size=2)
            for step in (1, 2, 3):
                with profctx.profile_step(step), profctx.profile_step(role=group):
                    x = torch.randn(16, 16)
                    (x @ x).relu().sum()
            profctx.flush()
            profctx.reset()
    return save


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    saved = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE") if k in os.environ}
    try:
        return _job(tmp_path_factory.mktemp("job"))
    finally:
        os.environ.update(saved)


def _load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def _rank_read_as_hta_does(path: Path) -> int | None:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            match = HTA_RANK.search(line)
            if match:
                return int(match.group(1))
    return None


def _ops_by_step(trace: dict[str, Any]) -> Counter[tuple[int, str]]:
    """Return the operators of a trace by (step of the ProfilerStep range they lie in, name); -1: in none."""
    markers = [(e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1])) for e in trace["traceEvents"]
               if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    found: Counter[tuple[int, str]] = Counter()
    for e in trace["traceEvents"]:
        if e.get("cat") == "cpu_op":
            steps = {s for begin, end, s in markers if begin <= e["ts"] < end}
            assert len(steps) <= 1, f"{e['name']} lies in the markers of steps {steps}"
            found[(steps.pop() if steps else -1, e["name"])] += 1
    return found


def _input_ops(save: Path, group: str | None, rank: int) -> Counter[tuple[int, str]]:
    """Return the operators of the rank's own capture files, by step as their own markers or capture say."""
    found: Counter[tuple[int, str]] = Counter()
    for record in read(save):
        if record.get("rank") != rank or record.get("group") != group or record.get("kind") == "engine":
            continue
        for entry in record.get("files") or []:
            trace = _load(save / entry["path"])
            ops = _ops_by_step(trace)
            for (step, name), n in ops.items():
                if step == -1 and len(record["steps"]) == 1:
                    step = record["steps"][0]  # the profiler's own events around a one-step capture
                found[(step, name)] += n
    return found


def test_a_role_mode_run_becomes_one_file_per_rank(run_dir: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "hta"
    assert main(["merge", str(run_dir), "--hta", "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"TraceAnalysis(trace_dir={str(out)!r}, include_last_profiler_step=True)" in said
    assert sorted(p.name for p in out.iterdir()) == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    for rank in (0, 1):
        path = out / f"rank{rank}.pt.trace.json.gz"
        assert _rank_read_as_hta_does(path) == rank
        trace = _load(path)
        assert trace["distributedInfo"] == {"backend": "none", "rank": rank, "world_size": 2}
        markers = [e["name"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
        assert markers == ["ProfilerStep#1", "ProfilerStep#2"]  # one per step, whatever the roles
        # Every operator of the rank's captures is there, in the step it was captured in.
        ops = _ops_by_step(trace)
        assert ops == _input_ops(run_dir, None, rank)
        assert {s for s, _ in ops} == {1, 2} and ops[(1, "aten::mm")] == 1


def test_a_grouped_job_gets_a_folder_per_group_without_the_driver(job: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "hta"
    assert main(["merge", str(job), "--hta", "-o", str(out), "--step", "1", "--step", "2"]) == 0
    said = capsys.readouterr().out
    assert "2 capture(s) left out: the driver is outside every worker group" in said
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.gz")) == [
        f"{g}/rank{r}.pt.trace.json.gz" for g in ("actor", "rollout") for r in (0, 1)]
    for group in ("actor", "rollout"):
        for rank in (0, 1):
            path = out / group / f"rank{rank}.pt.trace.json.gz"
            assert _rank_read_as_hta_does(path) == rank
            ops = _ops_by_step(_load(path))
            # The contiguous rollout capture (steps 1-2 in one file) is split at its own step markers.
            assert ops == _input_ops(job, group, rank) and {s for s, _ in ops} == {1, 2}
            assert ops[(1, "aten::mm")] == ops[(2, "aten::mm")] == 1


def test_traces_that_name_no_step_get_a_marker_per_step(run_dir: Path, tmp_path: Path) -> None:
    """Traces written before profctx named its steps ``ProfilerStep#N`` (or by another producer)."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    for path in copy.glob("step*/*/*.json.gz"):
        trace = _load(path)
        trace["traceEvents"] = [e for e in trace["traceEvents"]
                                if not str(e.get("name", "")).startswith("ProfilerStep#")]
        path.write_bytes(gzip.compress(json.dumps(trace).encode()))
    out = tmp_path / "hta"
    assert main(["merge", str(copy), "--hta", "-o", str(out)]) == 0
    for rank in (0, 1):
        ops = _ops_by_step(_load(out / f"rank{rank}.pt.trace.json.gz"))
        assert ops == _input_ops(copy, None, rank) and -1 not in {s for s, _ in ops}


def test_a_group_name_from_the_manifest_never_leaves_the_layout(job: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(job, copy)
    for shard in (copy / ".profctx").glob("*.jsonl"):  # a manifest is read, never trusted
        shard.write_text(shard.read_text(encoding="utf-8").replace('"group": "rollout"', '"group": "../../x"')
                         .replace('"group":"rollout"', '"group":"../../x"'), encoding="utf-8")
    for index in (copy / ".profctx").glob("*.index"):
        index.unlink()
    out = tmp_path / "deep" / "hta"
    assert main(["merge", str(copy), "--hta", "-o", str(out)]) == 0
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("rank*.pt.trace.json.gz")
                  if "run" not in p.parts) == [f"deep/hta/{g}/rank{r}.pt.trace.json.gz" for g in ("actor", "x")
                                               for r in (0, 1)]


def test_a_layout_needs_a_folder_of_its_own_and_one_run(run_dir: Path, job: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "old.json").write_text("{}")
    assert main(["merge", str(run_dir), "--hta", "-o", str(taken)]) == 2
    assert "not an empty folder" in capsys.readouterr().err
    assert [p.name for p in taken.iterdir()] == ["old.json"]
    two = tmp_path / "two"
    shutil.copytree(run_dir, two)
    for item in job.iterdir():  # a second run in the same save_path
        if item.is_dir():
            shutil.copytree(item, two / item.name, dirs_exist_ok=True)
    assert main(["merge", str(two), "--hta", "--run", "all", "-o", str(tmp_path / "x")]) == 2
    assert "--hta lays out one job" in capsys.readouterr().err and not (tmp_path / "x").exists()
    # The default: under the run's merged/ folder, the run's and steps' names.
    assert main(["merge", str(two), "--hta", "--run", JOB, "--step", "2"]) == 0
    assert (two / "merged" / f"{JOB}-step000002.hta" / "actor" / "rank1.pt.trace.json.gz").is_file()


def _gpu_run(save: Path) -> Path:
    """Write a GPU-shaped run: 3 ranks, 2 steps, 2 roles, kernels launched by ``cudaLaunchKernel``.

    As in a torch CUDA trace, a launch and its kernel share a ``correlation`` id; each capture
    counts its ids from 0, as separate profiling sessions may.
    """
    from analysis.synth import Spec, write_run

    write_run(save, Spec(steps=(1, 2), ranks=3, roles={"actor_update": 0.3, "rollout": 0.2}, kernels=True,
                         events=30, slow={(1, "actor_update"): 1.7}))
    for path in save.glob("step*/*/*.json.gz"):
        trace = _load(path)
        events = trace["traceEvents"]
        cpu = next(e for e in events if e.get("cat") == "cpu_op")
        events += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": cpu["pid"],
                    "tid": cpu["tid"], "ts": k["ts"] - 1, "dur": 0.5, "args": {"correlation": k["args"]["correlation"]}}
                   for k in events if k.get("cat") == "kernel"]
        path.write_bytes(gzip.compress(json.dumps(trace).encode()))
    return save


def _kernel_time(traces: list[dict[str, Any]]) -> dict[str, tuple[float, int]]:
    """Return each kernel's total time (us) and count over ``traces``."""
    found: dict[str, tuple[float, int]] = {}
    for trace in traces:
        for e in trace["traceEvents"]:
            if e.get("cat") == "kernel":
                total, count = found.get(e["name"], (0.0, 0))
                found[e["name"]] = (total + e["dur"], count + 1)
    return found


def test_each_kernel_keeps_its_own_launch(tmp_path: Path) -> None:
    run = _gpu_run(tmp_path / "run")
    out = tmp_path / "hta"
    assert main(["merge", str(run), "--hta", "-o", str(out)]) == 0
    for rank in range(3):
        trace = _load(out / "actor" / f"rank{rank}.pt.trace.json.gz")
        launches = Counter(e["args"]["correlation"] for e in trace["traceEvents"] if e.get("cat") == "cuda_runtime")
        kernels = [e["args"]["correlation"] for e in trace["traceEvents"] if e.get("cat") == "kernel"]
        # 4 captures of 30 launches, every id once: a kernel is joined to its own launch only.
        assert len(kernels) == 120 and set(launches.values()) == {1} and set(kernels) == set(launches)


# -- the real tools (optional) -------------------------------------------------------------------

def _python_with(module: str, *variables: str) -> str | None:
    """Return an interpreter that imports ``module``: this one, or one named by the first variable set."""
    if importlib.util.find_spec(module) is not None:
        return sys.executable
    for name in variables:
        interpreter = os.environ.get(name)
        if interpreter:
            done = subprocess.run([interpreter, "-c", f"import {module}"], capture_output=True, timeout=120,
                                  check=False)
            return interpreter if done.returncode == 0 else None
    return None


_HTA = """
import json, logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
analysis = TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True)
symbols = analysis.t.symbol_table.sym_table
out = {}
for rank in analysis.t.get_ranks():
    frame = analysis.t.get_trace(rank)
    ops = frame[frame["cat"].map(lambda i: symbols[i]) == "cpu_op"]
    out[int(rank)] = {"iterations": [int(i) for i in analysis.t.get_iterations(rank)],
                      "op_iterations": sorted({int(i) for i in ops["iteration"]}), "ops": int(len(ops))}
print(json.dumps(out))
"""


def _hta(folder: Path) -> dict[str, Any]:
    interpreter = _python_with("hta", "PROFCTX_HTA_PYTHON")
    assert interpreter is not None
    done = subprocess.run([interpreter, "-c", _HTA, str(folder)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.skipif(_python_with("hta", "PROFCTX_HTA_PYTHON") is None,
                    reason="HTA is not installed (optional group 'hta' or PROFCTX_HTA_PYTHON)")
def test_hta_loads_each_rank_with_its_steps(run_dir: Path, job: Path, tmp_path: Path) -> None:
    for name, save, folder in (("role", run_dir, ""), ("job", job, "rollout")):
        out = tmp_path / name
        assert main(["merge", str(save), "--hta", "-o", str(out), "--step", "1", "--step", "2"]) == 0
        loaded = _hta(out / folder)
        assert sorted(loaded) == ["0", "1"]  # distinct ranks, from each file's distributedInfo
        for rank, figures in loaded.items():
            assert figures["iterations"] == [1, 2]
            assert figures["op_iterations"] == [1, 2]  # every operator in its step, none at -1
            group = folder or None
            assert figures["ops"] == sum(_input_ops(save, group, int(rank)).values())


_KERNELS = """
import json, logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
analysis = TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True)
_, kernels = analysis.get_gpu_kernel_breakdown(visualize=False, num_kernels=1000, duration_ratio=1.0)
print(json.dumps(kernels.to_dict(orient="records")))
"""


@pytest.mark.skipif(_python_with("hta", "PROFCTX_HTA_PYTHON") is None,
                    reason="HTA is not installed (optional group 'hta' or PROFCTX_HTA_PYTHON)")
def test_hta_kernel_time_per_rank_is_that_of_its_captures(tmp_path: Path) -> None:
    run = _gpu_run(tmp_path / "run")
    out = tmp_path / "hta"
    assert main(["merge", str(run), "--hta", "-o", str(out)]) == 0
    interpreter = _python_with("hta", "PROFCTX_HTA_PYTHON")
    assert interpreter is not None
    done = subprocess.run([interpreter, "-c", _KERNELS, str(out / "actor")], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    hta = {(row["rank"], row["name"]): row["sum (us)"] for row in json.loads(done.stdout.strip().splitlines()[-1])}
    for rank in range(3):
        inputs = [_load(p) for p in run.glob(f"step*/*/*rank{rank}-*.json.gz")]
        assert len(inputs) == 4
        for name, (total, count) in _kernel_time(inputs).items():
            # Each capture's kernels once (not once per capture holding the same ids): HTA rounds each
            # kernel's ts and dur down to whole microseconds, so up to 1 us a kernel is lost.
            assert total - count <= hta[(rank, name)] <= total


_TB = """
import json, logging, sys, tempfile
logging.disable(logging.WARNING)
from torch_tb_profiler.profiler.data import RunProfileData
print(json.dumps([list(RunProfileData.parse("w", None, p, tempfile.mkdtemp()).steps_names) for p in sys.argv[1:]]))
"""


@pytest.mark.skipif(_python_with("torch_tb_profiler", "PROFCTX_TB_PYTHON", "PROFCTX_HTA_PYTHON") is None,
                    reason="torch-tb-profiler is not installed (here, PROFCTX_TB_PYTHON or PROFCTX_HTA_PYTHON)")
def test_tensorboard_plugin_names_the_step(run_dir: Path, job: Path, tmp_path: Path) -> None:
    interpreter = _python_with("torch_tb_profiler", "PROFCTX_TB_PYTHON", "PROFCTX_HTA_PYTHON")
    assert interpreter is not None
    out = tmp_path / "hta"
    assert main(["merge", str(run_dir), "--hta", "-o", str(out)]) == 0
    captures = [next((run_dir / "step000002" / "rollout").glob("rank1-*.gz")),
                next((job / "step000002" / "step").glob("actor-rank0-*.gz"))]
    done = subprocess.run([interpreter, "-c", _TB, *map(str, captures), str(out / "rank0.pt.trace.json.gz")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    # Each capture names its own step (not "0"); the rank's layout file names every step once.
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [["2"], ["2"], ["1", "2"]]
