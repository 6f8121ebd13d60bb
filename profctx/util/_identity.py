"""Who this process is: rank, world size, host, pid, and the run its launcher started it in."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, final

#: The longest run id (it becomes part of file names).
RUN_ID_MAX: Final = 64
#: Random bytes in a capture id (:func:`capture_id`): 48 bits, 12 hex digits.
CAPTURE_ID_BYTES: Final = 6


def capture_id() -> str:
    """Return a new capture id: 12 lowercase hex digits, random, for every record a capture (or a failed call) writes.

    Ids name captures within a run's manifest (records are keyed by run, host, pid and capture);
    48 random bits make two alike in one run unlikely (about 1 in 10^7 at 10^4 captures, birthday bound).
    """
    return os.urandom(CAPTURE_ID_BYTES).hex()


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


def launcher_run_id(environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """Return ``(run id, launcher)`` shared by every process the launcher started, or ``None``.

    Read from ``environ`` (default ``os.environ``), first match wins:

    1. ``TORCHELASTIC_RUN_ID`` (torchrun's ``--rdzv-id``; a fresh UUID per single-node launch
       and with ``--standalone``): ``torchrun-<id>``.
    2. Slurm, inside an ``srun`` step: ``slurm-<SLURM_JOB_ID>.<SLURM_STEP_ID>`` (two steps of one
       job are two runs).
    3. PMIx (Open MPI 5, PRRTE, ``srun --mpi=pmix``): ``mpi-<PMIX_NAMESPACE>``; Open MPI 4's
       ``OMPI_MCA_ess_base_jobid``: ``mpi-<jobid>``.
    4. torchrun's default ``--rdzv-id`` ``none`` (static rendezvous, e.g. ``--master-port`` given),
       and DeepSpeed's launcher (``CROSS_RANK``/``LOCAL_SIZE``), which name no launch: the
       launcher process this process was started by (host, parent pid and its start time),
       so one launch on one node is one run.
    5. Lightning's script launcher (``Trainer(strategy="ddp")`` started as ``python train.py``):
       the script is local rank 0 and starts itself again for local ranks 1.. with
       ``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` set and no
       ``RANK``; it sets them in its own environment first. So the launch is local rank 0's
       process: this process for ``LOCAL_RANK=0``, its parent for the others (host, pid and start
       time, with ``MASTER_PORT``): ``lightning-<hash>``. Rank 0 sees these variables only once
       ``fit()`` started the others; the runtime looks again then (see
       :class:`profctx.process._runtime.Runtime`). One id per node: on several nodes, give
       ``PROFCTX_RUN_ID`` or launch with torchrun or Slurm.

    The id is made file-name safe (letters, digits, ``.``, ``_``, ``-``; at most
    :data:`RUN_ID_MAX` characters, a long one ends in a hash of the whole).
    """
    env = os.environ if environ is None else environ
    elastic = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if elastic and elastic.lower() != "none":
        return run_id_of("torchrun", elastic), "torchrun"
    job = env.get("SLURM_JOB_ID", "").strip() or env.get("SLURM_JOBID", "").strip()
    step = env.get("SLURM_STEP_ID", "").strip() or env.get("SLURM_STEPID", "").strip()
    if job and step:
        return run_id_of("slurm", f"{job}.{step}"), "slurm"
    namespace = env.get("PMIX_NAMESPACE", "").strip()
    if namespace:
        return run_id_of("mpi", namespace), "mpi"
    ompi_job = env.get("OMPI_MCA_ess_base_jobid", "").strip()
    if ompi_job and env.get("OMPI_COMM_WORLD_SIZE", "").strip():
        return run_id_of("mpi", ompi_job), "mpi"
    if elastic:
        return run_id_of("torchrun", _parent_launch()), "torchrun"
    if env.get("CROSS_RANK", "").strip() and env.get("LOCAL_SIZE", "").strip() and env.get("RANK", "").strip():
        return run_id_of("deepspeed", _parent_launch()), "deepspeed"
    local = lightning_local_rank(env)
    if local is not None:
        launch = os.getpid() if local == 0 else os.getppid()
        return run_id_of("lightning", _launch_of(launch, env.get("MASTER_PORT", "").strip())), "lightning"
    return None


def lightning_local_rank(environ: Mapping[str, str]) -> int | None:
    """Return the local rank Lightning's script launcher gave this process (:func:`launcher_run_id`), or ``None``."""
    if environ.get("RANK", "").strip() or not all(
            environ.get(name, "").strip() for name in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK")):
        return None
    try:
        local, world = int(environ.get("LOCAL_RANK", "")), int(environ.get("WORLD_SIZE", ""))
    except ValueError:
        return None
    return local if 0 <= local < world and world > 1 else None


def run_id_of(launcher: str, raw: str) -> str:
    """Return ``<launcher>-<raw>`` made file-name safe and at most :data:`RUN_ID_MAX` characters."""
    clean = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "-" for c in raw).strip("-.")
    text = f"{launcher}-{clean or 'x'}"
    if len(text) <= RUN_ID_MAX and clean == raw:
        return text
    # Changed or cut: a hash of the raw id keeps two ids that clean to the same text apart.
    digest = hashlib.sha1(raw.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{text[: RUN_ID_MAX - len(digest) - 1]}-{digest}"


def _parent_launch() -> str:
    """Return a short id of the process that started this one, unique per launch on this host."""
    return _launch_of(os.getppid())


def _launch_of(pid: int, extra: str = "") -> str:
    """Return a short id of process ``pid``, unique on this host (its start time tells a reused pid apart)."""
    started = ""
    try:  # Linux: the process's start time (clock ticks since boot)
        with open(f"/proc/{pid}/stat", "rb") as handle:
            started = handle.read().rsplit(b")", 1)[-1].split()[19].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        pass
    tail = f":{extra}" if extra else ""
    return hashlib.sha1(f"{hostname()}:{pid}:{started}{tail}".encode()).hexdigest()[:12]
