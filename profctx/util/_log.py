"""Logging: one logger, and warnings emitted once per distinct key.

``logging`` is imported by the first message, not by ``import profctx`` (it costs several
milliseconds of start-up and most runs log nothing). Every profctx module logs through
:data:`logger`, which hands each call to ``logging.getLogger("profctx")``.
"""

from __future__ import annotations

import threading
from typing import Any, final

#: The level numbers of ``logging`` (stable since Python 2; read here without importing it).
DEBUG = 10
INFO = 20
WARNING = 30
ERROR = 40


@final
class _Logger:
    """The ``profctx`` logger, looked up at each call (importing ``logging`` at the first)."""

    __slots__ = ()

    @staticmethod
    def _get() -> Any:
        import logging  # the first message pays for it; later ones find it in sys.modules

        return logging.getLogger("profctx")

    def log(self, level: int, message: str, *args: object) -> None:
        """Log ``message % args`` at ``level``."""
        self._get().log(level, message, *args)

    def debug(self, message: str, *args: object) -> None:
        """Log at DEBUG."""
        self._get().debug(message, *args)

    def info(self, message: str, *args: object) -> None:
        """Log at INFO."""
        self._get().info(message, *args)

    def warning(self, message: str, *args: object) -> None:
        """Log at WARNING."""
        self._get().warning(message, *args)

    def error(self, message: str, *args: object) -> None:
        """Log at ERROR."""
        self._get().error(message, *args)


logger = _Logger()

_seen: set[str] = set()
_lock = threading.Lock()


def first(key: str) -> bool:
    """Return whether ``key`` is seen for the first time since the last :func:`reset` (and note it)."""
    with _lock:
        new = key not in _seen
        _seen.add(key)
    return new


def warn_once(key: str, message: str, *args: object) -> bool:
    """Log ``message`` at WARNING the first time ``key`` is seen; later ones go to DEBUG.

    Return whether this call logged at WARNING.
    """
    new = first(key)
    logger.log(WARNING if new else DEBUG, message, *args)
    return new


def reset() -> None:
    """Forget which warnings were emitted (``profctx.reset()``)."""
    with _lock:
        _seen.clear()
