"""What engine adapters need from the process that drives them, and where they find it.

Engines sit below the process layer (``docs/architecture.md``): they never import it. The
process layer hands them its view once, at ``import profctx`` (``process._engines`` calls
:func:`serve`), and passes its runtime, a :class:`Host`, to every start it drives. Before
that, or where nothing is configured, the view answers "not configured" and adapters do nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, final

from ..core._config import ProfilerConfig
from ..core._scope import SCOPE, Scope


class Host(Protocol):
    """The running configuration an engine session records into (the process's runtime is one)."""

    @property
    def config(self) -> ProfilerConfig: ...

    @property
    def save_path(self) -> Path: ...

    def record(self, record: dict[str, Any]) -> None:
        """Append a manifest record (off the caller's thread)."""

    def failure(self, what: str, exc: BaseException, *, in_flight: bool = False) -> None:
        """Log a failure once and record it (or raise it, with ``on_error="raise"``)."""


class Process(Protocol):
    """The process's state, as much as engines read of it."""

    @property
    def config(self) -> ProfilerConfig | None:
        """The configuration given to ``configure()``, if any."""

    def host(self) -> Host | None:
        """The runtime of the active configuration (``None``: nothing can be captured)."""

    def scope(self) -> Scope:
        """The ambient scope (``profctx.current()``)."""

    def add_hook(self, hook: Any) -> None:
        """Register a role hook (attached engines start and stop with matching role blocks)."""

    def remove_hook(self, hook: Any) -> None:
        """Unregister a role hook."""


@final
class _Unserved:
    """The view before the process layer serves its own: nothing configured, hooks refused."""

    __slots__ = ()

    config = None

    def host(self) -> Host | None:
        return None

    def scope(self) -> Scope:
        return SCOPE.get()

    def add_hook(self, hook: Any) -> None:
        raise RuntimeError("profctx: engines were attached before profctx's process layer loaded; import profctx")

    def remove_hook(self, hook: Any) -> None:
        pass


#: The process's view, set once by the process layer (a list: one slot, no ``global``).
_SERVED: list[Process] = [_Unserved()]


def serve(view: Process) -> None:
    """Make ``view`` the process engines read (called once, by ``profctx.process._engines``)."""
    _SERVED[0] = view


def process() -> Process:
    """Return the process view engines read."""
    return _SERVED[0]
