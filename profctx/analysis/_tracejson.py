"""Read Chrome trace files (``.json``, ``.json.gz``) as a stream of event batches.

A trace is an object whose ``traceEvents`` array holds the events (or, in the Trace Event
Format's bare form, just that array). Loading a 1 GB trace with ``json.load`` costs several
times its size in memory; this reader holds one buffer of about :data:`CHUNK` bytes.

How it stays fast: the event array is cut at element boundaries (a ``}`` then ``,`` then ``{``,
whitespace allowed) found by searching backwards from the end of the buffer, and each slice
is parsed in one call to a C parser (``orjson`` when installed, else the standard library).
A cut that falls inside a string or a nested object makes that parse fail; the reader then
tries an earlier boundary and, last, decodes one value at a time, so any valid JSON reads.
Everything outside the array (metadata keys, before or after it) is decoded value by value.

What it reads is untrusted (run folders come from elsewhere): the file is opened as
:func:`profctx.util._untrusted.open_regular` opens it (a regular file, never blocking, inside the
run folder when one is given), JSON nested deeper than :data:`~profctx.util._untrusted.MAX_DEPTH`
is damage, and a gzip stream that inflates past its share of the command's
:class:`~profctx.util._untrusted.Budget` (:data:`MAX_RATIO` times its compressed size, plus its
share of :data:`RATIO_FREE` bytes for the whole command) or beyond :data:`MAX_INFLATED` is cut there.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Final

from ..util import _codec
from ..util._untrusted import INFLATE_FREE, INFLATE_RATIO, MAX_DEPTH, Budget, open_regular, too_deep

try:
    import orjson as _orjson

    _loads: Callable[[bytes], Any] = _orjson.loads
    _ParseError: tuple[type[Exception], ...] = (_orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover - exercised when the extra is absent
    _loads = json.loads
    _ParseError = (ValueError, RecursionError)

#: Bytes read from the file per refill (compressed bytes for ``.gz``).
CHUNK: Final = 1 << 20
#: Bytes decoded at first for one value outside the event array (widened as needed).
_WINDOW: Final = 1 << 14
#: Key of the event array in the object form of a trace.
EVENTS: Final = "traceEvents"
#: Boundaries tried per buffer before the reader falls back to one value at a time.
_TRIES: Final = 4
#: The largest single value the reader looks for the end of: past it the data is damaged (a
#: trace's values outside the event array, and its events, are far smaller).
MAX_VALUE: Final = 64 << 20
#: A gzip trace may inflate to at most this many times its compressed size...
MAX_RATIO: Final = INFLATE_RATIO
#: ... plus its share of this many bytes over the whole command (a small file may inflate more: its whole is small).
RATIO_FREE: Final = INFLATE_FREE
#: Inflated bytes read from one gzip trace at most, whatever its size (a trace has never come near).
MAX_INFLATED: Final = 64 << 30
#: First bytes of a JSON value.
_STARTS: Final = frozenset(b'{["-0123456789tfn')
#: A parse error this close to the end of what was decoded may be a token cut by the buffer's end.
_TOKEN: Final = 64

_WS: Final = frozenset(b" \t\n\r")
_SPACE: Final = re.compile(rb"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class TraceFormatError(ValueError):
    """Raise when a file is not a Chrome trace, is cut short or is damaged."""


class DamagedDataError(ValueError):
    """Raised inside the reader where the bytes cannot be JSON, however much more is read."""


class TraceStream:
    """Open one trace file and walk its top level: metadata keys and event batches, in file order.

    ``root``: the run folder the file must lie in (see :func:`profctx.util._untrusted.open_regular`);
    raise :class:`~profctx.util._untrusted.UnsafeFileError` (an :class:`OSError`) for a file refused.

    ``loads`` parses an event slice (the bytes of a JSON array) into the values a batch holds and
    raises ``ValueError`` when they are not JSON; the default gives dicts (orjson, else the standard
    library), :mod:`profctx.analysis._tracedecode` gives only the fields a reader needs. Values decoded one at a
    time (after damage, or a cut that never parses) are always plain JSON values, with
    :attr:`raw` ``None``. A ``.gz`` file inflates through :mod:`profctx.util._codec` (isal when installed).

    ``flat(batch)`` says whether a batch ``loads`` returned holds no nested value at all (a typed decode
    into strings and numbers): its slice then skips the depth check, which guards what is built from
    nested values, and a decoder that builds none bounds its own recursion (msgspec raises, and the
    slice is parsed again by the fallback parser, whose batch is checked).

    ``budget``: what the command reading this file may inflate over all its files (a file read
    alone: its own); the file inflates to at most its :meth:`~profctx.util._untrusted.Budget.cap`.

    ``consumed`` is how many bytes of the file (compressed bytes for ``.gz``) were read so
    far, for progress display; :attr:`identity` the opened file's device and inode (the same
    file under any name). Use as a context manager; not thread-safe.
    """

    def __init__(self, path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None, *,
                 loads: Callable[[bytes], Any] | None = None, flat: Callable[[Any], bool] | None = None,
                 budget: Budget | None = None) -> None:
        self.path = Path(path)
        self._loads = loads or _loads
        self._flat = flat
        self._raw: IO[bytes] = open_regular(self.path, root)
        info = os.fstat(self._raw.fileno())
        self.size = info.st_size
        self.identity = (info.st_dev, info.st_ino)
        self._cap = min((budget or Budget(self.size)).cap(self.size), MAX_INFLATED)
        magic = self._raw.read(2)
        self._raw.seek(0)
        self._inflate: Any = _codec.inflater() if magic == b"\x1f\x8b" else None
        self._buf = b""
        self._pos = 0
        self._eof = False
        self._damage: str | None = None
        self._consumed = 0
        self._inflated = 0
        #: The JSON text of the event batch :meth:`batches` yielded last (its events separated by
        #: commas, no brackets) when it was parsed from one slice, else ``None``: the bytes a
        #: writer can copy for a batch it leaves unchanged.
        self.raw: bytes | None = None

    @property
    def consumed(self) -> int:
        """Bytes of the file read so far."""
        return self._consumed

    def close(self) -> None:
        """Close the file."""
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
        for key, value in self.batches():
            if key == EVENTS:
                for event in value:
                    yield EVENTS, event
            else:
                yield key, value

    def batches(self) -> Iterator[tuple[str, Any]]:
        """Yield ``(key, value)`` per top-level key, and ``("traceEvents", [events...])`` per batch.

        The faster form of :meth:`items`: events come in lists of up to a buffer's worth.
        Raise :class:`TraceFormatError` as :meth:`items` does.
        """
        try:
            first = self._peek()
            if first == 0x5B:  # [
                self._pos += 1
                yield from ((EVENTS, batch) for batch in self._array())
                return
            if first != 0x7B:  # {
                raise TraceFormatError(f"{self.path}: not a Chrome trace (starts with {chr(first)!r})")
            self._pos += 1
            while True:
                c = self._peek()
                if c == 0x7D:  # }
                    return
                if c == 0x2C:  # ,
                    self._pos += 1
                    continue
                key = self._value()
                if not isinstance(key, str) or self._peek() != 0x3A:  # :
                    raise TraceFormatError(f"{self.path}: malformed object key near {key!r}")
                self._pos += 1
                if key == EVENTS and self._peek() == 0x5B:
                    self._pos += 1
                    yield from ((EVENTS, batch) for batch in self._array())
                else:
                    yield key, self._value()
        except (EOFError, ValueError, RecursionError) as exc:
            if isinstance(exc, TraceFormatError):
                raise
            why = self._damage or (str(exc) if isinstance(exc, DamagedDataError) else f"{type(exc).__name__}: {exc}")
            raise TraceFormatError(f"{self.path}: {why}") from None

    def _array(self) -> Iterator[list[Any]]:
        while True:
            c = self._peek()
            if c == 0x5D:  # ]
                self._pos += 1
                return
            if c == 0x2C:
                self._pos += 1
                continue
            batch = self._bulk()
            if batch is not None:
                yield batch
                continue
            if not self._eof and len(self._buf) - self._pos < 2 * CHUNK and self._fill():
                continue  # too little buffered to hold a boundary: read on
            single = [self._value()]
            self.raw = None
            yield single

    def _bulk(self) -> list[Any] | None:
        """Parse the events from the position up to the last element boundary in the buffer."""
        buf = self._buf
        start = self._pos
        end = len(buf)
        for _ in range(_TRIES):
            cut = _boundary(buf, start, end)
            if cut < 0:
                return None
            text = buf[start:cut]
            try:
                batch = self._loads(b"".join((b"[", text, b"]")))
            except _ParseError as exc:
                # Try a boundary before where the parse failed (past the "["): a cut inside a
                # string fails near the cut, damaged data where it is, so valid events before
                # damage are still read in one parse, not one at a time.
                where = getattr(exc, "pos", None)
                end = cut - 1 if type(where) is not int else min(cut - 1, start + max(where - 1, 0))
                continue
            if not isinstance(batch, list):  # pragma: no cover - "[" ... "]" parses to a list
                return None
            if (self._flat is None or not self._flat(batch)) and too_deep(text):
                raise DamagedDataError(f"the data is damaged (JSON nested deeper than {MAX_DEPTH} levels)")
            self._pos = cut + 1
            self.raw = text
            return batch
        return None

    def _read(self) -> bytes:
        """Return the next decoded bytes of the file (about :data:`CHUNK`), or ``b""`` at its end (damage noted)."""
        while True:
            if self._inflate is not None and self._inflate.unconsumed_tail:
                raw = self._inflate.unconsumed_tail  # input left over by the output cap of the last call
            else:
                raw = self._raw.read(max(CHUNK // 8, 1) if self._inflate is not None else CHUNK)
                self._consumed += len(raw)
            if self._inflate is None:
                return bytes(raw)
            if not raw:
                if not self._inflate.eof:
                    self._damage = "the gzip stream ends early (file cut short)"
                return bytes(self._inflate.flush()) if not self._inflate.eof else b""
            try:
                # Capped: a trace compresses 10-20x, and the parse of a buffer costs several times its size.
                data: bytes = self._inflate.decompress(raw, CHUNK)
                while self._inflate.eof and self._inflate.unused_data:
                    rest = self._inflate.unused_data  # a second gzip member follows
                    self._inflate = _codec.inflater()
                    data += self._inflate.decompress(rest, CHUNK)
            except _codec.ERRORS as exc:
                self._damage = f"the gzip data is damaged ({exc})"
                self._raw.seek(0, os.SEEK_END)
                self._consumed = self.size
                return b""
            self._inflated += len(data)
            if self._inflated > self._cap:
                self._damage = (f"the gzip data inflates over {MAX_RATIO} times its size, past its share of what "
                                f"a command may inflate (a gzip bomb?): read stopped after {self._inflated >> 20} MB")
                self._raw.seek(0, os.SEEK_END)
                self._consumed = self.size
                return b""
            if data:
                return data

    def _fill(self) -> bool:
        if self._eof:
            return False
        chunk = self._read()
        if not chunk:
            self._eof = True
            return False
        self._buf = self._buf[self._pos:] + chunk
        self._pos = 0
        return True

    def _fill_to(self, held: int) -> bool:
        """Read until ``held`` bytes are buffered from the position (or the file ends); return whether any were read."""
        read = False
        while len(self._buf) - self._pos < held and self._fill():
            read = True
        return read

    def _peek(self) -> int:
        while True:
            buf, pos = self._buf, self._pos
            n = len(buf)
            if pos < n and buf[pos] in _WS:
                pos = _SPACE.match(buf, pos).end()  # type: ignore[union-attr] # matches an empty run too
            self._pos = pos
            if pos < n:
                return buf[pos]
            if not self._fill():
                raise EOFError("the file ends before the trace does")

    def _value(self) -> Any:
        first = self._peek()
        if first not in _STARTS:
            raise DamagedDataError(f"the data is damaged ({bytes([first])!r} cannot start a JSON value)")
        # Decode a window of the buffer, not all of it: most values (a metadata key, one event)
        # are small, and decoding the whole buffer for each cost more than parsing them.
        window = _WINDOW
        while True:
            whole = len(self._buf) - self._pos <= window
            text = self._buf[self._pos:self._pos + window].decode("utf-8", "surrogateescape")
            try:
                value, end = _DECODER.raw_decode(text)
            except RecursionError:
                raise DamagedDataError(f"the data is damaged (JSON nested deeper than {MAX_DEPTH} levels)") from None
            except json.JSONDecodeError as exc:
                if exc.pos < len(text) - _TOKEN and not exc.msg.startswith("Unterminated string"):
                    # Not where a cut token (a number, true, false, null) would fail: more data cannot mend it.
                    raise DamagedDataError(f"the data is damaged ({exc.msg})") from None
                # The value may run past the window or the buffer: widen it, or read more. A value
                # that never ends is damage: read ahead doubling what is held (each try decodes it
                # all), up to MAX_VALUE bytes.
                if not whole:
                    window *= 8
                    continue
                held = len(self._buf) - self._pos
                if held >= MAX_VALUE:
                    raise DamagedDataError(f"the data is damaged (a value runs over {MAX_VALUE >> 20} MB)") from None
                if self._fill_to(min(2 * held, MAX_VALUE)):
                    continue
                raise
            if end == len(text):  # a number at the very end may go on past it
                if not whole:
                    window *= 8
                    continue
                if not self._eof and self._fill():
                    continue
            taken = text[:end].encode("utf-8", "surrogateescape")
            if isinstance(value, (list, dict)) and too_deep(taken):
                raise DamagedDataError(f"the data is damaged (JSON nested deeper than {MAX_DEPTH} levels)")
            self._pos += len(taken)
            return value


def _boundary(buf: bytes, start: int, end: int) -> int:
    """Return the index of the last ``,`` in ``buf[start:end]`` between ``}`` and ``{``, or -1."""
    while True:
        brace = buf.rfind(b"{", start, end)
        if brace <= start:
            return -1
        i = brace - 1
        while i > start and buf[i] in _WS:
            i -= 1
        if buf[i] == 0x2C:  # ,
            j = i - 1
            while j > start and buf[j] in _WS:
                j -= 1
            if buf[j] == 0x7D:  # }
                return i
        end = brace


def is_trace_file(path: str) -> bool:
    """Whether ``path`` names a Chrome trace profctx can read (``*.json`` or ``*.json.gz``)."""
    return path.endswith((".json", ".json.gz"))


def header(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None,
           budget: Budget | None = None) -> tuple[dict[str, Any], float | None]:
    """Return a trace's top-level keys other than the events, and the smallest event ``ts``.

    Reads the whole file (streamed); used when metadata comes after the event array.
    ``root`` and ``budget``: as :class:`TraceStream` takes them.
    """
    meta: dict[str, Any] = {}
    first: float | None = None
    with TraceStream(path, root, budget=budget) as stream:
        for key, value in stream.batches():
            if key != EVENTS:
                meta[key] = value
                continue
            for event in value:
                ts = event.get("ts") if isinstance(event, dict) else None
                if (isinstance(ts, (int, float)) and math.isfinite(ts) and event.get("ph") != "M"
                        and (first is None or ts < first)):
                    first = float(ts)
    return meta, first
