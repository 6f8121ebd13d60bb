"""Lay out a run as Holistic Trace Analysis loads one: a folder of one trace file per rank.

HTA's ``TraceAnalysis(trace_dir=...)`` reads every ``.json``/``.gz`` file of one folder as the
trace of one rank: the rank is the first ``"rank": N`` in the file (the trace's
``distributedInfo``; a file without it is rank 0, and of two files of one rank the last read
wins), ranks are aligned by their raw timestamps, and each CPU event's iteration is the number of
the ``ProfilerStep#N`` range it lies in (-1 outside any). A run's own folders do not fit: a step
folder holds one file per capture (per role in role mode), so one rank has several files, and a
save_path holds no trace at its top. The layout written here does:

- one file per rank, ``rank{R}.pt.trace.json.gz`` (the name TensorBoard's profiler plugin reads
  as worker ``rank{R}``), holding every capture of that rank in the chosen steps, merged as
  ``profctx merge`` merges (streamed; pids, tids and flow ids kept apart);
- ``distributedInfo`` first in the file, with the rank and world size profctx recorded;
- every rank on one clock base, so HTA's alignment keeps the ranks' true offsets;
- a ``ProfilerStep#N`` range over the events of a one-step capture whose trace names no step
  (traces written before profctx named its steps so); a capture of several steps without its
  markers cannot be split, and is reported;
- a run with worker groups gets one folder per group (a rank is a position in its group, and
  ranks of two groups would collide); the driver, outside every group, and engine replicas,
  which are no ranks, are left out, and said to be.

HTA assumes torch's schedule, whose last ``ProfilerStep`` is cut short: by default it drops the
operators from the last step marker on. profctx's steps are whole: load the layout with
``TraceAnalysis(trace_dir=..., include_last_profiler_step=True)``.
"""

from __future__ import annotations

import stat
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ..core._layout import safe
from ..manifest import CaptureRecord, drivers
from ..util._fs import Folder, walk
from ..util._untrusted import Budget
from ._merge import MergeInput, MergeResult, clock_base, merge, plan

#: File name of rank ``R`` in a layout folder.
RANK_FILE: Final = "rank{rank}.pt.trace.json.gz"


class LayoutError(ValueError):
    """Raised when a layout cannot be written where it was asked for (the folder holds files already)."""


@dataclass
class RankTrace:
    """One rank's file of a layout."""

    rank: int
    path: Path
    result: MergeResult


@dataclass
class LayoutFolder:
    """One folder HTA loads: the ranks of one worker group (``group`` ``None``: a run without groups)."""

    path: Path
    group: str | None
    world_size: int | None
    ranks: list[RankTrace] = field(default_factory=list)


@dataclass
class Layout:
    """What :func:`lay_out` wrote, what it left out and why, and the problems met (inputs missing or damaged)."""

    root: Path
    folders: list[LayoutFolder] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    inputs: int = 0
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def lay_out(
    save_path: Path,
    records: Iterable[CaptureRecord],
    output: Path,
    *,
    steps: Collection[int] | None = None,
    driver: Collection[tuple[str, ...]] | None = None,
    compress_level: int = 1,
    progress: Callable[[int, int], None] | None = None,
    at: Folder | None = None,
) -> Layout:
    """Write the captures of ``records`` covering ``steps`` (all when ``None``) into ``output``, a file per rank.

    ``records`` are those of one run. ``driver``: the driver processes of the run, when
    ``records`` are a filtered part of it (see :func:`profctx.manifest.drivers`).
    Raise :class:`LayoutError` when ``output`` exists and is not an empty folder (HTA would read
    the files there as ranks too, and a link there is never followed); nothing is written then.
    ``at``: the held folder ``output`` goes into (default: ``output``'s folder, walked to). Every
    folder of the layout is made below it by descriptor, no link followed.
    """
    parent = at if at is not None else walk(output.parent)
    held: list[Folder] = []
    try:
        _check_output(parent, output)
        return _lay_out(save_path, list(records), output, parent, held, steps, driver, compress_level, progress)
    finally:
        for folder in held:
            folder.close()
        if parent is not at:
            parent.close()


def _check_output(parent: Folder, output: Path) -> None:
    """Raise :class:`LayoutError` unless ``output`` (in the held ``parent``) is missing or an empty folder."""
    try:
        info = parent.lstat(output.name)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        with parent.sub(output.name, create=False) as folder:
            if not folder.entries(1):
                return
    what = "is a link (never followed)" if stat.S_ISLNK(info.st_mode) else "exists and is not an empty folder"
    raise LayoutError(f"{output} {what}: HTA reads every trace in a folder as a rank, so a layout needs a folder "
                      "of its own (remove it or choose another)")


def _lay_out(save_path: Path, records: list[CaptureRecord], output: Path, parent: Folder, held: list[Folder],
             steps: Collection[int] | None, driver: Collection[tuple[str, ...]] | None, compress_level: int,
             progress: Callable[[int, int], None] | None) -> Layout:
    """Lay ``records`` out below ``parent`` (see :func:`lay_out`); the folders made are appended to ``held``."""
    leaders = set(driver) if driver is not None else drivers(records)
    grouped = any(r.group for r in records if not r.is_engine and r.process not in leaders)
    layout = Layout(root=output)
    kept: list[CaptureRecord] = []
    left: dict[str, int] = {}
    for record in records:
        why = _left_out(record, grouped, record.process in leaders)
        if why:
            left[why] = left.get(why, 0) + 1
        else:
            kept.append(record)
    layout.notes += [f"{count} capture(s) left out: {why}" for why, count in left.items()]
    inputs, notes = plan(save_path, kept, steps)
    layout.notes += notes
    layout.inputs = len(inputs)
    layout.steps = sorted({s for i in inputs for s in i.record.steps if steps is None or s in steps})
    if not inputs:
        return layout
    budget = Budget.of(i.path for i in inputs)  # one for the command: every rank file shares it
    base = clock_base(inputs, budget)
    ranks: dict[tuple[str | None, int], list[MergeInput]] = {}
    for item in inputs:
        rank = item.record.rank
        assert rank is not None  # records without a rank were left out above
        ranks.setdefault((item.record.group, rank), []).append(item)
    total = sum(_size(i.path) for i in inputs)
    done = 0
    folders: dict[str | None, LayoutFolder] = {}
    opened: dict[str | None, Folder] = {}
    for (group, rank), items in sorted(ranks.items(), key=lambda kv: (kv[0][0] or "", kv[0][1])):
        folder = folders.get(group)
        if folder is None:
            sizes = [r.world_size for r in kept if r.group == group and r.world_size]
            where = output / _folder_name(group, {f.path.name for f in folders.values()}) if grouped and group \
                else output
            folder = LayoutFolder(where, group, max(sizes) if sizes else None)
            folders[group] = folder
            if not held:
                held.append(parent.sub(output.name))
            opened[group] = held[0] if where == output else held[0].sub(where.name)
            if opened[group] is not held[0]:
                held.append(opened[group])
            layout.folders.append(folder)
        processes = {i.record.process for i in items}
        if len(processes) > 1:
            layout.notes.append(f"{_where(group)}rank {rank}: {len(processes)} processes recorded this rank; "
                                "their captures share its file")
        world = folder.world_size if folder.world_size is not None else max(r for g, r in ranks if g == group) + 1
        path = folder.path / RANK_FILE.format(rank=rank)

        def report(consumed: int, _total: int, offset: int = done) -> None:
            if progress:
                progress(offset + consumed, total)

        result = merge(items, path, steps=sorted(steps) if steps is not None else None,
                       compress_level=compress_level, progress=report, driver=leaders, base_ns=base,
                       first_keys={"distributedInfo": {"backend": "none", "rank": rank, "world_size": world}},
                       step_markers=True, at=opened[group], budget=budget)
        done += sum(_size(i.path) for i in items)
        folder.ranks.append(RankTrace(rank, path, result))
        layout.problems += result.problems
        layout.notes += [f"{line} (a damaged event)" for line in result.dropped]
        layout.notes += [f"{line}: HTA gives its events iteration -1" for line in result.unmarked]
    return layout


def _left_out(record: CaptureRecord, grouped: bool, leads: bool) -> str | None:
    """Return why ``record`` has no place in a layout, or ``None``."""
    if record.is_engine:
        return "engine replicas are not ranks of the job (merge them with 'profctx merge')"
    if grouped and leads:
        return "the driver is outside every worker group (its steps are marked in its workers' traces)"
    if record.rank is None:
        return "the capture records no rank"
    return None


def _folder_name(group: str, taken: Collection[str]) -> str:
    """Return a folder name for ``group`` (read from a manifest: never a path) that no other group has."""
    name = safe(group)
    suffix = 1
    while name in taken:
        suffix += 1
        name = f"{safe(group)}-{suffix}"
    return name


def _where(group: str | None) -> str:
    return f"group {group}, " if group else ""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
