"""Run ids of launchers: the ranks one launch started share one run; a real 2-rank torchrun job is one run."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import profctx
from profctx.cli import main
from profctx.manifest import ManifestReader
from profctx.util._identity import RUN_ID_MAX, launcher_run_id


def _safe(run_id: str) -> bool:
    return 0 < len(run_id) <= RUN_ID_MAX and all(c.isascii() and (c.isalnum() or c in "._-") for c in run_id)


@pytest.mark.parametrize(("environ", "expected"), [
    ({"TORCHELASTIC_RUN_ID": "0f3c7e2a-5b1d-4c8e-9a6f-1d2e3f4a5b6c"},
     ("torchrun-0f3c7e2a-5b1d-4c8e-9a6f-1d2e3f4a5b6c", "torchrun")),
    ({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0"}, ("slurm-4242.0", "slurm")),
    ({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "3"}, ("slurm-4242.3", "slurm")),
    ({"PMIX_NAMESPACE": "prterun-node1-1234@1", "OMPI_COMM_WORLD_SIZE": "4"}, None),  # checked below: sanitised
    ({"OMPI_MCA_ess_base_jobid": "301465601", "OMPI_COMM_WORLD_SIZE": "4"}, ("mpi-301465601", "mpi")),
    ({"SLURM_JOB_ID": "4242"}, None),  # a batch script, not an srun step: not a launch of ranks
    ({"RANK": "1", "WORLD_SIZE": "2"}, None),  # ranks set by hand: nothing tells two launches apart
    ({}, None),
])
def test_launcher_ids_in_order(environ: dict[str, str], expected: tuple[str, str] | None) -> None:
    found = launcher_run_id(environ)
    if "PMIX_NAMESPACE" in environ:
        assert found is not None and found[1] == "mpi" and found[0].startswith("mpi-prterun-node1-1234-")
        assert _safe(found[0])
        return
    assert found == expected


def test_an_explicit_rdzv_id_wins_over_slurm_and_the_default_none_does_not() -> None:
    slurm = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1"}
    assert launcher_run_id({**slurm, "TORCHELASTIC_RUN_ID": "job7"}) == ("torchrun-job7", "torchrun")
    assert launcher_run_id({**slurm, "TORCHELASTIC_RUN_ID": "none"}) == ("slurm-7.1", "slurm")


def test_torchruns_default_none_and_deepspeeds_launcher_name_the_launching_process() -> None:
    torchrun = launcher_run_id({"TORCHELASTIC_RUN_ID": "none"})
    deepspeed = launcher_run_id({"RANK": "0", "CROSS_RANK": "0", "LOCAL_SIZE": "2"})
    assert torchrun is not None and deepspeed is not None
    assert torchrun[0].startswith("torchrun-") and deepspeed[0].startswith("deepspeed-")
    # Same parent process: same id; a sibling started by the same launcher gets it too.
    assert launcher_run_id({"TORCHELASTIC_RUN_ID": "none"}) == torchrun
    code = ("from profctx.util._identity import launcher_run_id; "
            "print(launcher_run_id({'TORCHELASTIC_RUN_ID': 'none'})[0])")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other != torchrun[0]  # its launcher is this test process, not this test's parent


@pytest.mark.parametrize("raw", ["my job/1", "a" * 200, "../../etc", "é-run", "x\ny", "..."])
def test_any_launcher_id_becomes_a_safe_distinct_file_name(raw: str) -> None:
    found = launcher_run_id({"TORCHELASTIC_RUN_ID": raw})
    assert found is not None and _safe(found[0]) and "/" not in found[0]
    assert found[0] != launcher_run_id({"TORCHELASTIC_RUN_ID": raw + "2"})  # type: ignore[comparison-overlap]


def test_run_id_precedence_configure_then_env_then_launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from profctx.process._owner import OWNER

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    profctx.configure(steps=[1], save_path=tmp_path, exit_hooks=False, warmup=False)
    assert OWNER.runtime is not None and OWNER.runtime.run_id == "torchrun-abc"
    monkeypatch.setenv("PROFCTX_RUN_ID", "mine")
    profctx.configure(steps=[1], save_path=tmp_path, exit_hooks=False, warmup=False)
    assert OWNER.runtime is not None and OWNER.runtime.run_id == "mine"
    profctx.configure(steps=[1], save_path=tmp_path, run_id="given", exit_hooks=False, warmup=False)
    assert OWNER.runtime is not None and OWNER.runtime.run_id == "given"


# -- a real torchrun job -------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def _page_script() -> str:
    """Return the training script docs/torchrun.md shows (its test_docs run only defines ``main``)."""
    page = (ROOT / "docs" / "torchrun.md").read_text(encoding="utf-8")
    (script,) = [m for m in re.findall(r"^```python\n(.*?)^```", page, re.M | re.S) if "init_process_group" in m]
    return script


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PROFCTX_", "TORCHELASTIC_", "SLURM_", "PMIX_", "OMPI_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CROSS_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    return env


@pytest.fixture(scope="module")
def torchrun_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """docs/torchrun.md's script run by ``torch.distributed.run``: 2 ranks on CPU (gloo), no PROFCTX_RUN_ID."""
    root = tmp_path_factory.mktemp("torchrun")
    script = root / "train.py"
    script.write_text(_page_script())
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script)],
                          env=_clean_env(), capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr[-4000:]
    return root / "profiles"


def test_both_ranks_of_a_torchrun_job_land_in_one_run(torchrun_job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = list(ManifestReader(torchrun_job))
    assert {r.rank for r in records} == {0, 1}
    (run,) = {r.run for r in records}
    assert run is not None and run.startswith("torchrun-")
    assert main(["ls", str(torchrun_job), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {(r["rank"], r["run"]) for r in listed} == {(0, run), (1, run)}
    assert main(["summary", str(torchrun_job), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["run"] == run and len(summary["processes"]) == 2


def test_summary_and_report_say_which_runs_they_left_out(torchrun_job: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    save = tmp_path / "profiles"
    shutil.copytree(torchrun_job, save)
    profctx.configure(steps=[1], save_path=save, run_id="later", exit_hooks=False, warmup=False)
    with profctx.profile_step(1), profctx.profile_step(role="forward"):
        torch.nn.Linear(4, 4)(torch.randn(2, 4)).sum()
    profctx.reset()

    assert main(["summary", str(save)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("run later:") and "1 other run in this folder left out" in out and "--run all" in out
    assert main(["report", str(save), "-o", str(tmp_path / "r.html")]) == 0
    assert "1 other run in this folder left out" in capsys.readouterr().out
    assert main(["summary", str(save), "--run", "all"]) == 0
    assert "left out" not in capsys.readouterr().out
    assert main(["summary", str(torchrun_job)]) == 0  # one run: nothing to say
    assert "left out" not in capsys.readouterr().out


def test_a_static_torchrun_launch_without_rdzv_id_is_one_run_and_two_launches_two(tmp_path: Path) -> None:
    """``--master-port`` keeps torchrun's static rendezvous, whose id is ``none`` for every launch."""
    script = tmp_path / "ids.py"
    script.write_text("from profctx.util._identity import launcher_run_id\nprint('ID', launcher_run_id()[0])\n")
    seen = []
    for _ in range(2):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                               "--master-port", str(port), str(script)],
                              env=_clean_env(), capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-4000:]
        ids = {line.split()[-1] for line in done.stdout.splitlines() if line.startswith("ID ")}
        assert len(ids) == 1 and next(iter(ids)).startswith("torchrun-"), done.stdout
        seen.append(ids.pop())
    assert seen[0] != seen[1]
