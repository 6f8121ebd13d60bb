"""Errors profctx raises."""

from __future__ import annotations

from collections.abc import Iterable


class ConfigError(ValueError):
    """Raise for an invalid configuration: names the field, the value and what is allowed."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}: {value!r} is not valid; {allowed}")


class ProfilingError(RuntimeError):
    """Raise for a run-time profiling failure when ``on_error="raise"`` is configured."""


def one_of(choices: Iterable[str]) -> str:
    """Render an 'allowed' phrase listing choices."""
    return "allowed: " + ", ".join(repr(c) for c in choices)
