"""The manifest: one JSON-lines shard per process under ``{save_path}/.profctx/``.

Each capture writes a ``started`` record, then a ``finished`` record whose ``status`` is
``ok``, ``failed``, ``skipped`` or ``interrupted`` (a skipped capture writes only the
``finished`` record). Records of one capture share its ``capture`` id; readers merge them,
later keys winning. Records are built here and nowhere else (:func:`capture_record`).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final, Literal, TypedDict

from ..core._layout import MANIFEST_DIR, safe
from ..core._vocab import Ended, RecordKind
from ..util._fs import Folder, walk
from ..util._identity import Identity, capture_id
from ..util._log import logger, warn_once

#: How a shard's name ends.
SUFFIX: Final = ".jsonl"
_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
#: Version of the record format; readers accept records of this version or lower.
VERSION: Final = 1

#: How a capture ended (``core._status``: the one vocabulary of capture states).
Status = Ended
Event = Literal["started", "finished"]
Kind = RecordKind
#: Seconds between retries after the disk filled up (records wait in memory meanwhile).
FULL_DISK_BACKOFF: Final = 1.0
#: Records kept in memory while the shard cannot be written; older ones are dropped (and counted).
PENDING_LIMIT: Final = 10_000
#: The shard grows by this many bytes between two segments of its listing index (see :mod:`profctx.records._listing`):
#: about 80 captures, a millisecond of CPU to index, and at most this much left for ``ls`` to parse after a kill.
CHECKPOINT_BYTES: Final = 64 * 1024


class FileEntry(TypedDict):
    """One file a capture produced, relative to ``save_path`` where it lies inside it."""

    path: str
    bytes: int | None


class Record(TypedDict, total=False):
    """A manifest record, as written (the envelope keys first)."""

    v: int
    run: str
    rank: int
    world_size: int
    group: str
    host: str
    pid: int
    capture: str
    seq: int
    event: Event
    kind: Kind
    steps: list[int]
    step: int
    last_step: int
    role: str | None
    backend: str
    folder: str
    status: Status
    time: float
    thread: str
    start_time: float | None
    end_time: float | None
    duration_s: float | None
    blocked_s: float | None
    write_s: float | None
    files: list[FileEntry]
    bytes: int
    ranges: int
    error: str | None
    reason: str
    notes: list[str]
    owner: dict[str, str]
    engine: str
    version: str | None
    replica: int
    #: A capture nobody planned: the on-demand or anomaly request that caused it (``process._ondemand``).
    trigger: dict[str, Any]


def capture_record(
    event: Event,
    *,
    capture: str,
    kind: Kind,
    steps: tuple[int, ...] | list[int],
    roles: tuple[str, ...] | str | None,
    backend: str,
    folder: str,
    **fields: Any,
) -> Record:
    """Return a capture's record: its identity keys, then ``fields`` (see :class:`Record`)."""
    role = "/".join(roles) if isinstance(roles, tuple) else roles
    record: dict[str, Any] = {
        "capture": capture,
        "event": event,
        "kind": kind,
        "steps": list(steps),
        "step": steps[0],
        "last_step": steps[-1],
        "role": role or None,
        "backend": backend,
        "folder": folder,
    }
    record.update(fields)
    return record  # type: ignore[return-value]


def failed_call(step: int, role: str | None, error: str, reason: str, **fields: Any) -> Record:
    """Return the record of a remote call that failed in ``step`` (no capture, no files)."""
    now = time.time()
    record: dict[str, Any] = {
        "capture": capture_id(), "event": "finished", "kind": "remote", "status": "failed",
        "steps": [step], "step": step, "last_step": step, "role": role or None,
        "time": now, "start_time": now, "end_time": now, "files": [], "bytes": 0,
        "error": error, "reason": reason,
    }
    record.update(fields)
    return record  # type: ignore[return-value]


def file_entries(paths: Any, save_path: Path) -> list[FileEntry]:
    """Return the entries of ``paths`` (sizes read now; ``None`` when a file is gone)."""
    entries: list[FileEntry] = []
    for path in paths:
        path = Path(path)
        try:
            size: int | None = path.stat().st_size
        except OSError:
            size = None
        try:
            shown = path.relative_to(save_path).as_posix()
        except ValueError:
            shown = str(path)
        entries.append({"path": shown, "bytes": size})
    return entries


def create_shard(name: str, folder: Folder) -> int:
    """Create the shard ``name`` in the held ``folder`` exclusively (never through a link) for appending.

    Return its descriptor. Raise ``FileExistsError`` when anything is there already: a shard is
    never reopened by name.
    """
    return os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o666,
                   dir_fd=folder.fd)


class ManifestWriter:
    """Append records to this process's shard. Thread-safe; never raises on I/O errors.

    A record is one ``write`` of one whole line; a short write (disk full) is cut back, so no
    line is ever left half-written. While the disk is full, records wait in memory and are
    written, in order, once space returns (retried at most every :data:`FULL_DISK_BACKOFF`
    seconds). If the shard or its folder is deleted, the next write recreates them (warned once).
    """

    def __init__(self, save_path: Path, run_id: str, identity: Identity,
                 selected: tuple[int, ...] | str | None = None) -> None:
        self.save_path = save_path
        self.run_id = run_id
        self.identity = identity
        #: The ranks this process's configuration profiles (``"all"``), written in each record: readers
        #: tell a rank that was not selected from one whose records are missing.
        self.selected = list(selected) if isinstance(selected, tuple) else selected
        name = f"{safe(run_id)}.{identity.tag}.{safe(identity.host)}.{identity.pid}{SUFFIX}"
        self.path = save_path / MANIFEST_DIR / name
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pending: deque[bytes] = deque()
        self._retry_at = 0.0
        self.dropped = 0
        self.failed: str | None = None
        # The listing index kept as the shard grows (a profctx.records._listing.IndexBuilder, made at the
        # first checkpoint: the reader and json are not imported before); False once it stopped.
        self._index: Any = None
        self._end = 0  # where the last record written ends
        self._indexed = 0  # how far the index covers the shard

    def envelope(self, record: Mapping[str, Any]) -> Record:
        """Return ``record`` with the version, run, rank, world size, host and pid added in front."""
        full: dict[str, Any] = {
            "v": VERSION,
            "run": self.run_id,
            "rank": self.identity.rank,
            "world_size": self.identity.world_size,
            "host": self.identity.host,
            "pid": self.identity.pid,
        }
        if self.identity.group is not None:
            full["group"] = self.identity.group
        if self.selected is not None:
            full["selected"] = self.selected
        full.update(record)
        return full  # type: ignore[return-value]

    def write(self, record: Mapping[str, Any]) -> bool:
        """Append ``record`` as one JSON line (:meth:`envelope` it first); return whether it is on disk."""
        import json  # here, not at import profctx (most processes write no manifest)

        line = (json.dumps(record, default=str, separators=(",", ":")) + "\n").encode()
        with self._lock:
            self._pending.append(line)
            if len(self._pending) > PENDING_LIMIT:
                self._pending.popleft()
                self.dropped += 1
            if not self._drain():
                return False
            if self._end - self._indexed >= CHECKPOINT_BYTES:
                self._checkpoint()
            return True

    def _checkpoint(self) -> None:
        """Append a segment to the shard's listing index (see :mod:`profctx.records._listing`); never raises."""
        index = self._index
        if index is False:
            return
        try:
            if index is None:
                from ._listing import IndexBuilder  # the reader and json: not at import profctx

                index = self._index = IndexBuilder(self.path)
            if index.checkpoint():
                self._indexed = index.covered
                return
        except Exception as exc:  # noqa: BLE001 - the index is a cache: it never fails a write
            warn_once("listing-index", "profctx: could not write the listing index of %s: %s", self.path, exc)
        self._index = False

    def _drain(self) -> bool:
        if self._retry_at and time.monotonic() < self._retry_at:
            return False
        while self._pending:
            line = self._pending[0]
            try:
                fd = self._open()
                start = os.lseek(fd, 0, os.SEEK_END)
                written = os.write(fd, line)
                if written != len(line):  # a short write: the disk filled up mid-line
                    os.ftruncate(fd, start)
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
                self._end = start + written
            except OSError as exc:
                self._failed(exc)
                return False
            self._pending.popleft()
        if self._retry_at:
            self._retry_at = 0.0
            logger.warning("profctx: the manifest %s is writable again; pending records written", self.path)
        return True

    def _open(self) -> int:
        fd = self._fd
        if fd is not None:
            try:
                if os.fstat(fd).st_nlink > 0:
                    return fd
            except OSError:
                pass
            os.close(fd)
            self._fd = None
            self._index = False  # the index covers bytes of the shard that is gone: close() writes it anew
            warn_once(f"manifest-gone:{self.path}", "profctx: the manifest %s was deleted; writing a new one",
                      self.path)
        with walk(self.save_path, MANIFEST_DIR) as folder:  # no link followed below save_path
            try:
                self._fd = create_shard(self.path.name, folder)
            except FileExistsError:
                # Taken (a link or file planted at a name others can predict, or a process of the same run
                # id and pid before a restart): this process's records go to a fresh shard of its own.
                stem = self.path.name.removesuffix(SUFFIX)
                self.path = self.path.with_name(f"{stem}.{os.urandom(4).hex()}{SUFFIX}")
                self._fd = create_shard(self.path.name, folder)
        return self._fd

    def _failed(self, exc: OSError) -> None:
        self.failed = f"{type(exc).__name__}: {exc}"
        self._retry_at = time.monotonic() + FULL_DISK_BACKOFF
        reason = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "it cannot be written"
        warn_once(f"manifest:{self.path}:{exc.errno}",
                  "profctx: cannot write the manifest %s (%s: %s); records wait in memory and are retried",
                  self.path, reason, exc)

    def close(self, timeout: float = 0.0) -> bool:
        """Write what is pending (retrying up to ``timeout`` seconds), close the shard; return success.

        Once every record is written, the shard's listing index gets its last segment (see
        :mod:`profctx.records._listing`), under the lock so that no record lands while it is built; an
        index that stopped on the way is written anew from the whole shard.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                self._retry_at = 0.0 if time.monotonic() >= self._retry_at else self._retry_at
                if self._drain() or time.monotonic() >= deadline:
                    break
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
            ok = not self._pending
            if self._pending:
                logger.error("profctx: %d manifest record(s) could not be written to %s: %s",
                             len(self._pending), self.path, self.failed)
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
                if ok:
                    self._checkpoint()  # the final segment: the index covers the whole shard
                    if self._index is False:  # it stopped: write it anew from the whole shard
                        try:
                            from ._listing import write_index

                            write_index(self.path)
                        except Exception as exc:  # noqa: BLE001 - the index is a cache: it never fails a close
                            warn_once("listing-index", "profctx: could not write the listing index of %s: %s",
                                      self.path, exc)
            return ok


def iter_records(save_path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield every raw record of every shard under ``save_path``, shard by shard.

    A line that does not parse (a shard cut short by a crash) is skipped. Delegates to
    :class:`profctx.manifest.ManifestReader`.
    """
    from .. import manifest  # the reader (and json): imported by the first read, not by import profctx

    return manifest.ManifestReader(save_path).lines()


def read(save_path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Return one merged record per capture under ``save_path``, ordered by start time.

    A capture with a ``started`` record and no ``finished`` one has status ``"open"``
    (still running, or its process died). Delegates to :class:`profctx.manifest.ManifestReader`;
    :func:`profctx.manifest.read` returns typed records instead.
    """
    from .. import manifest

    merged = list(manifest.ManifestReader(save_path).merged())
    return sorted(merged, key=_order)


def _order(record: Mapping[str, Any]) -> tuple[float, int]:
    when = record.get("start_time") or record.get("time") or 0
    rank = record.get("rank", 0)
    return (float(when) if isinstance(when, (int, float)) else 0.0, rank if isinstance(rank, int) else 0)
