"""Reach every file under a save path or run folder from a folder descriptor profctx holds.

This module and :mod:`profctx.util._files` (temporaries, sweeps) and :mod:`profctx.util._untrusted`
(the CLI's reads) are the only ones that open, create, list, rename or delete a file inside a save
path or run folder (``tests/test_file_access.py`` enforces that). The rules:

- **A walk, never a path.** :func:`walk` opens the save path (the user's: it may be a link) and then
  each folder below it with ``O_DIRECTORY | O_NOFOLLOW`` relative to the one before (``dir_fd``),
  creating what is missing; a link anywhere a folder belongs raises ``OSError`` (``ELOOP``). The
  :class:`Folder` it returns holds the descriptor: everything done in it (create, rename, list,
  delete, read) names an entry of that descriptor, so a folder renamed away and replaced by a link
  after the walk redirects nothing.
- **Created exclusively.** A file is created ``O_CREAT | O_EXCL | O_NOFOLLOW`` under an
  unpredictable temporary name, written, then renamed onto its final name inside the same held
  folder (``rename`` replaces a link planted at the final name, never its target).
- **Deleted only when checked.** :meth:`Folder.remove` deletes an entry the descriptor lists only
  when its name matches the caller's pattern, it is a regular file (``lstat``: a link is never
  followed) and, unless told otherwise, it belongs to this account.
- **Checked after opening.** :meth:`Folder.open_read` opens without following a link and without
  blocking, then checks the descriptor: a regular file, of an allowed owner, with one link.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Final, NamedTuple

from ._log import warn_once

_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
#: Flags of a file creation: a fresh file, never through a link, not inherited by child processes.
CREATE: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
#: Flags of a folder opening: a real folder, never through a link at the last component.
FOLDER: Final = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW | _CLOEXEC
#: Flags of a read: never through a link, never blocking (a FIFO), never a controlling terminal.
READ: Final = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | _CLOEXEC
#: Modes of new files and folders, before the umask.
FILE_MODE: Final = 0o666
FOLDER_MODE: Final = 0o777
#: Every temporary file and working folder profctx creates starts with this.
TEMP_PREFIX: Final = ".profctx-tmp-"
#: Entries listed at most by :meth:`Folder.entries` (a hostile folder may hold millions).
MAX_ENTRIES: Final = 100_000

_HOST_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def host_tag() -> str:
    """Return this host's name as it appears in temporary names (letters, digits, ``_`` and ``-``)."""
    return _HOST_UNSAFE.sub("-", os.uname().nodename)[:64] or "x"


def temporary_name() -> str:
    """Return a fresh, unpredictable temporary name: ``.profctx-tmp-{pid}-{16 hex}-{host}.tmp``."""
    return f"{TEMP_PREFIX}{os.getpid()}-{os.urandom(8).hex()}-{host_tag()}.tmp"


def create(name: str | os.PathLike[str], *, dir_fd: int | None = None, mode: int | None = None) -> int:
    """Create ``name`` exclusively, never through a link, for writing; return its descriptor.

    Raise ``FileExistsError`` when anything (a file, a link) is there already.
    """
    return os.open(name, CREATE, FILE_MODE if mode is None else mode, dir_fd=dir_fd)


def open_folder(path: str | os.PathLike[str], *, dir_fd: int | None = None, shown: str | None = None) -> int:
    """Open the folder ``path`` (its last component not followed if a link); return its descriptor.

    Raise ``OSError`` (``ELOOP``) when a link is there, ``NotADirectoryError`` for a file; the error
    names ``shown`` (default ``path``).
    """
    try:
        return os.open(path, FOLDER, dir_fd=dir_fd)
    except OSError as exc:
        shown = str(path) if shown is None else shown
        link = False
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            with contextlib.suppress(OSError):
                link = stat.S_ISLNK(os.lstat(path, dir_fd=dir_fd).st_mode)
        if link:
            raise OSError(errno.ELOOP, "a link where profctx's folder belongs (not followed)", shown) from None
        raise type(exc)(exc.errno, exc.strerror, shown) from None


def check_owner(fd: int, path: Path) -> None:
    """Warn (once per process, naming the first) about a folder of another account; root's are not."""
    owner = os.fstat(fd).st_uid
    if owner not in (os.geteuid(), 0):  # root can read and replace anything anyway
        warn_once("foreign-folder",
                  "profctx: %s belongs to another account (uid %d); writing into it without following "
                  "links, but that account can read and remove what profctx writes there", path, owner)


class Entry(NamedTuple):
    """One entry of a held folder, as :meth:`Folder.entries` found it (``info``: ``lstat``, links not followed)."""

    name: str
    info: os.stat_result


class Folder:
    """An open folder: every file in it is reached through the descriptor ``fd``, never by path again.

    ``path`` is for messages and for the paths recorded in the manifest only. Close it (or use it
    as a context manager); :meth:`close` may be called more than once. ``owned=False``: the
    descriptor is someone else's to close (never closed here).
    """

    __slots__ = ("fd", "owned", "path")

    def __init__(self, fd: int, path: Path, *, owned: bool = True) -> None:
        self.fd = fd
        self.path = path
        self.owned = owned

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # a folder its holder dropped: closed when collected
            self.close()

    def __copy__(self) -> Folder:
        return self  # one descriptor, one owner: a copy closing it too would close another file's number

    def __deepcopy__(self, memo: object) -> Folder:
        return self

    def __reduce__(self) -> str | tuple[object, ...]:
        raise TypeError("a held folder (an open descriptor) cannot be pickled")

    def __repr__(self) -> str:
        return f"Folder({str(self.path)!r}, fd={self.fd})"

    def close(self) -> None:
        """Close the descriptor (once)."""
        fd, self.fd = self.fd, -1
        if fd >= 0 and self.owned:
            os.close(fd)

    def sub(self, relative: str | os.PathLike[str], *, create: bool = True) -> Folder:
        """Return the folder ``relative`` below this one, walked a component at a time (see :func:`walk`)."""
        return _walk_from(os.dup(self.fd), self.path, relative, create=create)

    def still_at(self, root: str | os.PathLike[str], relative: str | os.PathLike[str]) -> bool:
        """Whether walking ``relative`` from ``root`` again (no link followed) reaches this very folder.

        ``False`` once it was renamed away, replaced (by a link or another folder) or removed.
        """
        try:
            with walk(root, relative, create=False) as now:
                mine, found = os.fstat(self.fd), os.fstat(now.fd)
        except OSError:
            return False
        return (mine.st_dev, mine.st_ino) == (found.st_dev, found.st_ino)

    def entries(self, limit: int = MAX_ENTRIES) -> list[Entry]:
        """List the folder through its descriptor (at most ``limit`` entries); an entry gone meanwhile is left out."""
        found: list[Entry] = []
        with os.scandir(self.fd) as listing:
            for item in listing:
                with contextlib.suppress(OSError):
                    found.append(Entry(item.name, os.stat(item.name, dir_fd=self.fd, follow_symlinks=False)))
                if len(found) >= limit:
                    break
        return found

    def files(self, limit: int = 10_000, depth: int = 8) -> list[tuple[str, os.stat_result]]:
        """Return the regular files below this folder (relative ``/`` paths, sorted) with their ``lstat``.

        Walked by descriptor: links are neither followed nor listed; at most ``limit`` files,
        ``depth`` folders deep. Folders that cannot be opened are left out.
        """
        found: list[tuple[str, os.stat_result]] = []
        todo: list[tuple[str, Folder]] = [("", self)]
        try:
            while todo and len(found) < limit:
                prefix, folder = todo.pop()
                try:
                    for entry in sorted(folder.entries(limit)):
                        if stat.S_ISREG(entry.info.st_mode):
                            found.append((prefix + entry.name, entry.info))
                        elif stat.S_ISDIR(entry.info.st_mode) and prefix.count("/") < depth:
                            with contextlib.suppress(OSError):
                                todo.append((f"{prefix}{entry.name}/", folder.sub(entry.name, create=False)))
                finally:
                    if folder is not self:
                        folder.close()
        finally:
            for _, folder in todo:
                if folder is not self:
                    folder.close()
        return sorted(found)[:limit]

    def lstat(self, name: str) -> os.stat_result:
        """Return ``name``'s status in this folder, a link not followed."""
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    def create(self, name: str, mode: int | None = None) -> int:
        """Create ``name`` here exclusively (see :func:`create`); return its descriptor."""
        return create(name, dir_fd=self.fd, mode=mode)

    @contextlib.contextmanager
    def replacing(self, name: str) -> Iterator[BinaryIO]:
        """Yield a file whose bytes become ``name`` in this folder on a clean exit.

        Written under a fresh temporary name, renamed onto ``name`` at the end; on any error (an
        interrupt included) the temporary is removed before the error propagates.
        """
        temporary = temporary_name()
        done = False
        try:
            with os.fdopen(self.create(temporary), "wb") as handle:
                yield handle
            os.replace(temporary, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            done = True
        finally:
            if not done:
                with contextlib.suppress(OSError):
                    os.unlink(temporary, dir_fd=self.fd)

    def write(self, name: str, data: bytes) -> Path:
        """Write ``data`` as ``name`` here through :meth:`replacing`; return its path (for records)."""
        with self.replacing(name) as handle:
            handle.write(data)
        return self.path / name

    def move(self, name: str, into: Folder, final: str) -> None:
        """Rename ``name`` here onto ``final`` in ``into``, both by descriptor (a link at ``final`` is replaced)."""
        os.replace(name, final, src_dir_fd=self.fd, dst_dir_fd=into.fd)

    def remove(self, name: str, pattern: re.Pattern[str], *, owner: int | None = -1,
               older_than: float | None = None) -> bool:
        """Delete the regular file ``name`` of this folder if it passes every check; return whether it went.

        Checked first (``lstat`` through the descriptor, a link never followed): ``name`` matches
        ``pattern`` in full, it is a regular file, it belongs to ``owner`` (``-1``: this account;
        ``None``: any) and, given ``older_than`` (a time), it was last changed before it.
        """
        if pattern.fullmatch(name) is None:
            return False
        try:
            info = self.lstat(name)
        except OSError:
            return False
        if not stat.S_ISREG(info.st_mode):
            return False
        if owner is not None and info.st_uid != (os.geteuid() if owner == -1 else owner):
            return False
        if older_than is not None and info.st_mtime >= older_than:
            return False
        try:
            os.unlink(name, dir_fd=self.fd)
        except OSError:
            return False
        return True

    def remove_tree(self, name: str) -> None:
        """Remove ``name`` here: a file or link unlinked, a folder emptied (links not followed) and removed."""
        remove_tree(name, self.fd)

    def open_read(self, name: str, *, owners: tuple[int, ...] | None = None) -> int:
        """Open the regular file ``name`` here for reading; return its descriptor.

        Never through a link, never blocking. After opening, the descriptor must be a regular file
        with one link (a hard link to a file elsewhere is refused) and, given ``owners``, belong to
        one of them; anything else raises ``OSError`` naming the reason.
        """
        fd = os.open(name, READ, dir_fd=self.fd)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise OSError(errno.EINVAL, "not a regular file: not read", str(self.path / name))
            if info.st_nlink != 1:
                raise OSError(errno.EMLINK, "a file with more than one link: not read", str(self.path / name))
            if owners is not None and info.st_uid not in owners:
                raise OSError(errno.EPERM, f"a file of another account (uid {info.st_uid}): not read",
                              str(self.path / name))
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read(self, name: str, limit: int, *, owners: tuple[int, ...] | None = None) -> bytes:
        """Return at most ``limit`` bytes of ``name`` here, opened by :meth:`open_read`."""
        with os.fdopen(self.open_read(name, owners=owners), "rb") as handle:
            return handle.read(limit)


def walk(root: str | os.PathLike[str], relative: str | os.PathLike[str] = "", *, create: bool = True) -> Folder:
    """Open ``root`` (created with parents if missing), then each folder of ``relative`` below it; return the last.

    ``root`` is the user's save path or run folder (it may be a link). Below it each component is
    opened with ``O_DIRECTORY | O_NOFOLLOW`` relative to the one before and, with ``create``,
    made when missing: a link where a folder belongs raises ``OSError`` (``ELOOP``), a file
    ``NotADirectoryError``, a missing folder without ``create`` ``FileNotFoundError``. A folder
    of another account is used (everything in it is created exclusively) and warned about once.
    """
    base = Path(root)
    try:  # most calls find every folder there: open first, create only what is missing
        fd = os.open(base, FOLDER & ~os.O_NOFOLLOW)
    except FileNotFoundError:
        if not create:
            raise
        base.mkdir(parents=True, exist_ok=True, mode=FOLDER_MODE)
        fd = os.open(base, FOLDER & ~os.O_NOFOLLOW)
    return _walk_from(fd, base, relative, create=create)


def _walk_from(fd: int, path: Path, relative: str | os.PathLike[str], *, create: bool) -> Folder:
    """Walk ``relative`` from the descriptor ``fd`` (taken over: closed on failure, or held by the result)."""
    try:
        check_owner(fd, path)
        for part in Path(relative).parts:
            if part in ("..", "/") or os.sep in part:
                raise OSError(errno.EINVAL, "not a folder name profctx walks", str(path / part))
            path = path / part
            try:
                inner = os.open(part, FOLDER, dir_fd=fd)
            except OSError as exc:
                if exc.errno != errno.ENOENT or not create:
                    inner = open_folder(part, dir_fd=fd, shown=str(path))
                else:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, FOLDER_MODE, dir_fd=fd)
                    inner = open_folder(part, dir_fd=fd, shown=str(path))
            os.close(fd)
            fd = inner
            check_owner(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return Folder(fd, path)


def remove_tree(name: str, dir_fd: int) -> None:
    """Remove ``name`` in the folder ``dir_fd``: a file or link is unlinked, a folder emptied and removed.

    Links inside are removed, never followed; files inside are cut to nothing first (see :func:`_empty`).
    """
    try:
        inner = open_folder(name, dir_fd=dir_fd)
    except OSError:
        os.unlink(name, dir_fd=dir_fd)
        return
    try:
        clear(inner)
    finally:
        os.close(inner)
    os.rmdir(name, dir_fd=dir_fd)


def clear(fd: int) -> None:
    """Remove everything inside the open folder ``fd`` (see :func:`remove_tree`)."""
    for entry in list(os.scandir(fd)):
        if entry.is_dir(follow_symlinks=False):
            remove_tree(entry.name, fd)
            continue
        if entry.is_file(follow_symlinks=False):
            _empty(entry.name, fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry.name, dir_fd=fd)


def _empty(name: str, dir_fd: int) -> None:
    """Cut the file ``name`` to nothing: its space is freed now, even if a library still holds it open.

    torch keeps the file it failed to write (a full disk) open until its profiler object is
    collected; removing the name alone would leave the space in use until then.
    """
    with contextlib.suppress(OSError):
        fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, dir_fd=dir_fd)
        try:
            if os.fstat(fd).st_nlink == 1:  # never the bytes of a file that has another name
                os.ftruncate(fd, 0)
        finally:
            os.close(fd)
