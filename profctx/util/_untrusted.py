"""Read a run folder as untrusted input: only regular files inside it, never blocking, bounded.

The CLI reads folders copied from clusters and colleagues, and folders others can write to. A
manifest names files; a hostile one names ``/etc/passwd``, ``../../secret``, a FIFO that blocks
any reader forever, or a link out of the folder. Here a name is resolved against the folder
(absolute names and names that climb out are refused), the file is opened without following a
link in its last component and without blocking (``O_NOFOLLOW | O_NONBLOCK``), and after
opening it must be a regular file with one name (a hard link may be a file outside the folder
under a name inside it) whose real path lies inside the folder's real path (a link in any
component, swapped in at any moment, is caught there). Anything else raises
:class:`UnsafeFileError`, an :class:`OSError`, so readers report it as a damaged entry and go on.

What a command inflates is budgeted for the whole command (:class:`Budget`): a folder costs in
proportion to the bytes it holds, however many files or records it has.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

from ._fs import walk

#: JSON nested deeper than this is refused as damaged (a trace event is about 6 deep; Python's
#: own recursion limit, ``repr`` and ``orjson.dumps``'s 254 levels all lie far above it).
MAX_DEPTH: Final = 128

#: Files listed at most in one folder a manifest names (an engine writes a few per capture).
MAX_FILES: Final = 10_000
#: Names listed at most from one folder of a run (the manifest folder of a 10,000-process job holds ~40,000).
MAX_LISTED: Final = 100_000

#: A command inflates at most this many times the compressed bytes it reads...
INFLATE_RATIO: Final = 100
#: ... plus this many bytes over all its files (shared among them by size: a small file may inflate more).
INFLATE_FREE: Final = 64 << 20

_FLAGS: Final = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_BRACKETS: Final = b"[]{}"
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in _BRACKETS)
_STRINGS: Final = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


class UnsafeFileError(OSError):
    """Raise for a file a run folder names that is not read: outside the folder, a link, not a regular file,
    a file with more than one hard link."""


@dataclass(frozen=True)
class Budget:
    """What one command may inflate over all the gzip files it reads: :data:`INFLATE_RATIO` times their
    compressed bytes, plus :data:`INFLATE_FREE` shared among them in proportion to their sizes.

    ``total``: the compressed bytes of every file the command reads (:meth:`of`). Each file's share
    (:meth:`cap`) is fixed before it is read, so files read by a pool of processes keep the bound
    with no shared state. A value: it pickles.
    """

    total: int = 0

    @classmethod
    def of(cls, paths: Iterable[str | os.PathLike[str]]) -> Budget:
        """Return the budget of a command reading ``paths`` (each counted once; one that cannot be seen: 0)."""
        total = 0
        for path in dict.fromkeys(os.fspath(p) for p in paths):
            try:
                total += os.stat(path, follow_symlinks=False).st_size
            except (OSError, ValueError):
                continue
        return cls(total)

    def cap(self, size: int) -> int:
        """Return the bytes a file of ``size`` compressed bytes may inflate to within this budget."""
        size = max(size, 0)
        return INFLATE_RATIO * size + INFLATE_FREE * max(size, 1) // max(self.total, size, 1)


def resolve(root: str | os.PathLike[str], name: str) -> Path:
    """Return the path of a file a manifest names (relative to ``root``), refusing one outside ``root``.

    An absolute name is taken only when it lies inside ``root`` (older engine records give their
    folder so). Raise :class:`UnsafeFileError` for a name outside ``root`` (absolute, climbing out
    with ``..``, or through a link in a folder on the way) or holding a NUL byte. The file itself
    is checked again when opened (:func:`open_regular` given ``root``).
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise UnsafeFileError(f"{name!r}: not a file name profctx reads")
    path = Path(name) if os.path.isabs(name) else Path(root) / name
    if not inside(root, path):
        raise UnsafeFileError(f"{name}: outside the run folder: not read")
    return path


def files_under(root: str | os.PathLike[str], folder: str, limit: int = MAX_FILES) -> list[str]:
    """Return the regular files under ``folder`` (a name :func:`resolve` takes), as paths relative to ``root``.

    Links are neither followed nor listed; at most ``limit`` files, in sorted order. Raise
    :class:`UnsafeFileError` when ``folder`` lies outside ``root``; ``[]`` when it is no folder.
    """
    base = resolve(root, folder)
    if base.is_symlink() or not base.is_dir():
        return []
    found: list[str] = []
    for where, folders, names in os.walk(base):  # never into a linked folder
        folders.sort()
        for name in sorted(names):
            path = os.path.join(where, name)
            if not os.path.islink(path) and os.path.isfile(path):
                found.append(Path(os.path.relpath(path, root)).as_posix())
                if len(found) >= limit:
                    return found
    return found


def names_in(root: str | os.PathLike[str], folder: str, limit: int = MAX_FILES) -> list[str]:
    """Return the names in ``folder`` below ``root``, sorted, listed through a folder descriptor.

    The folder is reached with no link followed at any component below ``root`` (``[]`` when a link,
    a file or nothing is there); the names are listed, not opened: a reader opens each with
    :func:`open_regular`, which refuses links and other non-regular files. At most ``limit`` names.
    """
    try:
        with walk(root, folder, create=False) as held:
            return sorted(entry.name for entry in held.entries(limit))
    except (OSError, ValueError):
        return []


def inside(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> bool:
    """Whether ``path``'s real path (every link resolved) lies inside ``root``'s real path."""
    base = os.path.realpath(root)
    real = os.path.realpath(path)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def open_regular(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> IO[bytes]:
    """Open ``path`` for reading in binary mode if it is a regular file (inside ``root`` when given).

    Never blocks (a FIFO is opened non-blocking, then refused). With ``root`` (a run folder), a
    link as the last component is refused, the opened file must have one name (a hard link to a
    file outside the folder reads as one inside it) and its real path must lie inside ``root``'s;
    without, ``path`` is one the caller chose, links followed. Raise
    :class:`UnsafeFileError` for what is refused, another :class:`OSError` when the file cannot
    be opened (missing, no permission).
    """
    shown = os.fspath(path)
    try:
        fd = os.open(shown, _FLAGS if root is None else _FLAGS | _NOFOLLOW)
    except OSError as exc:
        if root is not None and os.path.islink(shown):
            raise UnsafeFileError(f"{shown}: a symbolic link: not followed") from None
        raise exc
    except ValueError:  # a NUL byte in the name
        raise UnsafeFileError(f"{shown!r}: not a file name profctx reads") from None
    try:
        info = os.fstat(fd)
        mode = info.st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeFileError(f"{shown}: not a regular file ({_kind(mode)}): not read")
        if root is not None and info.st_nlink > 1:
            raise UnsafeFileError(f"{shown}: a file with {info.st_nlink} hard links (another name of it may lie "
                                  "outside the run folder): not read")
        if root is not None and not inside(root, _opened(fd, shown)):
            raise UnsafeFileError(f"{shown}: lies outside the run folder through a link: not read")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _opened(fd: int, shown: str) -> str:
    """Return where the open file ``fd`` really is (through ``/proc`` where there is one, else by its name)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(shown)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a plain file"


def too_deep(text: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether JSON ``text`` (parsed already: valid) nests deeper than ``limit`` levels.

    Cheap for real traces: C-speed passes over its brackets alone, each pass peeling at least
    one level; the strings are cut out first only when a bracket inside one leaves the rest unbalanced.
    """
    brackets = text.translate(None, _NOT_BRACKETS)
    unquoted = False
    passes = 0
    while brackets:
        if passes == limit:
            return True
        peeled = brackets.replace(b"[]", b"").replace(b"{}", b"")
        if len(peeled) == len(brackets):
            if unquoted:
                return False  # not JSON: the parser refused it already
            brackets = _STRINGS.sub(b"", text).translate(None, _NOT_BRACKETS)
            unquoted = True
            passes = 0
            continue
        brackets = peeled
        passes += 1
    return False
