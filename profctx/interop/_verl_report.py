"""Account for every verl field read: what profctx field it became, or a note on why it did not.

:class:`Report` is the running account one conversion keeps; :class:`Conversion` and
:class:`Note` are what :func:`profctx.interop.verl.convert` hands back.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, final

from ..core._config import ProfilerConfig


@final
@dataclass(frozen=True)
class Note:
    """A verl field whose meaning profctx does not reproduce exactly, and why."""

    field: str
    value: Any
    reason: str

    def __str__(self) -> str:
        return f"{self.field} = {self.value!r}: {self.reason}"


@final
@dataclass(frozen=True)
class Conversion:
    """The profctx config for a verl config, with a report of every verl field read.

    ``fields`` maps each verl field path read (``global_profiler.steps``,
    ``actor_rollout_ref.actor.profiler.ranks``, ...) to what became of it; ``notes`` lists
    the fields whose verl meaning is not reproduced exactly, each with its reason.
    """

    config: ProfilerConfig
    notes: tuple[Note, ...]
    fields: Mapping[str, str]

    def note(self, field: str) -> Note | None:
        """Return the note on verl field ``field`` (a dotted path), or ``None``."""
        return next((n for n in self.notes if n.field == field), None)

    def report(self) -> str:
        """Return the notes as text, one per line (empty when everything carried over)."""
        return "\n".join(str(n) for n in self.notes)


@final
class Report:
    """Record what became of each verl field of one conversion.

    A field keeps the first thing recorded for it, except that a note replaces a mapping (a
    field is reported at most once). Not thread-safe: one report per conversion.
    """

    __slots__ = ("blocks", "fields", "notes")

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}
        self.notes: list[Note] = []
        #: verl path -> profiler block, every leaf of which :meth:`sweep` accounts for.
        self.blocks: dict[str, Mapping[str, Any]] = {}

    def mapped(self, path: str, what: str) -> None:
        """Record that verl field ``path`` became ``what`` (unless something is recorded already)."""
        self.fields.setdefault(path, what)

    def note(self, path: str, value: Any, reason: str) -> None:
        """Record that verl field ``path`` (set to ``value``) is not carried over, and why."""
        if path not in self.fields or not self.fields[path].startswith("not carried"):
            self.fields[path] = f"not carried: {reason}"
            self.notes.append(Note(path, value, reason))

    def mark(self, path: str, block: Mapping[str, Any], key: str, what: str) -> None:
        """Record ``path.key`` as ``what`` when ``block`` sets ``key``."""
        if key in block:
            self.mapped(f"{path}.{key}", what)

    def unused(self, path: str, block: Mapping[str, Any], reason: str) -> None:
        """Record every leaf of ``block`` (at ``path``) not yet accounted for as unused, for ``reason``."""
        for leaf, _ in leaves(path, block):
            if not self.known(leaf):
                self.mapped(leaf, reason)

    def known(self, leaf: str) -> bool:
        """Return whether ``leaf`` or a field inside it is accounted for."""
        parts = leaf.split(".")
        return any(".".join(parts[:n]) in self.fields for n in range(len(parts), 0, -1))

    def sweep(self) -> None:
        """Note every leaf of the profiler blocks that nothing accounted for."""
        for path, block in self.blocks.items():
            for leaf, value in leaves(path, block):
                if not self.known(leaf):
                    self.note(leaf, value, "not a verl profiler field profctx knows (verl 0.5 to 0.10); "
                              "not carried over")

    def conversion(self, config: ProfilerConfig) -> Conversion:
        """Return ``config`` with the notes and fields recorded so far."""
        return Conversion(config, tuple(self.notes), dict(self.fields))


def leaves(prefix: str, block: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """Yield the dotted path under ``prefix`` and the value of every leaf of ``block`` (empty mappings are leaves)."""
    for key, value in block.items():
        path = f"{prefix}.{key}"
        if isinstance(value, Mapping) and value:
            yield from leaves(path, value)
        else:
            yield path, value


def instead(field: str) -> str:
    """Return what a user can do instead when a per-role verl setting of ``field`` collapses to one value."""
    return (f"to keep this role's own {field}, call profctx.configure(..., {field.split('.')[0]}=...) "
            "in its worker processes (worker groups carry ranks and contents per role, not this)")
