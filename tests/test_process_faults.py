"""What configure() and exit do to the rest of the process: imports only where a capture can happen, no
background import racing the program's own, a clean exit while another thread is inside a capture."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from profctx.records._manifest import read

pytest.importorskip("torch")


def _run(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


NOT_SELECTED = """
    import sys, profctx
    profctx.configure(steps=[1], ranks=[1], rank=0, save_path=sys.argv[1], tool="torch", mode="role")
    with profctx.profile_step(1), profctx.profile_step(role="update"):
        pass
    profctx.configure(steps=[1], ranks={"actor": [0]}, save_path=sys.argv[1], tool="torch")  # a driver, unprofiled
    with profctx.profile_step(1):
        pass
    print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""


def test_a_process_that_cannot_capture_never_imports_the_backend(tmp_path: Path) -> None:
    done = _run(NOT_SELECTED, str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


UNSELECTED_TOOLS = """
    import sys, profctx
    for tool in ("nsys", "torch_memory", "npu", "torch", "auto"):
        profctx.configure(steps=[1], ranks=[1], rank=0, save_path=sys.argv[1], tool=tool)  # an unselected rank
        with profctx.profile_step(1), profctx.profile_step(role="update"):
            pass
        assert profctx.get_config().tool == tool
        # A driver whose own rank the config does not name, profiling only a group: checked in full, not imported.
        profctx.configure(steps=[1], ranks={"actor": [0]}, save_path=sys.argv[1], tool=tool)
        with profctx.profile_step(1):
            pass
    profctx.reset()
    print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torch_npu", "nvtx")))
"""


def _stand_in(root: Path, name: str, **version: str | None) -> None:
    """Install ``name`` under ``root`` as a package whose import fails loudly; ``version`` writes its version.py."""
    (root / name).mkdir()
    (root / name / "__init__.py").write_text(f"raise SystemExit('{name} was imported')\n")
    if version:
        (root / name / "version.py").write_text("".join(f"{k} = {v!r}\n" for k, v in version.items()))


def test_unselected_ranks_check_every_tool_without_importing_it(tmp_path: Path) -> None:
    # A CUDA torch, torch_npu and nvtx that end the process if imported: the check reads, never imports.
    site = tmp_path / "site"
    site.mkdir()
    _stand_in(site, "torch", __version__="2.9.0+cu128", cuda="12.8", hip=None)
    _stand_in(site, "torch_npu")
    _stand_in(site, "nvtx")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(UNSELECTED_TOOLS), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


CPU_ONLY_REFUSAL = """
    import sys, profctx
    for tool in ("nsys", "torch_memory"):
        try:
            profctx.configure(steps=[1], ranks=[0], rank=0, save_path=sys.argv[1], tool=tool)
        except profctx.ConfigError as exc:
            print(tool, exc.field, "CPU-only" in str(exc))
    print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "nvtx")))
"""


def test_a_cpu_only_torch_is_refused_for_cuda_tools_without_importing_it(tmp_path: Path) -> None:
    import torch

    if torch.backends.cuda.is_built():
        pytest.skip("needs a CPU-only torch build")
    done = _run(CPU_ONLY_REFUSAL, str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:3] == ["nsys tool True", "torch_memory tool True", "[]"]


COMPILER_IMPORT = """
    import sys, threading, profctx
    profctx.configure(steps=[1], save_path=sys.argv[1], tool="torch")
    # The warm-up is over when configure() returns, and nothing of profctx imports in the background.
    assert "torch._dynamo" in sys.modules, "warm-up not done in configure()"
    assert not [t.name for t in threading.enumerate() if t.name.startswith("profctx")], threading.enumerate()
    import torch._inductor  # what `import vllm` does first
    print("imported")
"""


@pytest.mark.slow
def test_the_warm_up_never_races_the_programs_own_imports(tmp_path: Path) -> None:
    done = _run(COMPILER_IMPORT, str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "imported"


BUSY_THREAD = """
    import sys, threading, profctx, torch
    profctx.configure(steps=[1], save_path=sys.argv[1], compress=False)
    ready = threading.Event()
    def worker():
        with profctx.profile_step(1, role="background"):
            while True:  # inside torch's C++ code most of the time when the program ends
                torch.ones(64).sum()
                ready.set()
    threading.Thread(target=worker, daemon=True).start()
    ready.wait(60)
    print("exiting", flush=True)
"""


@pytest.mark.slow
def test_exit_with_a_capture_live_on_a_busy_thread_is_clean_and_recorded(tmp_path: Path) -> None:
    done = _run(BUSY_THREAD, str(tmp_path), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "exiting"  # flushed before the process ended
    (record,) = read(tmp_path)
    assert record["status"] == "interrupted"
    assert any("thread that started it" in n for n in record["notes"])


def test_back_to_back_captures_keep_one_writer_thread(tmp_path: Path) -> None:
    import threading

    import profctx

    profctx.configure(steps="1:40", tool="recording", save_path=str(tmp_path), warmup=False, exit_hooks=False)
    writers: set[threading.Thread] = set()  # the objects, held: a new thread may reuse an ended one's ident
    for step in range(1, 40):
        with profctx.profile_step(step):
            pass
        writers.update(t for t in threading.enumerate() if t.name == "profctx-writer")
    profctx.flush()
    # Starting a thread per capture costs the training thread about 0.2 ms a step: the idle writer waits for more.
    assert len(writers) == 1
    assert len([r for r in read(tmp_path) if r["status"] == "ok"]) == 39
