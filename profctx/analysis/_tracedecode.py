"""Decode slices of a trace's event array into only the fields a reader needs, with msgspec when installed.

A torch event is an object of about ten keys, most of its bytes in ``args``; the analysis needs
seven fields (``ph name cat ts dur pid tid``) and the merge three (``ph pid tid``). A typed
decoder (msgspec with a :class:`Event` struct) skips the rest without building it, which costs a
fraction of a full parse (measured: docs/performance.md). A trace of device activity also needs
``args.correlation``, which ties a kernel to the runtime call that launched it: :class:`Linked`
adds that one field, and a :class:`Decoder` switches to it for the rest of a trace once the reader
has seen such events (decoding ``args`` costs about a tenth more, which CPU-only traces never pay).

Any slice the typed decoder does not take (an event whose ``ts`` is a string, a value that is not
an object, JSON msgspec refuses but the fallback parser reads, such as ``NaN``) is parsed by the
fallback (orjson, else the standard library) and each value converted by :func:`as_event`: a
damaged or odd event never stops a read, it only loses the fields that are not of the expected
type. Without msgspec every slice takes the fallback path.

Every decoder here takes the bytes of a JSON array (``[`` ... ``]``) and raises ``ValueError`` when
they are not valid JSON (``pos``, when known, says where), as :class:`profctx.analysis._tracejson.TraceStream`
expects of its parser; nesting too deep for the interpreter is reported the same way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from itertools import compress, repeat
from operator import attrgetter
from typing import Any, Final

try:
    import orjson as _orjson

    _fallback_loads: Callable[[bytes], Any] = _orjson.loads
except ImportError:  # pragma: no cover - exercised when the extra is absent
    _fallback_loads = json.loads

try:
    import msgspec as _msgspec

    _TYPED = True
except ImportError:  # pragma: no cover - exercised with the extra absent (tests patch the import)
    _TYPED = False


if _TYPED:

    class Event(_msgspec.Struct, gc=False):
        """The fields of one trace event the analysis reads; ``None`` where absent or of another type."""

        ph: str | None = None
        name: str | None = None
        cat: str | None = None
        ts: float | None = None
        dur: float | None = None
        pid: int | str | None = None
        tid: int | str | None = None

    class Head(_msgspec.Struct, gc=False):
        """The fields of one trace event the merge checks; ``None`` where absent or of another type.

        ``ts`` and ``dur`` are decoded (as floats) so that a time beyond a double fails the batch
        here, as it fails the fallback parser: the merge then reads that batch value by value.
        """

        ph: str | None = None
        pid: int | str | None = None
        tid: int | str | None = None
        ts: float | None = None
        dur: float | None = None

    class Args(_msgspec.Struct, gc=False):
        """The one field of an event's ``args`` the analysis reads: the id linking a kernel to its launch."""

        correlation: int | None = None

    class Linked(Event, gc=False):
        """An :class:`Event` with its ``args.correlation`` (``args`` ``None`` where absent)."""

        args: Args | None = None

    _EVENTS: Any = _msgspec.json.Decoder(list[Event])
    _LINKED: Any = _msgspec.json.Decoder(list[Linked])
    _HEADS: Any = _msgspec.json.Decoder(list[Head])
    _RAWS: Any = _msgspec.json.Decoder(list[_msgspec.Raw])
    _MSGSPEC_ERRORS: tuple[type[Exception], ...] = (_msgspec.DecodeError, RecursionError)

else:  # pragma: no cover - the same shape without msgspec

    class Event:  # type: ignore[no-redef]
        """The fields of one trace event the analysis reads; ``None`` where absent or of another type."""

        __slots__ = ("cat", "dur", "name", "ph", "pid", "tid", "ts")

        def __init__(self, ph: str | None = None, name: str | None = None, cat: str | None = None,
                     ts: float | None = None, dur: float | None = None, pid: int | str | None = None,
                     tid: int | str | None = None) -> None:
            self.ph = ph
            self.name = name
            self.cat = cat
            self.ts = ts
            self.dur = dur
            self.pid = pid
            self.tid = tid

    class Args:  # type: ignore[no-redef]
        """The one field of an event's ``args`` the analysis reads: the id linking a kernel to its launch."""

        __slots__ = ("correlation",)

        def __init__(self, correlation: int | None = None) -> None:
            self.correlation = correlation

    class Linked(Event):  # type: ignore[no-redef]
        """An :class:`Event` with its ``args.correlation`` (``args`` ``None`` where absent)."""

        __slots__ = ("args",)

        def __init__(self, ph: str | None = None, name: str | None = None, cat: str | None = None,
                     ts: float | None = None, dur: float | None = None, pid: int | str | None = None,
                     tid: int | str | None = None, args: Args | None = None) -> None:
            super().__init__(ph, name, cat, ts, dur, pid, tid)
            self.args = args

    class Head:  # type: ignore[no-redef]
        """The fields of one trace event the merge checks; ``None`` where absent or of another type."""

        __slots__ = ("dur", "ph", "pid", "tid", "ts")

        def __init__(self, ph: str | None = None, pid: int | str | None = None, tid: int | str | None = None,
                     ts: float | None = None, dur: float | None = None) -> None:
            self.ph = ph
            self.pid = pid
            self.tid = tid
            self.ts = ts
            self.dur = dur

    _EVENTS = _LINKED = _HEADS = _RAWS = None
    _MSGSPEC_ERRORS = ()

#: The fields of :class:`Event`, in order.
FIELDS: Final = ("ph", "name", "cat", "ts", "dur", "pid", "tid")
#: Where msgspec's error message says the data went wrong.
_BYTE: Final = re.compile(r"\(byte (\d+)\)")


class MalformedError(ValueError):
    """Raised when a slice is not valid JSON; ``pos`` is the byte offset of the fault when known."""

    def __init__(self, message: str, pos: int | None) -> None:
        super().__init__(message)
        self.pos = pos


def typed() -> bool:
    """Return whether the typed decoder (msgspec) is installed."""
    return _EVENTS is not None


def _str(value: Any) -> str | None:
    return value if type(value) is str else None


def _number(value: Any) -> float | None:
    kind = type(value)
    if kind is float:
        return value  # type: ignore[no-any-return]
    if kind is int:
        try:
            return float(value)
        except OverflowError:  # an integer past any float: no time
            return None
    return None


def _ident(value: Any) -> int | str | None:
    kind = type(value)
    if kind is int or kind is str:
        return value  # type: ignore[no-any-return]
    if value is None:
        return None
    return str(value)  # an odd pid or tid (a float, a list) still names one thread, and is hashable


def as_event(value: Any) -> Linked | None:
    """Return the :class:`Linked` event of a parsed event (a dict), or ``None`` for a value that is not an object.

    A field of another type than the struct's becomes ``None``, except ``name`` (written out with
    ``str``) and ``pid``/``tid`` (a value of another type is named by its ``str``); ``args`` holds
    the correlation when it is an integer, else is ``None``.
    """
    if type(value) is not dict:
        return None
    event = Linked(*map(value.get, FIELDS))
    checked(event)
    found = correlation_of(value)
    if found is not None:
        event.args = Args(found)
    return event


def correlation_of(value: dict[str, Any]) -> int | None:
    """Return ``args.correlation`` of a parsed event (a dict) when it is an integer, else ``None``."""
    args = value.get("args")
    if type(args) is not dict:
        return None
    found = args.get("correlation")
    return found if type(found) is int else None


def correlation(event: Event) -> int | None:
    """Return the correlation of a decoded event: ``None`` for an :class:`Event` decoded without ``args``."""
    args = getattr(event, "args", None)
    return None if args is None else args.correlation  # type: ignore[no-any-return]


_ARGS: Final = attrgetter("args")
_CORRELATION: Final = attrgetter("correlation")


def correlations(batch: list[Any], unchecked: bool) -> list[int | None]:
    """Return :func:`correlation` of each event of ``batch`` (:func:`correlation_of` of each dict when
    ``unchecked``); in C when every event is :class:`Linked` and has ``args``."""
    if unchecked:
        return list(map(correlation_of, batch))
    try:
        args = list(map(_ARGS, batch))
    except AttributeError:  # an Event decoded without args
        return list(map(correlation, batch))
    if None in args:
        return [None if a is None else a.correlation for a in args]
    return list(map(_CORRELATION, args))


def checked(event: Event) -> Event:
    """Return ``event`` (from an :class:`Unchecked` batch) with each field of another type than the struct's
    made as :func:`as_event` makes it."""
    name = event.name
    event.ph = _str(event.ph)
    event.name = name if type(name) is str or name is None else str(name)
    event.cat = _str(event.cat)
    event.ts = _number(event.ts)
    event.dur = _number(event.dur)
    event.pid = _ident(event.pid)
    event.tid = _ident(event.tid)
    return event


class Unchecked(list):  # type: ignore[type-arg] # list[dict[str, Any]]: parsed events, fields of any type
    """The events of a slice as the fallback parser made them: dicts, whose fields may be of any type
    (checking each costs more than the reader's own loop). :func:`as_event` makes one an :class:`Event`."""


class Heads(list):  # type: ignore[type-arg] # list[Head]: msgspec's decoded list, marked as heads
    """The :class:`Head` of every event of a batch whose events were not parsed further."""


def _parse(data: bytes) -> list[Any]:
    """Parse ``data`` with the fallback parser; raise :class:`MalformedError` if it is not a JSON array."""
    try:
        value = _fallback_loads(data)
    except RecursionError:
        raise MalformedError("the data is nested too deeply", None) from None
    except ValueError as exc:  # orjson's and json's decode errors are ValueErrors
        raise MalformedError(str(exc), getattr(exc, "pos", None)) from None
    if type(value) is not list:
        raise MalformedError("not a JSON array", 0)
    return value


def events(data: bytes, linked: bool = False) -> list[Any]:
    """Return the events of the JSON array ``data``, values that are not objects left out.

    :class:`Event` structs (:class:`Linked` when ``linked``) when msgspec takes the slice, else
    (another type in some field, no msgspec) an :class:`Unchecked` list of the parsed dicts.

    Raise :class:`MalformedError` (a ``ValueError``) when ``data`` is not valid JSON.
    """
    decoder = _LINKED if linked else _EVENTS
    if decoder is not None and _EVENTS is not None:
        try:
            return decoder.decode(data)  # type: ignore[no-any-return]
        except _MSGSPEC_ERRORS:
            pass  # another type in some event, or JSON only the fallback parser takes: parse it as values
    values = _parse(data)
    return Unchecked(compress(values, map(isinstance, values, repeat(dict))))


class Decoder:
    """:func:`events` for one trace: :class:`Event` structs until :attr:`linked` is set, :class:`Linked` after.

    A reader sets :attr:`linked` when it first meets events whose correlation it needs (and decodes
    that batch again, with ``events(data, linked=True)``). Not thread-safe: one per stream.
    """

    __slots__ = ("linked",)

    def __init__(self) -> None:
        self.linked = False

    def __call__(self, data: bytes) -> list[Any]:
        return events(data, self.linked)


def flat(batch: list[Any]) -> bool:
    """Whether a batch :func:`events` returned holds only flat fields (the typed decoder's structs): the
    values an :class:`Unchecked` batch holds may nest to any depth."""
    return type(batch) is not Unchecked


def heads(data: bytes) -> list[Head] | None:
    """Return ``(ph, pid, tid)`` of every value of the JSON array ``data``, or ``None`` when msgspec does not
    take it: a value that is not an object, a field of another type, JSON it refuses (the caller then
    parses the values with its own parser, which says whether the JSON is valid). Without msgspec, ``None``.
    """
    if _HEADS is None:
        return None
    try:
        return _HEADS.decode(data)  # type: ignore[no-any-return]
    except _MSGSPEC_ERRORS:
        return None


def heads_or_values(data: bytes) -> list[Any]:
    """Return :class:`Heads` of the JSON array ``data`` when msgspec takes it, else its parsed values.

    A parser for :class:`profctx.analysis._tracejson.TraceStream` (the merge's): raise
    :class:`MalformedError` when ``data`` is not valid JSON.
    """
    found = heads(data)
    return _parse(data) if found is None else Heads(found)


def raws(data: bytes) -> list[Any] | None:
    """Return the JSON text of each value of the JSON array ``data`` (bytes-like ``msgspec.Raw``), or ``None``
    without msgspec. Raise :class:`MalformedError` when ``data`` is not valid JSON."""
    if _RAWS is None:
        return None
    try:
        return _RAWS.decode(data)  # type: ignore[no-any-return]
    except _MSGSPEC_ERRORS as exc:
        _raise_malformed(exc)
    return None  # pragma: no cover - _raise_malformed always raises


def _raise_malformed(exc: Exception) -> None:
    if isinstance(exc, RecursionError):
        raise MalformedError("the data is nested too deeply", None) from None
    found = _BYTE.search(str(exc))
    raise MalformedError(str(exc), int(found.group(1)) if found else None) from None
