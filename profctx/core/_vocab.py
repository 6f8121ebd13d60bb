"""The closed sets profctx names things with: modes, capture and record kinds, built-in tools, states.

Each set is spelled once, here, as a ``Literal``; the tuples that input is checked against are
derived from it with ``typing.get_args``, and every branch on a value of a set ends in
:func:`assert_never`, so a value added here and not handled everywhere fails strict mypy at the
branch that misses it (``tests/test_vocabulary.py`` proves it on a copy of the package). Capture
states are spelled in :mod:`profctx.core._status` (their own module, older and imported widely)
and named here as well, so this one module lists every closed set.
"""

from __future__ import annotations

from typing import Final, Literal, NoReturn, get_args

from ._status import HOLDING, LISTED, Ended, State

__all__ = ["BUILTIN_TOOLS", "CAPTURE_KINDS", "HOLDING", "LISTED", "MODES", "RECORD_KINDS", "CaptureKind", "Ended",
           "Mode", "RecordKind", "State", "Tool", "assert_never", "capture_kind"]

#: What one capture covers: a step (or a contiguous run of steps), or one role block of a step.
Mode = Literal["step", "role"]
MODES: Final[tuple[Mode, ...]] = get_args(Mode)

#: What a capture of the process's own profiler covers (``core._plan.CaptureKey.kind``).
CaptureKind = Literal["step", "role"]
CAPTURE_KINDS: Final[tuple[CaptureKind, ...]] = get_args(CaptureKind)

#: What a manifest record is about: a process's own capture, an engine's session, or a remote
#: call that failed (a Ray worker group member that did not answer).
RecordKind = Literal[CaptureKind, "engine", "remote"]
RECORD_KINDS: Final[tuple[RecordKind, ...]] = get_args(RecordKind)

#: The backends profctx ships (``profctx.backends`` registers each); ``auto`` chooses one of them,
#: and ``profctx.backends.register`` adds names of a user's own, so a config's ``tool`` is any name.
Tool = Literal["torch", "npu", "nsys", "torch_memory", "noop", "recording"]
BUILTIN_TOOLS: Final[tuple[Tool, ...]] = get_args(Tool)


def assert_never(value: NoReturn) -> NoReturn:
    """Fail a branch that a closed set's values should never reach; mypy rejects any call it can reach.

    Put it in the last ``else`` of an ``if``/``elif`` chain comparing a value of a ``Literal``
    above with ``==``: once every value is handled, mypy narrows the value there to ``Never``.
    ``typing.assert_never`` is Python 3.11+; this is its twin for 3.10.
    """
    raise AssertionError(f"unhandled value: {value!r}")


def capture_kind(mode: Mode) -> CaptureKind:
    """Return the kind of the captures ``mode`` opens (the kind a record of a capture in that mode names)."""
    if mode == "step":
        return "step"
    elif mode == "role":
        return "role"
    else:
        assert_never(mode)
