"""The manifest: one JSON-lines shard per process under ``{save_path}/.profctx/``.

Each capture writes a ``started`` record, then a ``finished`` record whose ``status`` is
``ok``, ``failed`` or ``skipped`` (a skipped capture writes only the ``finished`` record).
Records of one capture share its ``capture`` id; readers merge them, later keys winning.
See ``docs/manifest.md`` for every key.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from . import manifest
from ._identity import Identity
from ._layout import MANIFEST_DIR, safe
from ._log import warn_once

#: Version of the record format; readers accept records of this version or lower.
VERSION: Final = 1


class ManifestWriter:
    """Append records to this process's shard. Thread-safe; never raises on I/O errors."""

    def __init__(self, save_path: Path, run_id: str, identity: Identity) -> None:
        self.save_path = save_path
        self.run_id = run_id
        self.identity = identity
        name = f"{safe(run_id)}.{identity.tag}.{safe(identity.host)}.{identity.pid}.jsonl"
        self.path = save_path / MANIFEST_DIR / name
        self._lock = threading.Lock()
        self._fd: int | None = None
        self.failed: str | None = None

    def envelope(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """Return ``record`` with the version, run, rank, world size, host and pid added in front."""
        return {
            "v": VERSION,
            "run": self.run_id,
            "rank": self.identity.rank,
            "world_size": self.identity.world_size,
            "host": self.identity.host,
            "pid": self.identity.pid,
            **record,
        }

    def write(self, record: Mapping[str, Any]) -> bool:
        """Append ``record`` as one JSON line (:meth:`envelope` it first); return success."""
        line = (json.dumps(record, default=str, separators=(",", ":")) + "\n").encode()
        with self._lock:
            try:
                if self._fd is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                os.write(self._fd, line)
                return True
            except OSError as exc:
                self.failed = f"{type(exc).__name__}: {exc}"
                warn_once(f"manifest:{self.path}", "profctx: cannot write the manifest %s: %s", self.path, exc)
                return False

    def close(self) -> None:
        """Close the shard file (a later write reopens it)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def iter_records(save_path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield every raw record of every shard under ``save_path``, shard by shard.

    A line that does not parse (a shard cut short by a crash) is skipped. Delegates to
    :class:`profctx.manifest.ManifestReader`.
    """
    return manifest.ManifestReader(save_path).lines()


def read(save_path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Return one merged record per capture under ``save_path``, ordered by start time.

    A capture with a ``started`` record and no ``finished`` one has status ``"open"``
    (still running, or its process died). Delegates to :class:`profctx.manifest.ManifestReader`;
    :func:`profctx.manifest.read` returns typed records instead.
    """
    merged = list(manifest.ManifestReader(save_path).merged())
    return sorted(merged, key=_order)


def _order(record: Mapping[str, Any]) -> tuple[float, int]:
    when = record.get("start_time") or record.get("time") or 0
    rank = record.get("rank", 0)
    return (float(when) if isinstance(when, (int, float)) else 0.0, rank if isinstance(rank, int) else 0)
