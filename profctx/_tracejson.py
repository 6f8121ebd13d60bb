"""Read Chrome trace files (``.json``, ``.json.gz``) as a stream, one event at a time.

A trace is an object whose ``traceEvents`` array holds the events (or, in the Trace Event
Format's bare form, just that array). Loading a 1 GB trace with ``json.load`` costs several
times its size in memory; this reader holds one chunk of text plus the event being decoded.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Final

#: Characters read per refill of the buffer.
CHUNK: Final = 1 << 20
#: Key of the event array in the object form of a trace.
EVENTS: Final = "traceEvents"

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class TraceFormatError(ValueError):
    """Raise when a file is not a Chrome trace or is cut short."""


class TraceStream:
    """Open one trace file and walk its top level: metadata keys and events, in file order.

    ``consumed`` is how many bytes of the file (compressed bytes for ``.gz``) were read so
    far, for progress display. Use as a context manager; not thread-safe.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.size = self.path.stat().st_size
        self._raw: IO[bytes] = open(self.path, "rb")  # noqa: SIM115 - closed by close()
        binary: Any = gzip.GzipFile(fileobj=self._raw) if _is_gzip(self._raw) else self._raw
        self._text = io.TextIOWrapper(binary, encoding="utf-8", errors="replace")
        self._buf = ""
        self._pos = 0
        self._eof = False

    @property
    def consumed(self) -> int:
        """Bytes of the file read so far."""
        try:
            return self._raw.tell()
        except (OSError, ValueError):
            return self.size

    def close(self) -> None:
        """Close the file."""
        self._text.close()
        self._raw.close()

    def __enter__(self) -> TraceStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def items(self) -> Iterator[tuple[str, Any]]:
        """Yield ``(key, value)`` per top-level key, and ``("traceEvents", event)`` per event.

        Raise :class:`TraceFormatError` if the file is not a trace or ends early (a crash, a
        partial copy); what was yielded before stays valid.
        """
        try:
            first = self._peek()
            if first == "[":
                self._pos += 1
                yield from ((EVENTS, event) for event in self._array())
                return
            if first != "{":
                raise TraceFormatError(f"{self.path}: not a Chrome trace (starts with {first!r})")
            self._pos += 1
            while True:
                c = self._peek()
                if c == "}":
                    return
                if c == ",":
                    self._pos += 1
                    continue
                key = self._value()
                if not isinstance(key, str) or self._peek() != ":":
                    raise TraceFormatError(f"{self.path}: malformed object key near {key!r}")
                self._pos += 1
                if key == EVENTS and self._peek() == "[":
                    self._pos += 1
                    yield from ((EVENTS, event) for event in self._array())
                else:
                    yield key, self._value()
        except (EOFError, gzip.BadGzipFile, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TraceFormatError(f"{self.path}: {type(exc).__name__}: {exc}") from None

    def _array(self) -> Iterator[Any]:
        while True:
            c = self._peek()
            if c == "]":
                self._pos += 1
                return
            if c == ",":
                self._pos += 1
                continue
            yield self._value()

    def _fill(self) -> bool:
        if self._eof:
            return False
        chunk = self._text.read(CHUNK)
        if not chunk:
            self._eof = True
            return False
        self._buf = self._buf[self._pos:] + chunk
        self._pos = 0
        return True

    def _peek(self) -> str:
        while True:
            match = _WS.match(self._buf, self._pos)
            self._pos = match.end() if match else self._pos
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill():
                raise EOFError("the file ends before the trace does")

    def _value(self) -> Any:
        self._peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError:
                # The value may run past the buffer: read more and decode it again.
                if self._fill():
                    continue
                raise
            if end == len(self._buf) and not self._eof and self._fill():
                continue  # a number at the very end of the buffer may continue in the next chunk
            self._pos = end
            return value


def _is_gzip(raw: IO[bytes]) -> bool:
    magic = raw.read(2)
    raw.seek(0)
    return magic == b"\x1f\x8b"


def is_trace_file(path: str) -> bool:
    """Whether ``path`` names a Chrome trace profctx can read (``*.json`` or ``*.json.gz``)."""
    return path.endswith((".json", ".json.gz"))


def header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], float | None]:
    """Return a trace's top-level keys other than the events, and the smallest event ``ts``.

    Reads the whole file (streamed); used when metadata comes after the event array.
    """
    meta: dict[str, Any] = {}
    first: float | None = None
    with TraceStream(path) as stream:
        for key, value in stream.items():
            if key != EVENTS:
                meta[key] = value
                continue
            ts = value.get("ts") if isinstance(value, dict) else None
            if isinstance(ts, (int, float)) and value.get("ph") != "M" and (first is None or ts < first):
                first = float(ts)
    return meta, first
