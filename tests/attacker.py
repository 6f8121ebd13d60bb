"""Another local account for the attack tests: ``nobody`` when the suite runs as root, else this account."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import profctx


def _attacker() -> tuple[int, int] | None:
    """Return the uid and gid of ``nobody`` when this runs as root, else ``None`` (same account)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


ATTACKER = _attacker()


def plant(ops: list[tuple[str, ...]]) -> None:
    """Do ``ops`` as the attacker: ``("mkdir", path)``, ``("link", target, path)``, ``("rename", a, b)``,
    ``("file", path)``."""
    def run() -> None:
        for op in ops:
            if op[0] == "mkdir":
                os.makedirs(op[1], mode=0o777, exist_ok=True)
                os.chmod(op[1], 0o777)
            elif op[0] == "link":
                os.symlink(op[1], op[2])
            elif op[0] == "rename":
                os.rename(op[1], op[2])
            else:
                Path(op[1]).write_bytes(b"planted\n")

    if ATTACKER is None:
        run()
        return
    pid = os.fork()
    if pid == 0:  # the child drops to the attacker's account, plants, and leaves without cleanup
        code = 1
        try:
            os.setgroups([])
            os.setgid(ATTACKER[1])
            os.setuid(ATTACKER[0])
            run()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "planting failed"


@contextlib.contextmanager
def shared_folder(prefix: str, *, in_memory: bool = False) -> Iterator[Path]:
    """Yield a folder the attacker owns (world-writable), in a fresh parent both accounts can enter."""
    memory = "/dev/shm" if in_memory and os.access("/dev/shm", os.W_OK) else None
    base = Path(tempfile.mkdtemp(prefix=prefix, dir=memory))
    base.chmod(0o755)
    folder = base / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    if ATTACKER is not None:
        os.chown(folder, *ATTACKER)
    try:
        yield folder
    finally:
        profctx.reset()  # the manifest is closed before its folder goes
        shutil.rmtree(base, ignore_errors=True)
