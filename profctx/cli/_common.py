"""What the subcommands share: opening a run folder, filters, colour, tables, sizes and times."""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TextIO

from .._layout import MANIFEST_DIR
from .._manifest import read

#: Exit codes of every subcommand.
OK: Final = 0
FINDINGS: Final = 1
USAGE: Final = 2

STATUSES: Final = ("ok", "failed", "skipped", "open")


class UsageError(Exception):
    """Raise for a bad argument or a folder that is not a profctx run; exits with code 2."""


def guarded(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Wrap a subcommand handler so a :class:`UsageError` prints plainly and exits 2."""

    def run(args: argparse.Namespace) -> int:
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


@dataclass
class Run:
    """A profctx save_path and its manifest: one merged record per capture."""

    path: Path
    records: list[dict[str, Any]]
    damaged: list[str]


def open_run(folder: str) -> Run:
    """Return the run under ``folder``; raise :class:`UsageError` saying plainly what is wrong."""
    path = Path(folder).expanduser()
    if not path.exists():
        raise UsageError(f"{folder}: no such folder")
    if not path.is_dir():
        raise UsageError(f"{folder}: not a folder")
    shards = sorted((path / MANIFEST_DIR).glob("*.jsonl"))
    if not shards:
        hint = ""
        for parent in path.absolute().parents:
            if (parent / MANIFEST_DIR).is_dir():
                hint = f"; it lies inside the profctx run {parent}: pass that folder"
                break
        raise UsageError(
            f"{folder}: not a profctx folder (no manifest {MANIFEST_DIR}/*.jsonl inside)"
            + (hint or "; pass the save_path given to profctx.configure()")
        )
    return Run(path, read(path), damaged_lines(shards))


def damaged_lines(shards: Iterable[Path]) -> list[str]:
    """Return ``shard:line`` for each manifest line that does not parse (a write cut by a crash)."""
    damaged = []
    for shard in shards:
        try:
            lines = shard.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError as exc:
            damaged.append(f"{shard.name}: unreadable ({exc})")
            continue
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                json.loads(line)
            except json.JSONDecodeError:
                damaged.append(f"{shard.name}:{number}")
    return damaged


def add_filters(parser: argparse.ArgumentParser) -> None:
    """Add ``--step``, ``--role``, ``--rank``, ``--status`` to ``parser``."""
    parser.add_argument("--step", type=int, action="append", metavar="S",
                        help="only captures covering step S (repeatable)")
    parser.add_argument("--role", action="append", metavar="PATTERN",
                        help="only roles matching PATTERN (fnmatch, on the role name or path; 'step' for "
                             "whole-step captures; repeatable)")
    parser.add_argument("--rank", type=int, action="append", metavar="R", help="only rank R (repeatable)")
    parser.add_argument("--status", choices=STATUSES, action="append", help="only this status (repeatable)")


def select(records: Iterable[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Return the records that pass the filters of :func:`add_filters`."""
    chosen = []
    for record in records:
        steps = record.get("steps") or []
        if args.step and not any(s in steps for s in args.step):
            continue
        if args.rank is not None and record.get("rank") not in args.rank:
            continue
        if args.status and record.get("status") not in args.status:
            continue
        if args.role:
            path = record.get("role") or "step"
            name = path.rsplit("/", 1)[-1]
            if not any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(path, p) for p in args.role):
                continue
        chosen.append(record)
    return chosen


class Style:
    """ANSI colour for a stream, on only when it is a terminal and ``NO_COLOR`` is unset."""

    _CODES: Final = {"red": "31", "green": "32", "yellow": "33", "blue": "34", "dim": "2", "bold": "1"}

    def __init__(self, stream: TextIO) -> None:
        isatty = getattr(stream, "isatty", None)
        self.enabled = bool(isatty and isatty()) and not os.environ.get("NO_COLOR")

    def __call__(self, text: str, colour: str) -> str:
        """Return ``text`` in ``colour`` (a key of ``_CODES``) when colour is on."""
        if not self.enabled or colour not in self._CODES:
            return text
        return f"\x1b[{self._CODES[colour]}m{text}\x1b[0m"

    def status(self, status: str) -> str:
        """Return a capture status coloured by its meaning."""
        colour = {"ok": "green", "failed": "red", "skipped": "yellow", "open": "blue"}.get(status, "")
        return self(status, colour)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, right: Iterable[int] = (),
          paint: Callable[[int, str], str] | None = None) -> str:
    """Return rows as aligned text columns; ``right`` are right-aligned column indices.

    ``paint(column, padded_cell)`` may colour a cell after padding, so escapes never skew widths.
    """
    aligned_right = set(right)
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str], painted: bool) -> str:
        out = []
        for i, cell in enumerate(cells):
            padded = cell.rjust(widths[i]) if i in aligned_right else cell.ljust(widths[i])
            out.append(paint(i, padded) if painted and paint else padded)
        return "  ".join(out).rstrip()

    return "\n".join([line(headers, False), *(line(row, True) for row in rows)])


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


def seconds(s: float | None) -> str:
    """Return a duration in seconds as ``850 ms`` or ``2.41 s``, or ``-``."""
    if s is None:
        return "-"
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def steps_text(record: dict[str, Any]) -> str:
    """Return a capture's steps as ``3`` or ``3-5``."""
    steps = record.get("steps") or ([record["step"]] if record.get("step") is not None else [])
    if not steps:
        return "-"
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"


def source_text(record: dict[str, Any]) -> str:
    """Return what recorded a capture: the backend, or ``engine version`` for engine captures."""
    if record.get("kind") == "engine":
        engine = record.get("engine") or "engine"
        version = record.get("version")
        return f"{engine} {version}" if version else str(engine)
    return str(record.get("backend") or "-")


def who_text(record: dict[str, Any]) -> str:
    """Return the rank (``0``) or, for an engine capture, the replica (``r1``)."""
    if record.get("kind") == "engine":
        return f"r{record.get('replica', '?')}"
    rank = record.get("rank")
    return "-" if rank is None else str(rank)
