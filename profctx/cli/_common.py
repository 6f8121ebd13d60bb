"""What the subcommands share: opening a run folder, filters, colour, tables, sizes and times."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any, Final, TextIO

from ..core._layout import MANIFEST_DIR
from ..core._plan import role_matches
from ..core._status import LISTED
from ..manifest import MAX_LINE, CaptureRecord, ManifestReader, in_groups, latest_run, repeats_text, runs
from ..records._job import Member, hole, missing
from ..util._untrusted import open_regular

#: Exit codes of every subcommand.
OK: Final = 0
FINDINGS: Final = 1
USAGE: Final = 2

STATUSES: Final = LISTED


@contextlib.contextmanager
def terminable() -> Iterator[None]:
    """Turn SIGTERM into ``SystemExit(143)`` inside the block, so a writer ended so removes its temporary.

    Python's default for SIGTERM ends the process at once, with no ``finally`` run; only the main
    thread can set a handler (elsewhere the block runs unchanged).
    """
    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class UsageError(Exception):
    """Raise for a bad argument or a folder that is not a profctx run; exits with code 2."""


def guarded(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Wrap a subcommand handler so a :class:`UsageError` prints plainly and exits 2.

    While it runs, what it prints has its control characters escaped (see :func:`escaped_output`).
    """

    def run(args: argparse.Namespace) -> int:
        with escaped_output():
            return _run(args)

    def _run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except UsageError as exc:
            print(f"profctx {args.command}: {exc}", file=sys.stderr)
            return USAGE
        except BrokenPipeError:
            # The reader went away (``profctx ls DIR | head``): stop quietly, as Python's docs advise.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return FINDINGS

    return run


#: Characters a terminal may act on rather than show: C0 but tab and newline, DEL, C1, and the Unicode
#: controls that reorder or break lines (bidirectional overrides and isolates, line and paragraph separators).
_CONTROLS: Final = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
_CONTROL: Final = re.compile(f"[\t\n{_CONTROLS}]")
#: What profctx itself sends a terminal (rich's colours and progress bar), kept by :func:`escaped_output`:
#: colour (SGR), erase line, cursor up, hide and show the cursor, carriage return.
_ATTENTION: Final = re.compile(f"[{_CONTROLS}]")
_OWN: Final = re.compile(f"(\x1b\\[[0-9;]*[mKA]|\x1b\\[\\?25[lh]|[\r])|[{_CONTROLS}]")


def escape(text: str) -> str:
    """Return ``text`` with every control character (tab and newline too) written as ``\\uXXXX``.

    For a value read from a run folder (a role, a host, an error, a file name) shown in one line or
    one table cell: a terminal then shows it, and never acts on it (window title, clear screen,
    clipboard). Inside a JSON string the escape reads back as the same character.
    """
    return _CONTROL.sub(_code, text) if _CONTROL.search(text) else text


def _plain(text: str) -> bool:
    """Whether ``text`` holds no control character but tab and newline (fast for the ASCII of a large table)."""
    if text.isascii():
        return text.replace("\n", "").replace("\t", "").isprintable()
    return _ATTENTION.search(text) is None


def _code(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def _kept(match: re.Match[str]) -> str:
    return match.group() if match.group(1) else f"\\u{ord(match.group()):04x}"


class _Escaping:
    """A text stream that writes to ``stream`` with control characters escaped, but profctx's own (see ``_OWN``)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(text if _plain(text) else _OWN.sub(_kept, text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def escaped_output() -> Iterator[None]:
    """Escape control characters in everything printed to stdout and stderr while the block runs.

    A second guard behind :func:`escape`: a value read from a run folder that reaches a message
    unescaped still cannot drive the terminal. Newlines, tabs, and the colour and progress-bar
    sequences profctx prints through ``rich`` pass; JSON output stays valid JSON of the same values.
    """
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Escaping(out), _Escaping(err)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


@dataclass
class Run:
    """A profctx save_path and its manifest: one typed record per capture, by start time."""

    path: Path
    records: list[CaptureRecord]
    damaged: list[str]
    runs: list[str]
    #: What the reader left out as repeats (duplicate shards, a file two captures name).
    repeats: list[str] = field(default_factory=list)


def lacking(folder: str | Path, run: str | None = None) -> str | None:
    """Return the line naming the processes the runs of ``folder`` (of ``run``) expect and have no shard of."""
    members = shard_members(folder, run)
    found = missing(members, selected_only=True)
    several = len({m.run for m in members}) > 1
    return hole([f"{m.name()} of run {m.run}" if several else m.name() for m in found], "capture record")


def shard_members(folder: str | Path, run: str | None = None) -> list[Member]:
    """Return the process of each manifest shard of ``folder`` (of ``run``), engines left out.

    Reads the first line of each shard (one shard per process; its first record says who the
    process is, its ``rank R of W`` and the ranks its configuration selects).
    """
    reader = ManifestReader(folder, run)
    members = []
    for shard in reader.shards():
        try:
            with open_regular(shard, folder) as handle:  # untrusted folder: a FIFO must not block
                line = handle.readline(MAX_LINE + 1)
        except OSError:
            continue
        record = reader._parse(shard.name, 1, line.rstrip(b"\r\n"))
        if record is None:
            continue
        typed = CaptureRecord(record)
        if typed.is_engine:
            continue
        selected = typed.selected
        members.append(Member(typed.run, typed.group, typed.rank, typed.world_size,
                              selected if selected is None or isinstance(selected, tuple) else "all"))
    return members


def tell_repeats(command: str, reader: ManifestReader) -> None:
    """Print, on stderr, what the reader left out as repeats (see :func:`repeats_text`)."""
    for line in repeats_text(reader):
        print(f"{command}: {escape(line)}", file=sys.stderr)


def check_folder(folder: str) -> Path:
    """Return ``folder`` as a path if it holds a profctx manifest; raise :class:`UsageError` saying what is wrong."""
    path = Path(folder).expanduser()
    if not path.exists():
        raise UsageError(f"{folder}: no such folder")
    if not path.is_dir():
        raise UsageError(f"{folder}: not a folder")
    if not ManifestReader(path).shards():
        empty = no_capture_yet(path)
        if empty is not None:
            raise UsageError(f"{folder}: {empty}")
        hint = ""
        for parent in path.absolute().parents:
            if (parent / MANIFEST_DIR).is_dir():
                hint = f"; it lies inside the profctx run {parent}: pass that folder"
                break
        raise UsageError(
            f"{folder}: not a profctx folder (no manifest {MANIFEST_DIR}/*.jsonl inside)"
            + (hint or "; pass the save_path given to profctx.configure()")
        )
    return path


def no_capture_yet(path: Path) -> str | None:
    """Return what to say of a folder ``profctx.configure()`` was given that holds no capture record yet."""
    folder = path / MANIFEST_DIR
    if folder.is_symlink() or not folder.is_dir() or ManifestReader(path).shards():
        return None
    return ("a profctx folder with no capture yet: profctx.configure() was given this save_path, and no process "
            "has recorded a capture here (the window not reached yet, a role filter that matches no role, or "
            "no selected rank); a process that ends without capturing logs a warning saying which")


def stream_run(folder: str, args: argparse.Namespace | None = None, *, run: str | None = None,
               lean: bool = False) -> tuple[Path, ManifestReader, Iterator[CaptureRecord]]:
    """Return the folder, its manifest reader and an iterator over the captures that pass the filters.

    Records stream shard by shard, unsorted; ``reader.damaged`` is complete once the iterator is done.
    ``lean``: see :class:`ManifestReader` (typed fields only).
    Raise :class:`UsageError` as :func:`open_run` does.
    """
    path, reader = _reader(folder, args, run, lean)
    if args is None or not _filtering(args):
        return path, reader, iter(reader)
    keep = matcher(args)
    return path, reader, (r for r in reader if keep(r))


def stream_merged(folder: str, args: argparse.Namespace, *,
                  lean: bool = False) -> tuple[Path, ManifestReader, Iterator[dict[str, Any]]]:
    """Return what :func:`stream_run` returns, the captures as merged raw dicts (see :meth:`ManifestReader.merged`).

    For a caller that reads a few keys of many captures without a typed record each.
    """
    path, reader = _reader(folder, args, None, lean)
    if not _filtering(args):
        return path, reader, reader.merged()
    keep = matcher(args)
    return path, reader, (r for r in reader.merged() if keep(CaptureRecord(r)))


def _filtering(args: argparse.Namespace) -> bool:
    return any(getattr(args, name, None) for name in ("step", "rank", "group", "status", "role"))


def _reader(folder: str, args: argparse.Namespace | None, run: str | None,
            lean: bool) -> tuple[Path, ManifestReader]:
    path = check_folder(folder)
    wanted = run if run is not None else getattr(args, "run", None)
    if wanted == "latest":
        wanted = latest_run(path)
    if wanted is not None and not any(True for _ in ManifestReader(path, wanted).lines()):
        known = runs(list(ManifestReader(path)))
        raise UsageError(f"--run {wanted}: no such run in {folder} (runs: {', '.join(known) or 'none'})")
    return path, ManifestReader(path, wanted, lean=lean)


def open_run(folder: str, args: argparse.Namespace | None = None, *, run: str | None = None) -> Run:
    """Return the captures under ``folder`` that pass the filters of ``args`` (see :func:`add_filters`).

    Filters are applied while the manifest streams, so only chosen records are held. ``run``
    (or ``args.run``) keeps one run; ``"latest"`` means the run that started last.
    Raise :class:`UsageError` when the folder is not a profctx run or the run is unknown.
    """
    path, reader, chosen = stream_run(folder, args, run=run)
    records = sorted(chosen, key=lambda r: (r.begin, -1 if r.rank is None else r.rank))
    return Run(path, records, reader.damaged, runs(records), repeats_text(reader))


def add_filters(parser: argparse.ArgumentParser, *, run_default: str | None = None) -> None:
    """Add ``--run``, ``--step``, ``--role``, ``--rank``, ``--group``, ``--status`` to ``parser``."""
    parser.add_argument("--run", metavar="ID", default=run_default,
                        help="only captures of run ID ('latest': the run that started last)"
                             + (f"; default {run_default}" if run_default else "; default every run"))
    parser.add_argument("--step", type=int, action="append", metavar="S",
                        help="only captures covering step S (repeatable)")
    parser.add_argument("--role", action="append", metavar="PATTERN",
                        help="only roles matching PATTERN (fnmatch, on the role name or path; 'step' for "
                             "whole-step captures; repeatable)")
    parser.add_argument("--rank", type=int, action="append", metavar="R", help="only rank R (repeatable)")
    parser.add_argument("--group", action="append", metavar="NAME",
                        help="only processes of worker group NAME ('driver': those outside every group; repeatable)")
    parser.add_argument("--status", choices=STATUSES, action="append", help="only this status (repeatable)")


def matcher(args: argparse.Namespace) -> Callable[[CaptureRecord], bool]:
    """Return the predicate of the filters of :func:`add_filters` given in ``args``."""
    steps = set(getattr(args, "step", None) or ())
    ranks = getattr(args, "rank", None)
    groups = getattr(args, "group", None)
    statuses = getattr(args, "status", None)
    patterns = getattr(args, "role", None)

    def keep(record: CaptureRecord) -> bool:
        if steps and not steps.intersection(record.steps):
            return False
        if ranks is not None and record.rank not in ranks:
            return False
        if groups is not None and not in_groups(record, groups):
            return False
        if statuses and record.status not in statuses:
            return False
        return not patterns or role_matches(patterns, tuple((record.role or "step").split("/")))

    return keep


class Style:
    """Colour for a stream, through ``rich``: on only for a terminal, off when ``NO_COLOR`` is set.

    Without ``rich`` installed (the ``cli`` extra), text stays plain.
    """

    _STATUS: Final = {"ok": "green", "failed": "red", "skipped": "yellow", "open": "blue", "interrupted": "magenta"}

    def __init__(self, stream: TextIO) -> None:
        # rich takes a stream for a terminal only when it is a tty or the environment says so:
        # otherwise it is not imported (a tenth of a second of a large listing to a file).
        self.console = console(stream) if _terminal_possible(stream) else None
        self.enabled = self.console is not None and self.console.is_terminal and not self.console.no_color

    def __call__(self, text: str, colour: str) -> str:
        """Return ``text`` in ``colour`` (a rich style: ``red``, ``dim``, ``bold``...) when colour is on."""
        if not self.enabled or self.console is None or not colour:
            return text
        from rich.text import Text

        with self.console.capture() as captured:
            self.console.print(Text(text, style=colour), end="", soft_wrap=True)
        return str(captured.get())

    def status(self, status: str) -> str:
        """Return a capture status coloured by its meaning."""
        return self(status, self._STATUS.get(status, ""))


def _terminal_possible(stream: TextIO) -> bool:
    if os.environ.get("TTY_COMPATIBLE") == "1" or os.environ.get("FORCE_COLOR"):
        return True
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream: rich says "not a terminal" too
        return False


def console(stream: TextIO) -> Any:
    """Return a ``rich`` console writing to ``stream`` (``NO_COLOR`` and pipes honoured), or ``None``."""
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console(file=stream, highlight=False, soft_wrap=True)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, right: Iterable[int] = (),
          paint: Callable[[int, str], str] | None = None, skip: int = 0, escaped: bool = False) -> str:
    """Return rows as aligned text columns; ``right`` are right-aligned column indices.

    ``paint(column, padded_cell)`` may colour a cell after padding, so escapes never skew widths.
    ``skip``: how many leading cells of each row are not shown. Control characters in cells are
    escaped (:func:`escape`) unless ``escaped`` says the caller did it.
    Plain text on purpose: the same bytes on a terminal and in a pipe, easy to ``grep`` and ``awk``.
    """
    aligned_right = set(right)
    if not escaped and any(_CONTROL.search(cell) for row in rows for cell in row[skip:]):
        rows = [[escape(cell) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for i in range(len(headers)):
        # map() keeps the loop in C: 100,000-row listings spend noticeable time here otherwise.
        widths[i] = max(widths[i], max(map(len, map(itemgetter(i + skip), rows)), default=0))
    if paint is None:
        # One format string for every row: ten times faster than padding cell by cell (100,000-row listings).
        fmt = "  ".join(f"{{{i + skip}:{'>' if i in aligned_right else '<'}{w}}}" for i, w in enumerate(widths))
        head = "  ".join(pad_cell(h, widths[i], i in aligned_right) for i, h in enumerate(headers)).rstrip()
        return "\n".join([head, *(fmt.format(*row).rstrip() for row in rows)])

    def line(cells: Sequence[str], painted: bool) -> str:
        out = []
        for i, cell in enumerate(cells):
            padded = pad_cell(cell, widths[i], i in aligned_right)
            out.append(paint(i, padded) if painted else padded)
        return "  ".join(out).rstrip()

    return "\n".join([line(headers, False), *(line(row[skip:], True) for row in rows)])


def pad_cell(cell: str, width: int, right: bool) -> str:
    """Return ``cell`` padded with spaces to ``width``, on the left when ``right``."""
    return cell.rjust(width) if right else cell.ljust(width)


class Progress:
    """A progress bar on ``stream`` through ``rich`` (nothing drawn without it or when ``enabled`` is false)."""

    def __init__(self, stream: TextIO, description: str, enabled: bool) -> None:
        self._bar: Any = None
        self._task: Any = None
        out = console(stream) if enabled else None
        if out is None:
            return
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        # A bar asked for on a pipe (--progress) is still drawn: force the console to draw it.
        out = type(out)(file=stream, highlight=False, force_terminal=True, no_color=out.no_color or None)
        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                             DownloadColumn(), TimeRemainingColumn(), console=out, transient=False)
        self._task = self._bar.add_task(description, total=None)
        self._bar.start()

    def update(self, done: int, total: int) -> None:
        """Show ``done`` of ``total`` (bytes)."""
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total)

    def close(self) -> None:
        """Finish the bar."""
        if self._bar is not None:
            self._bar.stop()


def size(n: float | None) -> str:
    """Return a byte count as ``12.3 MB`` (powers of 1000), or ``-``."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"  # pragma: no cover - the loop returns first
