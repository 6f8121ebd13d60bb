"""Attacks on the files profctx writes: planted links and files never redirect a write; leftovers go; space is freed.

Where the suite runs as root and the account ``nobody`` exists, the attacker is ``nobody``: it owns the
shared folder and plants its links from a forked child that dropped to that account (so the kernel's
``protected_symlinks`` does not apply: the links are in a folder the attacker owns). Elsewhere the same
links are planted from the same account. The victim is a file (or folder) the attacker cannot write.
"""

from __future__ import annotations

import errno
import gzip
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from attacker import ATTACKER, plant, shared_folder

import profctx
from profctx.cli import main
from profctx.core._layout import safe
from profctx.process._owner import OWNER
from profctx.records._manifest import read
from profctx.util._identity import hostname

torch = pytest.importorskip("torch")

VICTIM = b"victim: never written by profctx\n"
HOST = safe(hostname())




def attacker_reads(path: Path) -> bool:
    """Whether the attacker's account can read ``path``."""
    assert ATTACKER is not None
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            os.setgroups([])
            os.setgid(ATTACKER[1])
            os.setuid(ATTACKER[0])
            path.read_bytes()
            code = 0
        except PermissionError:
            code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, 1)
    return code == 0


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder the attacker owns (world-writable), reachable by the attacker's account."""
    # In memory where there is such a file system: thousands of links are planted and removed.
    with shared_folder("profctx-shared-", in_memory=True) as folder:
        yield folder


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file of this account, mode 0600, in a folder the attacker cannot enter."""
    path = tmp_path / "victim.txt"
    path.write_bytes(VICTIM)
    path.chmod(0o600)
    return path


def loop(steps: range, ops: int = 20) -> None:
    x = torch.ones(4)
    for step in steps:
        with profctx.profile_step(step):
            for _ in range(ops):
                x = x + 1


def leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(".profctx-tmp-") or p.name.endswith(".tmp")]


def trace_events(path: Path) -> list[Any]:
    """Return the events of a trace file, which must be a regular file (not a link)."""
    assert path.is_file() and not path.is_symlink(), path
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as fh:
        events: list[Any] = json.load(fh)["traceEvents"]
    return events


# -- planted links --------------------------------------------------------------------------------


@pytest.mark.parametrize("planted", ["shard", "index"])
def test_links_planted_at_the_shard_and_its_index_are_never_followed(shared: Path, victim: Path, planted: str) -> None:
    # The shard's name is predictable: run id (PROFCTX_RUN_ID), rank, host and pid (from /proc).
    shard = shared / ".profctx" / f"shared-run.rank0-of-1.{HOST}.{os.getpid()}.jsonl"
    index = Path(f"{shard}.index")
    ops: list[tuple[str, ...]] = [("mkdir", str(shard.parent)), ("link", str(victim), str(index))]
    if planted == "shard":
        ops.append(("link", str(victim), str(shard)))
    plant(ops)
    profctx.configure(steps=[1, 2], save_path=shared, run_id="shared-run")
    loop(range(1, 4))
    assert profctx.flush(30)
    profctx.reset()  # closes the shard: its index is written now
    assert victim.read_bytes() == VICTIM
    records = read(shared)
    assert [(r["step"], r["status"]) for r in records] == [(1, "ok"), (2, "ok")]
    (written,) = [p for p in shard.parent.glob("shared-run.*.jsonl") if not p.is_symlink()]
    assert written.is_file()
    if planted == "shard":  # the process's records went to a fresh shard of its own
        assert written.name.startswith(shard.name.removesuffix(".jsonl") + ".")
    else:  # the link at the index's name was replaced by the index
        assert written == shard and index.is_file() and not index.is_symlink()
    assert (shard.parent / (written.name + ".index")).read_bytes().startswith(b'{"index":')
    assert main(["ls", str(shared)]) == 0


def test_links_planted_in_a_step_folder_the_attacker_made_first(
    shared: Path, victim: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The attacker makes step 1's folder and plants links at every name a trace could take (the file names
    # carry the capture's start in ms), and at the temporary names earlier versions used; step 2's folder is
    # a link to a folder of the victim's. The names are made certain, not raced against the clock (which a
    # loaded machine loses): the run's span numbers are pinned an hour ahead (``Spans`` hands out one more
    # than the last span while the clock is behind it), so step 1's trace takes span ``start`` exactly.
    folder = shared / "step000001" / "step"
    victim_folder = tmp_path / "victim-folder"
    victim_folder.mkdir()
    stem = f"rank0-of-1_{HOST}_{os.getpid()}"
    with caplog.at_level(logging.WARNING, logger="profctx"):
        profctx.configure(steps=[1, 2], save_path=shared, warmup=False)
        runtime = OWNER.runtime
        assert runtime is not None
        start = time.time_ns() // 1_000_000 + 3_600_000
        runtime._spans._last = start - 1
        plant([("mkdir", str(folder)), ("link", str(victim_folder), str(shared / "step000002"))])
        ops: list[tuple[str, ...]] = []
        for ms in range(start, start + 50):  # the span and a few after it (an extra span taken counts too)
            final = f"{stem}.{ms}.pt.trace.json"
            ops += [("link", str(victim), str(folder / f"{final}.gz")),
                    ("link", str(victim), str(folder / f".{final}.tmp")),
                    ("link", str(victim), str(folder / f".{final}.gz.tmp"))]
        plant(ops)
        planted = {op[2].rpartition("/")[2] for op in ops}
        loop(range(1, 3))
        assert profctx.flush(30)
    assert victim.read_bytes() == VICTIM
    assert list(victim_folder.iterdir()) == []
    records = {r["step"]: r for r in read(shared)}
    assert records[1]["status"] == "ok"
    (entry,) = records[1]["files"]
    trace = shared / entry["path"]
    assert trace.parent == folder
    assert trace.name in planted, "the trace took a name where a link was planted"
    assert trace.name == f"{stem}.{start}.pt.trace.json.gz"  # the pinned span: the first name planted
    assert any(e.get("name") == "aten::add" for e in trace_events(trace))
    assert records[2]["status"] == "failed" and "link" in records[2]["error"]
    assert not [p for p in folder.iterdir() if p.name.startswith(".profctx-tmp-")]
    if ATTACKER is not None:
        assert any("belongs to another account" in r.getMessage() for r in caplog.records)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run: two steps of a real torch capture (built once for the module)."""
    folder = tmp_path_factory.mktemp("run") / "run"
    profctx.configure(steps=[1, 2], save_path=folder, run_id="attacked")
    loop(range(1, 3))
    assert profctx.flush(30)
    profctx.reset()
    return folder


def test_report_replaces_links_planted_at_its_names(shared: Path, victim: Path, run_folder: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    run = shared / "run"
    shutil.copytree(run_folder, run)
    if ATTACKER is not None:
        os.chown(run, *ATTACKER)
    plant([("link", str(victim), str(run / ".report.html.tmp")), ("link", str(victim), str(run / "report.html"))])
    killed = _temporary(run, dead_pid())  # what a report killed while writing left
    assert main(["report", str(run)]) == 0
    assert not killed.exists()
    assert victim.read_bytes() == VICTIM
    page = run / "report.html"
    assert page.is_file() and not page.is_symlink() and "</html>" in page.read_text()
    assert not [p for p in run.iterdir() if p.name.startswith(".profctx-tmp-")]


def test_merge_replaces_links_planted_at_its_names(shared: Path, victim: Path, run_folder: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # The default output's name is learned from a merge of a copy; then planted in the attacked run.
    copy = tmp_path / "copy"
    shutil.copytree(run_folder, copy)
    assert main(["merge", str(copy)]) == 0
    (name,) = [p.name for p in (copy / "merged").iterdir()]
    run = shared / "run"
    shutil.copytree(run_folder, run)
    if ATTACKER is not None:
        os.chown(run, *ATTACKER)
    merged = run / "merged"
    plant([("mkdir", str(merged)), ("link", str(victim), str(merged / name)),
           ("link", str(victim), str(merged / f".{name}.tmp"))])
    assert main(["merge", str(run)]) == 0
    assert victim.read_bytes() == VICTIM
    events = trace_events(merged / name)
    assert any(e.get("name") == "aten::add" for e in events)
    assert not [p for p in merged.iterdir() if p.name.startswith(".profctx-tmp-")]


def test_merge_refuses_a_link_where_its_folder_belongs(shared: Path, run_folder: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run = shared / "run"
    shutil.copytree(run_folder, run)
    if ATTACKER is not None:
        os.chown(run, *ATTACKER)
    victim_folder = tmp_path / "victim-folder"
    victim_folder.mkdir()
    plant([("link", str(victim_folder), str(run / "merged"))])
    assert main(["merge", str(run)]) == 2
    assert "merged" in capsys.readouterr().err
    assert list(victim_folder.iterdir()) == []


def test_the_ray_probe_replaces_a_link_planted_at_its_name(shared: Path, victim: Path) -> None:
    pytest.importorskip("ray")
    from profctx.ray import _probe

    probe = shared / ".profctx" / "probe-shared-run"
    plant([("mkdir", str(probe.parent)), ("link", str(victim), str(probe))])

    class Runtime:
        save_path = shared
        run_id = "shared-run"

    assert _probe(Runtime()) == probe
    assert victim.read_bytes() == VICTIM
    assert probe.is_file() and not probe.is_symlink() and b"shares the driver's save_path" in probe.read_bytes()


@pytest.mark.skipif(ATTACKER is None, reason="needs root and a second account to try reading")
def test_private_keeps_traces_from_other_accounts(shared: Path) -> None:
    save = shared / "mine"
    profctx.configure(steps=[1], save_path=save)
    loop(range(1, 2))
    assert profctx.flush(30)
    (record,) = read(save)
    trace = save / record["files"][0]["path"]
    assert attacker_reads(trace)  # the umask's modes: readable by every account
    profctx.configure(steps=[2], save_path=save, private=True)
    assert save.stat().st_mode & 0o777 == 0o700
    loop(range(2, 3))
    assert profctx.flush(30)
    assert not attacker_reads(trace)
    assert all(r["status"] == "ok" for r in read(save))
    theirs = shared / "theirs"
    plant([("mkdir", str(theirs))])
    with pytest.raises(profctx.ConfigError, match="private"):
        profctx.configure(steps=[1], save_path=theirs, private=True)
    with pytest.raises(profctx.ConfigError, match="private"):
        profctx.configure(steps=[1], save_path=save, private="yes please")


# -- leftovers --------------------------------------------------------------------------------------


def _temporary(folder: Path, pid: int, host: str = HOST, *, tree: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f".profctx-tmp-{pid}-{os.urandom(8).hex()}-{host}.tmp"
    if tree:
        (path / "inner").mkdir(parents=True)
        (path / "inner" / "trace").write_bytes(b"{")
    else:
        path.write_bytes(b"{")
    return path


def dead_pid() -> int:
    """Return the pid of a process of this host that has ended."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def test_stale_temporaries_are_removed_by_the_next_writer(tmp_path: Path) -> None:
    dead = dead_pid()
    dead_files = [
        _temporary(tmp_path / "step000001" / "step", dead),
        _temporary(tmp_path / "step000001" / "step", dead, tree=True),  # torch's working folder
        _temporary(tmp_path / ".profctx", dead),
        _temporary(tmp_path / "step000007" / "train" / "actor", dead),  # a step not captured again
        _temporary(tmp_path / "merged", dead),
    ]
    old_elsewhere = _temporary(tmp_path / "step000002" / "step", 1, "another-host")
    os.utime(old_elsewhere, (time.time() - 2 * 86400,) * 2)
    kept = [
        _temporary(tmp_path / "step000001" / "step", os.getpid()),  # a live writer's
        _temporary(tmp_path / "step000002" / "step", dead, "another-host"),  # recent, on a host not this one
    ]
    users = tmp_path / "step000001" / "step" / ".notes.tmp"
    users.write_text("not profctx's")
    profctx.configure(steps=[1], save_path=tmp_path)
    loop(range(1, 2))
    assert profctx.flush(30)
    assert [p for p in [*dead_files, old_elsewhere] if os.path.lexists(p)] == []
    assert all(p.exists() for p in [*kept, users])
    assert [r["status"] for r in read(tmp_path)] == ["ok"]


KILLED = """
import sys, profctx, torch
profctx.configure(steps="1:100000", save_path=sys.argv[1], tool_options={"compress_level": 9})
x = torch.ones(4)
step = 0
while True:
    step += 1
    with profctx.profile_step(step):
        for _ in range(3000):
            x = x + 1
"""


@pytest.mark.slow
def test_a_writer_killed_mid_write_leaves_nothing_once_the_next_one_wrote(tmp_path: Path) -> None:
    save = tmp_path / "profiles"
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(KILLED))
    left: list[Path] = []
    for _attempt in range(3):  # killed while a temporary exists (a write can end between look and kill)
        proc = subprocess.Popen([sys.executable, str(script), str(save)], stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not leftovers(save):
                time.sleep(0.002)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
        left = leftovers(save)
        if left:
            break
    assert left, "the writer was never caught mid-write"
    profctx.configure(steps=[1], save_path=save)
    loop(range(1, 2))
    assert profctx.flush(30)
    assert leftovers(save) == []


# -- a full disk --------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MB tmpfs (root with mount rights only: skipped elsewhere)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small file system needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        profctx.reset()
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _held(folder: Path) -> int:
    """Return the bytes of disk the files this process holds open under ``folder``, and no name reaches, take."""
    held = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(folder)) and target.endswith(" (deleted)"):
                held += os.stat(f"/proc/self/fd/{fd}").st_blocks * 512
        except OSError:
            continue
    return held


def test_a_full_disk_fails_the_capture_and_holds_no_space(small_disk: Path) -> None:
    save = small_disk / "profiles"
    profctx.configure(steps=[1, 2], save_path=save)
    ballast = small_disk / "ballast"
    free = os.statvfs(small_disk)
    with open(ballast, "wb") as fh:
        fh.write(b"\0" * (free.f_bavail * free.f_frsize - 192 * 1024))
    loop(range(1, 2), ops=1000)  # about 1.3 MB of trace before compression: the disk fills
    assert profctx.flush(30)
    assert _held(small_disk) == 0
    assert leftovers(save) == []
    ballast.unlink()
    stats = os.statvfs(small_disk)
    used = (stats.f_blocks - stats.f_bfree) * stats.f_frsize
    visible = sum(p.stat().st_size for p in small_disk.rglob("*") if p.is_file())
    assert used - visible < 64 * 1024, f"{used} bytes used, {visible} visible"
    loop(range(2, 3))
    assert profctx.flush(30)
    profctx.reset()
    records = {r["step"]: r for r in read(save)}
    assert records[1]["status"] == "failed" and os.strerror(errno.ENOSPC) in records[1]["error"]
    assert records[2]["status"] == "ok"
