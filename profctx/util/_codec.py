"""Deflate and inflate gzip streams with isal (Intel's ISA-L) when it is installed, else with zlib.

Both write the same format: a gzip member any reader inflates (``gzip``, ``zcat``, Perfetto,
TensorBoard). isal inflates in about a third of zlib's CPU time and deflates, at its fastest
level, in about a fifth (measured: docs/performance.md). It is an optional extra (``cli``); without
it every function here uses the standard library.

Levels are zlib's (1 fast .. 9 small). isal has levels 0 to 3 only, and its level 1 writes files
about as small as zlib's levels 1 to 3; for 4 to 9 (a caller asking for small files) isal's output
is larger than zlib's, so those levels stay with zlib.
"""

from __future__ import annotations

import gzip
import zlib
from typing import IO, Any, Final, cast

_isal: Any = None
_igzip: Any = None
try:
    from isal import igzip as _igzip
    from isal import isal_zlib as _isal
except ImportError:  # pragma: no cover - exercised with the extra absent (tests patch the import)
    pass

#: gzip framing for zlib's and isal's ``wbits``.
GZIP_WBITS: Final = 31
#: The highest zlib level deflated with isal (its level 1).
FAST_LEVELS: Final = 3
#: Errors an inflater raises on damaged data: zlib's, and isal's when it is installed.
ERRORS: Final[tuple[type[Exception], ...]] = (zlib.error,) if _isal is None else (zlib.error, _isal.error)


def name() -> str:
    """Return which library inflates: ``"isal"`` or ``"zlib"``."""
    return "zlib" if _isal is None else "isal"


def inflater() -> Any:
    """Return a decompress object for one gzip member (zlib's interface: ``decompress(data, max_length)``,
    ``unconsumed_tail``, ``unused_data``, ``eof``, ``flush()``); damaged data raises one of :data:`ERRORS`."""
    if _isal is not None:
        return _isal.decompressobj(GZIP_WBITS)
    return zlib.decompressobj(GZIP_WBITS)


def deflater(level: int) -> Any:
    """Return a compress object writing one gzip member at zlib ``level`` (``compress(data)``, ``flush()``)."""
    if _isal is not None and 1 <= level <= FAST_LEVELS:
        return _isal.compressobj(1, _isal.DEFLATED, GZIP_WBITS)
    return zlib.compressobj(level, zlib.DEFLATED, GZIP_WBITS)


def gzip_writer(fileobj: IO[bytes], level: int) -> IO[bytes]:
    """Return a binary file object that gzips what is written to it into ``fileobj`` (closing it finishes the
    member, not ``fileobj``); the header carries no file name."""
    if _igzip is not None and 1 <= level <= FAST_LEVELS:
        return cast(IO[bytes], _igzip.IGzipFile(filename="", mode="wb", compresslevel=1, fileobj=fileobj))
    return cast(IO[bytes], gzip.GzipFile(filename="", mode="wb", compresslevel=level, fileobj=fileobj))


def compress(data: bytes, level: int) -> bytes:
    """Return ``data`` as one gzip member at zlib ``level``."""
    zipper = deflater(level)
    out: bytes = zipper.compress(data) + zipper.flush()
    return out


def decompress(data: bytes) -> bytes:
    """Return the inflated bytes of every gzip member in ``data``; damaged data raises one of :data:`ERRORS`.

    Unbounded: for a file of unknown origin stream it with :func:`inflater` and a ``max_length``.
    """
    out = bytearray()
    while data:
        unzip = inflater()
        out += unzip.decompress(data)
        if not unzip.eof:
            raise zlib.error("the gzip stream ends early")
        data = unzip.unused_data
    return bytes(out)
