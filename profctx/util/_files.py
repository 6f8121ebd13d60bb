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

Built on :mod:`profctx.util._fs` (held folder descriptors): pass a held folder (``at=``, a
:class:`~profctx.util._fs.Folder`) wherever the folder was walked to, so nothing is reopened by path.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Final

from ._fs import CREATE as CREATE
from ._fs import FILE_MODE as FILE_MODE
from ._fs import FOLDER as FOLDER
from ._fs import FOLDER_MODE as FOLDER_MODE
from ._fs import TEMP_PREFIX as TEMP_PREFIX
from ._fs import Folder, clear, host_tag, walk
from ._fs import create as create
from ._fs import open_folder as open_folder
from ._fs import remove_tree as remove_tree
from ._fs import temporary_name as temporary_name

#: A temporary unchanged for this many seconds is stale whoever wrote it (a process on another host).
STALE_AFTER: Final = 24 * 3600.0
#: Bounds of :func:`sweep_tree`: folder depth below the root, and folders visited.
SWEEP_DEPTH: Final = 8
SWEEP_FOLDERS: Final = 20_000

_TEMP = re.compile(r"\.profctx-tmp-(\d+)-[0-9a-f]{16}-(.*)\.tmp")


def make_folders(root: Path, relative: str | os.PathLike[str] = "") -> Path:
    """Create ``root`` (with parents), then each folder of ``relative`` under it; return ``root / relative``.

    The walk of :func:`profctx.util._fs.walk`, its descriptor closed: for callers that only need the
    folders to exist. A writer uses ``walk`` and writes through the :class:`~profctx.util._fs.Folder`
    it holds instead, so nothing is reopened by path.
    """
    with walk(root, relative) as folder:
        return folder.path


@contextlib.contextmanager
def replacing(final: Path, *, at: Folder | None = None) -> Iterator[BinaryIO]:
    """Yield a file to write ``final``'s bytes into; on a clean exit it becomes ``final``.

    ``at``: the held folder ``final`` lies in (its name is then the only part of ``final`` used);
    without it the folder is opened by path (its last component not followed), for files outside
    any save path. See :meth:`profctx.util._fs.Folder.replacing`.
    """
    if at is not None:
        with at.replacing(final.name) as handle:
            yield handle
        return
    with Folder(open_folder(final.parent), final.parent) as folder, folder.replacing(final.name) as handle:
        yield handle


def write_file(final: Path, data: bytes, *, at: Folder | None = None) -> None:
    """Write ``data`` as ``final`` through :func:`replacing`."""
    with replacing(final, at=at) as handle:
        handle.write(data)


@contextlib.contextmanager
def working_folder(folder: Path | Folder) -> Iterator[tuple[int, int, str]]:
    """Yield ``(folder_fd, work_fd, work_path)``: a fresh ``0o700`` folder inside ``folder``, removed at the end.

    For writers that need a path (torch writes its own temporaries named from the path it is
    given): ``work_path`` reaches the working folder through its descriptor
    (``/proc/self/fd/N``) where the system has one, so renaming or replacing the folder meanwhile
    redirects nothing. Move results out with ``os.replace(name, final_name,
    src_dir_fd=work_fd, dst_dir_fd=folder_fd)``. ``folder``: a held folder (used as it is) or a
    path (opened, its last component not followed).
    """
    held = folder if isinstance(folder, Folder) else Folder(open_folder(folder), folder)
    parent = held.fd
    name = temporary_name()
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
        work = open_folder(name, dir_fd=parent)
        try:
            by_fd = f"/proc/self/fd/{work}"
            yield parent, work, by_fd if os.path.isdir(by_fd) else str(held.path / name)
        finally:
            with contextlib.suppress(OSError):
                clear(work)  # through the descriptor: the folder made here, whatever its name is now
            os.close(work)
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=parent)  # only ever an empty folder
    finally:
        if held is not folder:
            held.close()


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
    return match.group(2) == host_tag() and not _alive(int(match.group(1)))


def sweep(folder: Path | Folder | int) -> int:
    """Remove the stale temporaries (see :func:`stale`) this account left in ``folder``; return how many.

    ``folder``: a path, a held folder or an open folder descriptor. Only entries the descriptor
    lists, named as profctx names temporaries, of this account and stale are removed (a link
    among them is unlinked, never followed). Never raises on I/O errors.
    """
    removed = 0
    try:
        fd = folder.fd if isinstance(folder, Folder) else folder if isinstance(folder, int) else open_folder(folder)
    except OSError:
        return 0
    try:
        me = os.geteuid()
        for entry in list(os.scandir(fd)):
            if not entry.name.startswith(TEMP_PREFIX):
                continue
            try:
                info = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
                if info.st_uid != me or not stale(entry.name, info.st_mtime):
                    continue
                remove_tree(entry.name, fd)
                removed += 1
            except OSError:
                continue
    except OSError:
        pass
    finally:
        if isinstance(folder, Path):
            os.close(fd)
    return removed


def sweep_tree(root: Path | Folder) -> int:
    """:func:`sweep` ``root`` and the folders below it (walked by descriptor, links not followed, bounded).

    Visits at most :data:`SWEEP_FOLDERS` folders, :data:`SWEEP_DEPTH` deep. Never raises on I/O errors.
    """
    try:
        top = root if isinstance(root, Folder) else walk(root, create=False)
    except OSError:
        return 0
    removed = 0
    visited = 0
    todo: list[tuple[Folder, int]] = [(top, 0)]
    try:
        while todo and visited < SWEEP_FOLDERS:
            folder, depth = todo.pop()
            try:
                visited += 1
                removed += sweep(folder)
                if depth >= SWEEP_DEPTH:
                    continue
                for entry in folder.entries():
                    if not entry.name.startswith(TEMP_PREFIX) and stat.S_ISDIR(entry.info.st_mode):
                        with contextlib.suppress(OSError):
                            todo.append((folder.sub(entry.name, create=False), depth + 1))
            except OSError:
                continue
            finally:
                if folder is not top:
                    folder.close()
    finally:
        for folder, _ in todo:
            if folder is not top:
                folder.close()
        if top is not root:
            top.close()
    return removed


def is_regular(fd: int) -> bool:
    """Whether the open descriptor ``fd`` is a regular file."""
    return stat.S_ISREG(os.fstat(fd).st_mode)
