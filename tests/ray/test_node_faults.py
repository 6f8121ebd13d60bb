"""A worker group across two Ray nodes on this machine, node B without the driver's file system, and node B dying.

Node B's raylet runs in a private mount namespace (``unshare -m``) where the run folder is an empty
tmpfs of its own: its workers cannot see the driver's files, so the driver copies theirs through
Ray, as on a cluster without shared storage. Needs root (or the right to make mount namespaces);
skipped elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from profctx.records import _manifest

pytest.importorskip("ray")

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


#: The cluster's processes: no authentication (every process of it is this test's) and no usage report.
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


@dataclass
class TwoNodes:
    runs: Path  # the driver's run folder; on node B the same path is a private, empty tmpfs
    node_b: subprocess.Popen[bytes]  # the leader of node B's session: every process of node B is in it
    address: str


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (a node: its ``ray start`` was the session's leader)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.getsid(int(entry)) == sid:
                    os.kill(int(entry), signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _private_mounts_work(folder: Path) -> bool:
    try:
        done = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs tmpfs {folder}"],
                              capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoNodes]:
    base = tmp_path_factory.mktemp("two-nodes")
    runs = base / "runs"
    runs.mkdir()
    if not _private_mounts_work(runs):
        pytest.skip("no private mount namespace here (needs root or CAP_SYS_ADMIN, and unshare)")
    port = _free_port()
    address = f"127.0.0.1:{port}"
    # Temp folders of their own: a cluster under the default one would be joined by others' ray.init().
    head = subprocess.Popen(["ray", "start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
                             "--resources", '{"head": 1}', f"--temp-dir={base / 'a'}", "--disable-usage-stats",
                             "--block"], start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=ENV)
    node_b = subprocess.Popen(["unshare", "-m", "sh", "-c",
                               f"mount -t tmpfs tmpfs {runs} && exec ray start --address={address} --num-cpus=1 "
                               f"--resources='{{\"node_b\": 1}}' --temp-dir={base / 'b'} --disable-usage-stats "
                               "--block"], start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=ENV)
    try:
        yield TwoNodes(runs, node_b, address)
    finally:
        for process in (node_b, head):
            _kill_session(process.pid)
            process.wait(10)


#: The driver, in a process of its own: Ray keeps its authentication mode for the life of a process,
#: and this cluster's (none: its processes are all this test's) must not reach the other test modules.
DRIVER = """
    import json, os, signal, sys, time
    import ray
    import profctx, profctx.ray as pray
    from _fault_actors import Member

    address, runs, node_b = sys.argv[1], sys.argv[2], int(sys.argv[3])
    deadline = time.monotonic() + 60
    while True:
        try:
            ray.init(address=address, logging_level="WARNING", log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}})
            break
        except Exception:
            assert time.monotonic() < deadline, "the head node did not start"
            time.sleep(0.3)
    while not any(n["Alive"] and "node_b" in n["Resources"] for n in ray.nodes()):
        assert time.monotonic() < deadline, "node B did not join"
        time.sleep(0.2)

    def kill_node_b():
        for entry in os.listdir("/proc"):  # its raylet and every worker: each in a process group of its own
            if entry.isdigit():
                try:
                    if os.getsid(int(entry)) == node_b:
                        os.kill(int(entry), signal.SIGKILL)
                except OSError:
                    pass

    profctx.configure(steps="1:9", mode="step", ranks="all", profile_driver=False, save_path=runs, tool="recording",
                      warmup=False)
    here = ray.remote(num_cpus=0, resources={"head": 0.01})(Member).remote()
    there = ray.remote(num_cpus=0, resources={"node_b": 0.01}, max_restarts=0)(Member).remote()
    grp = pray.group("actor", [here, there], control_timeout=2.0)
    for step in (1, 2):
        with profctx.profile_step(step):
            assert ray.get([here.work.remote(), there.work.remote()]) == [step, step]
    walls = []
    for step in (3, 4, 5):
        t0 = time.monotonic()
        with profctx.profile_step(step):
            if step == 3:
                kill_node_b()  # inside the step: node B holds its capture of step 3
            assert ray.get(here.work.remote()) == step
        walls.append(time.monotonic() - t0)
    flushed = pray.flush(timeout=2)
    lost = grp.members[1]
    print(json.dumps({"collect": [m.collect for m in grp.members], "walls": walls, "flushed": flushed,
                      "lost": lost.lost, "pid": lost.pid, "timeout": lost.timeout}))
    profctx.reset()
    ray.shutdown()
"""


def test_node_b_dying_mid_step_costs_one_control_timeout_and_keeps_what_was_copied(two_nodes: TwoNodes) -> None:
    runs = two_nodes.runs
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(DRIVER), two_nodes.address, str(runs),
                           str(two_nodes.node_b.pid)], capture_output=True, text=True, timeout=180, check=False,
                          env={**ENV, "PYTHONPATH": path})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["collect"] == [False, True]  # node B does not see the driver's folder: its files are copied
    walls = seen["walls"]
    # Step 3 (node B died in it) costs at most the control timeout plus 30 s, what a step's own Ray calls and
    # capture may take on a loaded machine (tens of ms on a quiet one; the cost before was Ray's 300 s wait at
    # every call). Steps 4 and 5 wait for nothing: the member is lost and not called again (the flush), which
    # is counted, not timed.
    assert walls[0] < seen["timeout"] + 30.0, walls
    assert seen["lost"] is not None and seen["flushed"] == [True, False]
    records = _manifest.read(runs)
    rows = {(r["rank"], r["steps"][0]): r for r in records if r.get("group") == "actor"}
    # Steps 1 and 2 of node B reached the driver, their files with them; step 3 died with the node.
    assert sorted(rows) == [(0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (1, 1), (1, 2)]
    for step in (1, 2):
        files = rows[(1, step)]["files"]
        assert rows[(1, step)]["status"] == "ok" and files
        assert all((runs / f["path"]).is_file() for f in files)
    (gone,) = [r for r in records if r.get("lost")]
    assert (gone["target_group"], gone["target_rank"], gone["target_pid"], gone["step"]) == ("actor", 1, seen["pid"], 3)
