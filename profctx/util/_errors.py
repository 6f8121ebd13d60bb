"""Errors profctx raises."""

from __future__ import annotations

import reprlib
from collections.abc import Iterable


def _short_repr() -> reprlib.Repr:
    shown = reprlib.Repr()  # attributes, not keywords: those arrived in Python 3.12
    shown.maxlevel = 3
    shown.maxlist = shown.maxtuple = shown.maxset = shown.maxfrozenset = shown.maxdict = 20
    shown.maxstring = shown.maxother = 300
    shown.maxlong = 60
    return shown


_SHORT = _short_repr()


class ConfigError(ValueError):
    """Raise for an invalid configuration: names the field, the value and what is allowed.

    The message shows the value's ``repr`` cut to a few hundred characters, so a huge or deeply
    shared value (a YAML alias bomb) cannot make the error itself slow; ``value`` keeps it whole.
    """

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}: {_SHORT.repr(value)} is not valid; {allowed}")

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, object, str]]:
        # Crosses processes whole (Ray, multiprocessing): ValueError's pickling calls __init__ with the message.
        return (ConfigError, (self.field, self.value, self.allowed))


class ProfilingError(RuntimeError):
    """Raise for a run-time profiling failure when ``on_error="raise"`` is configured."""


# Shown as ``profctx.ConfigError`` in tracebacks and reprs: the name users import and catch (it pickles by that name).
ConfigError.__module__ = "profctx"
ProfilingError.__module__ = "profctx"


def one_of(choices: Iterable[str]) -> str:
    """Render an 'allowed' phrase listing choices."""
    return "allowed: " + ", ".join(repr(c) for c in choices)
