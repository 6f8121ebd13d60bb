"""Who this process is: rank, world size, host, pid."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import final


@final
@dataclass(frozen=True)
class Identity:
    """This process's place in the job. ``source`` says where the rank came from."""

    rank: int
    world_size: int
    host: str
    pid: int
    source: str
    #: The worker group this process belongs to (``profctx.ray.group``); ``None``: the driver or no group.
    group: str | None = None

    @property
    def tag(self) -> str:
        """The file-name tag ``rank{R}-of-{W}``, with the group in front when there is one (``actor-rank0-of-2``)."""
        tag = f"rank{self.rank}-of-{self.world_size}"
        return tag if self.group is None else f"{self.group}-{tag}"


def resolve(rank: int | None, world_size: int | None, group: str | None = None) -> Identity:
    """Return the identity: explicit values, else ``RANK``/``WORLD_SIZE``, else torch.distributed, else 0/1."""
    host = hostname()
    pid = os.getpid()
    if rank is not None:
        return Identity(rank, world_size if world_size is not None else max(rank + 1, _env_int("WORLD_SIZE") or 1),
                        host, pid, "config", group)
    env_rank = _env_int("RANK")
    if env_rank is not None:
        env_world = world_size if world_size is not None else _env_int("WORLD_SIZE")
        return Identity(env_rank, env_world if env_world is not None else env_rank + 1, host, pid, "env", group)
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                return Identity(dist.get_rank(), world_size or dist.get_world_size(), host, pid, "torch.distributed",
                                group)
        except Exception:  # noqa: BLE001 - a broken process group must not break profiling decisions
            pass
    return Identity(0, world_size if world_size is not None else 1, host, pid, "default", group)


def hostname() -> str:
    """Return the host name (``socket.gethostname()``; on POSIX read from ``uname``, sparing the socket import)."""
    uname = getattr(os, "uname", None)
    if uname is not None:
        return str(uname().nodename)
    import socket

    return socket.gethostname()


def detectable() -> bool:
    """Return whether :func:`resolve` could now find a rank other than the default (RANK set, or a process group)."""
    if os.environ.get("RANK", "").strip():
        return True
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return False
    try:
        return bool(dist.is_available() and dist.is_initialized())
    except Exception:  # noqa: BLE001 - a broken process group: resolve() decides
        return True


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value >= 0 else None
