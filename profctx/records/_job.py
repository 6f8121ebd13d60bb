"""The processes a job expected and lacks: ranks ``0..W-1`` of each group, from what the records say.

Every record and timeline names its process as ``rank R of W`` (in a worker group: rank in the
group, ``W`` the group's size). So a job whose files say ``of 4`` and hold ranks 0, 2 and 3 lacks
rank 1: a command that shows the job names it rather than answer for part of the job as if it
were all of it. Pure: the callers read the files.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal, final

from ..manifest import CaptureRecord

#: Ranks named one by one in a message; more are counted.
SHOWN: Final = 8
#: Most ranks a group is expected to hold (a world size beyond it is damage, not a job).
MAX_WORLD: Final = 1 << 16


@final
@dataclass(frozen=True)
class Member:
    """One process as its files name it: its run, worker group (``None``: none), rank and world size.

    ``selected``: the ranks its configuration profiles (``None``: unknown; ``"all"``), so that a
    rank no process selects is not expected to have captures.
    """

    run: str | None
    group: str | None
    rank: int | None
    world_size: int | None
    selected: tuple[int, ...] | Literal["all"] | None = None


@final
@dataclass(frozen=True)
class Missing:
    """A process a job's files expect and lack: its run, group and rank."""

    run: str | None
    group: str | None
    rank: int

    def name(self, style: Literal["summary", "timeline"] = "summary") -> str:
        """Return the process's name as the command shows processes (``rank 1``, ``actor rank 1``; ``actor/rank1``)."""
        if style == "timeline":
            return f"{self.group}/rank{self.rank}" if self.group else f"rank{self.rank}"
        return f"{self.group} rank {self.rank}" if self.group else f"rank {self.rank}"


def missing(members: Iterable[Member], *, selected_only: bool = False,
            others: Iterable[Member] = ()) -> list[Missing]:
    """Return the processes ``members`` expect and lack, by run, group and rank.

    Per run and group, the expected ranks are ``0..W-1`` for the largest world size ``W`` a
    member names. ``selected_only``: only the ranks some member's configuration selects are
    expected (captures: an unselected rank records nothing); a member whose selection is
    unknown expects every rank. A rank beyond :data:`MAX_WORLD` is never expected. ``others``:
    processes known from elsewhere (their capture shards, for timelines), expected without being
    present: their world sizes count too.
    """
    sizes: dict[tuple[str | None, str | None], int] = {}
    present: dict[tuple[str | None, str | None], set[int]] = {}
    chosen: dict[tuple[str | None, str | None], set[int] | None] = {}
    for m in others:
        if m.world_size is not None and 0 < m.world_size <= MAX_WORLD:
            key = (m.run, m.group)
            sizes[key] = max(sizes.get(key, 0), m.world_size)
    for m in members:
        key = (m.run, m.group)
        if m.rank is not None and m.rank >= 0:
            present.setdefault(key, set()).add(m.rank)
        if m.world_size is not None and 0 < m.world_size <= MAX_WORLD:
            sizes[key] = max(sizes.get(key, 0), m.world_size)
        if selected_only:
            if m.selected is None or m.selected == "all":
                chosen[key] = None
            elif key not in chosen or chosen[key] is not None:
                known = chosen.get(key)
                chosen[key] = (known or set()) | set(m.selected)
    out: list[Missing] = []
    for key in sorted(sizes, key=lambda k: (k[0] or "", k[1] or "")):
        expected: Iterable[int] = range(sizes[key])
        if selected_only and chosen.get(key) is not None:
            expected = sorted(r for r in chosen[key] or () if r < sizes[key])
        have = present.get(key, set())
        out += [Missing(key[0], key[1], rank) for rank in expected if rank not in have]
    return out


def hole(names: Sequence[str], what: str) -> str | None:
    """Return the line naming the processes a job expected and lacks (``None`` when none).

    ``names``: those processes as the command names them (:meth:`Missing.name`); ``what``: what
    they lack here (``capture record``, ``timeline``).
    """
    if not names:
        return None
    shown = ", ".join(names[:SHOWN]) + (f", and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
    noun = "expected process has" if len(names) == 1 else "expected processes have"
    return (f"missing: {len(names)} {noun} no {what} here: {shown} (expected from the 'rank R of W' the others' "
            "files name; every figure shown is of the processes present)")


def of_records(records: Iterable[CaptureRecord]) -> list[Missing]:
    """Return the processes a run's capture records expect and lack (engine records left out).

    Only ranks some process's configuration selects are expected: an unselected rank records nothing.
    """
    found = []
    for record in records:
        if record.is_engine or record.kind == "remote":
            continue
        selected = record.selected
        found.append(Member(record.run, record.group, record.rank, record.world_size,
                            selected if selected is None or isinstance(selected, tuple) else "all"))
    return missing(found, selected_only=True)
