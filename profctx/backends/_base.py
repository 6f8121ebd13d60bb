"""The backend protocol: how profctx drives one device profiler."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from ..util._identity import Identity

if TYPE_CHECKING:
    from ..core._config import ProfilerConfig

#: What ``Backend.stop`` returns: a function that writes the files and returns their final paths.
#: profctx runs it off the training thread; it must not touch the profiler's start/stop state.
Finish = Callable[[], Sequence[Path]]


@dataclass
class CaptureSpec:
    """Everything a backend needs to run one capture.

    ``folder`` exists and is absolute; files go into it named from ``stem``.
    ``metadata`` is the identity to embed in the trace. A backend appends to ``notes``
    anything the user should read in the manifest (an option it could not honour).
    """

    capture_id: str
    steps: tuple[int, ...]
    roles: tuple[str, ...]
    folder: Path
    stem: str
    identity: Identity
    run_id: str
    contents: tuple[str, ...]
    options: Mapping[str, Any]
    compress: bool
    metadata: dict[str, Any]
    notes: list[str] = field(default_factory=list)


@runtime_checkable
class Backend(Protocol):
    """A device profiler. One instance per process; at most one capture live at a time.

    ``start`` and ``stop`` are called on the same thread. ``range`` is only called while a
    capture is live. Errors raised by any method are caught by profctx, logged once and
    recorded in the manifest.
    """

    name: ClassVar[str]

    def prepare(self) -> None:
        """Do one-time expensive set-up (imports, warm-up) outside any profiled step."""

    def start(self, spec: CaptureSpec) -> None:
        """Start capturing into ``spec.folder``."""

    def stop(self) -> Finish:
        """Stop capturing; return the function that writes the files."""

    def range(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """Return a context manager marking a named range in the live capture."""

    def step(self) -> None:
        """Mark a sub-step boundary (for backends with schedules); may do nothing."""


def check_config(backend_cls: type[Any], config: ProfilerConfig) -> None:
    """Call the backend class's optional ``check_config(config)``; it raises ``ConfigError``."""
    check = getattr(backend_cls, "check_config", None)
    if check is not None:
        check(config)


def no_files() -> Sequence[Path]:
    """A :data:`Finish` for backends that write nothing."""
    return ()
