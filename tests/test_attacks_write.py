"""Attacks on what profctx writes, renames and deletes inside a folder another account controls.

As in ``tests/test_safe_files.py``: where the suite runs as root and ``nobody`` exists, the shared
save folder belongs to ``nobody`` and every hostile entry is made by a forked child that dropped to
that account; elsewhere the same entries are made from this account. The victim is a folder of
this account (mode 0700) the attacker cannot enter. Each case checks that nothing of the victim was
deleted or written, and what the user is told.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from attacker import plant, shared_folder

import profctx
from profctx.backends import CaptureSpec
from profctx.cli import main
from profctx.util._fs import walk
from profctx.util._identity import Identity, hostname

torch = pytest.importorskip("torch")




@pytest.fixture
def shared() -> Iterator[Path]:
    """A save folder the attacker owns (world-writable)."""
    with shared_folder("profctx-attack-") as folder:
        yield folder


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A folder of this account, mode 0700, holding one old 0600 ``.json`` file and an empty ``step`` folder."""
    folder = tmp_path / "victim"
    folder.mkdir(mode=0o700)
    (folder / "step").mkdir(mode=0o700)
    keep = folder / "keep.json"
    keep.write_text("{}")
    keep.chmod(0o600)
    old = time.time() - 7200
    os.utime(keep, (old, old))
    return folder


def _victim_untouched(victim: Path) -> None:
    assert sorted(p.relative_to(victim).as_posix() for p in victim.rglob("*")) == ["keep.json", "step"]


def _publish_progress(save: Path) -> None:
    """Write a live process's progress file (this process, on demand), as a run would, so trigger goes on."""
    from profctx.process._ondemand import LIVE, LIVE_VERSION, live_name

    live = save / ".profctx" / LIVE
    live.mkdir(parents=True, exist_ok=True)
    data = {"profctx_live": LIVE_VERSION, "run": "r1", "host": hostname(), "pid": os.getpid(), "uid": os.getuid(),
            "rank": 0, "world_size": 1, "group": None, "step": 10, "period": 0.5, "time": time.time(),
            "on_demand": True}
    (live / live_name("r1", hostname(), os.getpid())).write_text(json.dumps(data))


def test_trigger_deletes_nothing_through_a_link_at_requests(shared: Path, victim: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    plant([("mkdir", str(shared / ".profctx")), ("link", str(victim), str(shared / ".profctx" / "requests"))])
    _publish_progress(shared)
    code = main(["trigger", str(shared), "--steps", "1"])
    err = capsys.readouterr().err
    _victim_untouched(victim)  # today's code removed keep.json (this account's, older than an hour)
    assert code == 2
    assert "requests: not used" in err and "never followed" in err and "Traceback" not in err


def _loop(steps: range, inside: dict[int, object] | None = None) -> None:
    x = torch.ones(4)
    for step in steps:
        with profctx.profile_step(step):
            for _ in range(10):
                x = x + 1
            if inside and step in inside:
                inside[step]()  # type: ignore[operator]


def test_a_step_folder_swapped_for_a_link_during_the_capture_redirects_nothing(shared: Path, victim: Path) -> None:
    profctx.configure(steps="2", save_path=shared, compress=False, exit_hooks=False, warmup=False, timeline=False)
    step = shared / "step000002"

    def swap() -> None:  # the capture started (its folder exists): rename it away, put a link in its place
        plant([("rename", str(step), str(shared / "moved")), ("link", str(victim), str(step))])

    _loop(range(1, 4), {2: swap})
    assert profctx.flush(60)
    _victim_untouched(victim)  # today's code wrote the trace into victim/step and recorded it ok
    from profctx.records._manifest import read

    [record] = [r for r in read(shared) if r["step"] == 2]
    assert record["status"] == "failed"
    assert "renamed or replaced" in record["error"]
    assert list((shared / "moved" / "step").iterdir()) == []  # written into the held folder, then removed


def test_merge_hta_writes_nothing_through_a_link_under_merged(shared: Path, victim: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    profctx.configure(steps="1", save_path=shared, run_id="r7", compress=False, exit_hooks=False, warmup=False,
                      timeline=False)
    _loop(range(0, 2))
    assert profctx.flush(60)
    profctx.reset()
    plant([("mkdir", str(shared / "merged")), ("link", str(victim / "step"), str(shared / "merged" / "r7-all.hta"))])
    code = main(["merge", str(shared), "--hta"])
    err = capsys.readouterr().err
    _victim_untouched(victim)  # today's code wrote rank0.json.gz into victim/step (an empty folder)
    assert code == 2 and "is a link (never followed)" in err


def _spec(folder: Path) -> CaptureSpec:
    at = walk(folder.parent, folder.name)
    identity = Identity(rank=0, world_size=1, host=hostname(), pid=os.getpid(), source="config")
    return CaptureSpec(capture_id="c1", steps=(1,), roles=(), folder=at.path, stem="rank0", identity=identity,
                       run_id="r1", contents=(), options={}, compress=False, metadata={}, at=at)


@pytest.mark.parametrize("backend", ["torch_memory", "nsys"])
def test_a_backend_writes_into_the_folder_it_was_given_even_once_it_was_swapped(shared: Path, victim: Path,
                                                                                  backend: str) -> None:
    step = shared / "step000001"
    spec = _spec(step / "step")
    plant([("rename", str(step), str(shared / "moved")), ("link", str(victim), str(step))])
    if backend == "torch_memory":
        from profctx.backends.torch_memory import _write

        [path] = _write(spec, {"segments": [], "device_traces": []}, 1)
    else:
        from profctx.backends.nsys import _write_sidecar

        [path] = _write_sidecar(spec, {"range": 1})
    assert spec.at is not None
    spec.at.close()
    _victim_untouched(victim)  # today's code reopened the folder by path and wrote into victim/step
    assert (shared / "moved" / "step" / path.name).is_file()


def test_the_progress_file_goes_into_the_folder_walked_to(shared: Path, victim: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # The swap lands between the walk to .profctx/live and the write (today: make_folders, then a
    # write by path that followed the link put at .profctx meanwhile).
    from profctx.process import _ondemand

    real = _ondemand.walk
    once = threading.Lock()  # the poll thread and the poll below both walk: one swap only

    def walk_then_swap(root: Path, relative: str = "", **kw: bool) -> object:
        held = real(root, relative, **kw)
        if str(relative).endswith("/live") and once.acquire(blocking=False):
            plant([("rename", str(shared / ".profctx"), str(shared / "moved")),
                   ("link", str(victim), str(shared / ".profctx"))])
        return held

    plant([("mkdir", str(shared / ".profctx"))])
    (victim / "live").mkdir(mode=0o700)  # where today's code wrote it: the link's target/live
    monkeypatch.setattr(_ondemand, "walk", walk_then_swap)
    profctx.configure(on_demand=True, save_path=shared, tool="noop", exit_hooks=False, warmup=False, timeline=False)
    with profctx.profile_step(1):
        pass
    moved = shared / "moved" / "live"
    deadline = time.monotonic() + 60  # a bound only: the poll thread publishes within half a second
    while not (moved.is_dir() and any(moved.iterdir())):
        assert time.monotonic() < deadline, "the poll thread published no progress"
        time.sleep(0.01)
    profctx.reset()
    # Today's code reopened .profctx/live by path after its folder check: through the link, into victim/live.
    assert sorted(p.relative_to(victim).as_posix() for p in victim.rglob("*")) == ["keep.json", "live", "step"]
