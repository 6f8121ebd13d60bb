"""Create files and folders so that a link or file planted beforehand never redirects a write.

Every file profctx writes is created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` under an
unpredictable temporary name (:func:`temporary_name`) in the folder it belongs to, then renamed
onto its final name (``rename`` replaces a link planted there, never the link's target). Folders
under ``save_path`` are created one component at a time and opened with ``O_NOFOLLOW``: a link
where profctx's folder belongs is refused (``ELOOP``), never followed. ``save_path`` itself is the
user's and may be a link.

Modes: files ``0o666`` and folders ``0o777``, minus the process's umask (what ``open`` and
``mkdir`` give by default, so a team can read each other's traces as before); working folders
(torch's export) are ``0o700``. ``private=True`` in the config makes ``save_path`` itself ``0o700``
(see :func:`profctx.core._config.probe_save_path`), which keeps everything below it to this account.

A temporary's name carries the writing process's pid and host
(``.profctx-tmp-{pid}-{random}-{host}.tmp``), so :func:`sweep` can remove those of dead processes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Final

from ._log import warn_once

#: Flags of a file creation: a fresh file, never through a link, not inherited by child processes.
CREATE: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
#: Flags of a folder opening: a real folder, never through a link at the last component.
FOLDER: Final = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
#: Modes of new files and folders, before the umask.
FILE_MODE: Final = 0o666
FOLDER_MODE: Final = 0o777
#: Every temporary file and working folder profctx creates starts with this.
TEMP_PREFIX: Final = ".profctx-tmp-"
#: A temporary unchanged for this many seconds is stale whoever wrote it (a process on another host).
STALE_AFTER: Final = 24 * 3600.0
#: Bounds of :func:`sweep_tree`: folder depth below the root, and folders visited.
SWEEP_DEPTH: Final = 8
SWEEP_FOLDERS: Final = 20_000

_TEMP = re.compile(r"\.profctx-tmp-(\d+)-[0-9a-f]{16}-(.*)\.tmp")
_HOST_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def _host() -> str:
    return _HOST_UNSAFE.sub("-", os.uname().nodename)[:64] or "x"


def temporary_name() -> str:
    """Return a fresh, unpredictable temporary name: ``.profctx-tmp-{pid}-{16 hex}-{host}.tmp``."""
    return f"{TEMP_PREFIX}{os.getpid()}-{os.urandom(8).hex()}-{_host()}.tmp"


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


def make_folders(root: Path, relative: str | os.PathLike[str] = "") -> Path:
    """Create ``root`` (with parents), then each folder of ``relative`` under it; return ``root / relative``.

    ``root`` is the user's (it may be a link). Below it, a link where a folder belongs raises
    ``OSError`` (``ELOOP``) instead of being followed, a file raises ``FileExistsError`` or
    ``NotADirectoryError``. A folder that exists and belongs to another account is used (every
    file in it is created exclusively and renamed into place); the first one is warned about, once
    per process.
    """
    try:  # most calls find every folder there: open first, create only what is missing
        fd = os.open(root, FOLDER & ~os.O_NOFOLLOW)
    except FileNotFoundError:
        root.mkdir(parents=True, exist_ok=True, mode=FOLDER_MODE)
        fd = os.open(root, FOLDER & ~os.O_NOFOLLOW)
    path = root
    try:
        _check_owner(fd, path)
        for part in Path(relative).parts:
            path = path / part
            try:
                inner = os.open(part, FOLDER, dir_fd=fd)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, FOLDER_MODE, dir_fd=fd)
                inner = open_folder(part, dir_fd=fd, shown=str(path))
            os.close(fd)
            fd = inner
            _check_owner(fd, path)
    finally:
        os.close(fd)
    return path


def _check_owner(fd: int, path: Path) -> None:
    """Warn (once per process, naming the first) about a folder of another account; root's are not."""
    owner = os.fstat(fd).st_uid
    if owner not in (os.geteuid(), 0):  # root can read and replace anything anyway
        warn_once("foreign-folder",
                  "profctx: %s belongs to another account (uid %d); writing into it without following "
                  "links, but that account can read and remove what profctx writes there", path, owner)


@contextlib.contextmanager
def replacing(final: Path) -> Iterator[BinaryIO]:
    """Yield a file to write ``final``'s bytes into; on a clean exit it becomes ``final``.

    The file is a fresh temporary (:func:`temporary_name`) beside ``final``, renamed onto it at
    the end (a link or file already at ``final`` is replaced, its target untouched). On any error
    the temporary is closed and removed before the error propagates, so no disk space stays held.
    """
    folder = open_folder(final.parent)
    name = temporary_name()
    done = False
    try:
        fd = create(name, dir_fd=folder)
        with os.fdopen(fd, "wb") as handle:
            yield handle
        os.replace(name, final.name, src_dir_fd=folder, dst_dir_fd=folder)
        done = True
    finally:
        if not done:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=folder)
        os.close(folder)


def write_file(final: Path, data: bytes) -> None:
    """Write ``data`` as ``final`` through :func:`replacing`."""
    with replacing(final) as handle:
        handle.write(data)


@contextlib.contextmanager
def working_folder(folder: Path) -> Iterator[tuple[int, int, str]]:
    """Yield ``(folder_fd, work_fd, work_path)``: a fresh ``0o700`` folder inside ``folder``, removed at the end.

    For writers that need a path (torch writes its own temporaries named from the path it is
    given): ``work_path`` reaches the working folder through its descriptor
    (``/proc/self/fd/N``) where the system has one, so renaming or replacing the folder meanwhile
    redirects nothing. Move results out with ``os.replace(name, final_name,
    src_dir_fd=work_fd, dst_dir_fd=folder_fd)``.
    """
    parent = open_folder(folder)
    name = temporary_name()
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
        work = open_folder(name, dir_fd=parent)
        try:
            by_fd = f"/proc/self/fd/{work}"
            yield parent, work, by_fd if os.path.isdir(by_fd) else str(folder / name)
        finally:
            with contextlib.suppress(OSError):
                _clear(work)  # through the descriptor: the folder made here, whatever its name is now
            os.close(work)
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=parent)  # only ever an empty folder
    finally:
        os.close(parent)


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
        _clear(inner)
    finally:
        os.close(inner)
    os.rmdir(name, dir_fd=dir_fd)


def _clear(fd: int) -> None:
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
        fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
        try:
            if os.fstat(fd).st_nlink == 1:  # never the bytes of a file that has another name
                os.ftruncate(fd, 0)
        finally:
            os.close(fd)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, under another account
        return True
    return True


def stale(name: str, mtime: float, now: float | None = None) -> bool:
    """Whether a temporary named ``name`` (last changed at ``mtime``) belongs to no live writer.

    Stale: a temporary of a process of this host that is gone, or any unchanged for
    :data:`STALE_AFTER` seconds. Names profctx does not give are never stale.
    """
    match = _TEMP.fullmatch(name)
    if match is None:
        return False
    if (time.time() if now is None else now) - mtime > STALE_AFTER:
        return True
    return match.group(2) == _host() and not _alive(int(match.group(1)))


def sweep(folder: Path | int) -> int:
    """Remove the stale temporaries (see :func:`stale`) this account left in ``folder``; return how many.

    ``folder``: a path or an open folder descriptor. Never raises on I/O errors.
    """
    removed = 0
    try:
        fd = folder if isinstance(folder, int) else open_folder(folder)
    except OSError:
        return 0
    try:
        me = os.geteuid()
        for entry in list(os.scandir(fd)):
            if not entry.name.startswith(TEMP_PREFIX):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
                if info.st_uid != me or not stale(entry.name, info.st_mtime):
                    continue
                remove_tree(entry.name, fd)
                removed += 1
            except OSError:
                continue
    except OSError:
        pass
    finally:
        if not isinstance(folder, int):
            os.close(fd)
    return removed


def sweep_tree(root: Path) -> int:
    """:func:`sweep` ``root`` and the folders below it (links not followed, bounded); return how many went.

    Visits at most :data:`SWEEP_FOLDERS` folders, :data:`SWEEP_DEPTH` deep. Never raises on I/O errors.
    """
    removed = 0
    visited = 0
    todo: list[tuple[Path, int]] = [(root, 0)]
    while todo and visited < SWEEP_FOLDERS:
        folder, depth = todo.pop()
        visited += 1
        removed += sweep(folder)
        if depth >= SWEEP_DEPTH:
            continue
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if not entry.name.startswith(TEMP_PREFIX) and entry.is_dir(follow_symlinks=False):
                        todo.append((Path(entry.path), depth + 1))
        except OSError:
            continue
    return removed


def is_regular(fd: int) -> bool:
    """Whether the open descriptor ``fd`` is a regular file."""
    return stat.S_ISREG(os.fstat(fd).st_mode)
