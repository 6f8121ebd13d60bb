"""The ``noop`` backend: decides and records captures, profiles nothing."""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar

from ._base import CaptureSpec, Finish, no_files


class NoopBackend:
    """A backend that writes no files; captures are still planned and recorded in the manifest."""

    name: ClassVar[str] = "noop"

    def prepare(self) -> None:
        """Nothing to prepare."""

    def start(self, spec: CaptureSpec) -> None:
        """Start nothing."""

    def stop(self) -> Finish:
        """Stop nothing; no files."""
        return no_files

    def range(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """Return a no-op context manager."""
        return contextlib.nullcontext()

    def step(self) -> None:
        """Do nothing."""
