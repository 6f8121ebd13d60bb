"""Compare two summaries (two runs, or two steps of one run): role time deltas and the operators behind them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._summary import Summary


@dataclass
class OpDelta:
    """One operator of one role: self time per process and step in A and B (seconds)."""

    role: str
    name: str
    a_s: float
    b_s: float

    @property
    def delta_s(self) -> float:
        """B minus A."""
        return self.b_s - self.a_s

    @property
    def change(self) -> float | None:
        """Relative change (0.1 is 10 % slower), ``None`` when absent from A."""
        return self.delta_s / self.a_s if self.a_s > 0 else None

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {"role": self.role, "name": self.name, "a_s": self.a_s, "b_s": self.b_s, "delta_s": self.delta_s,
                "change": self.change}


@dataclass
class RoleDelta:
    """One role: its time per step (max over processes, mean over steps) in A and B, and its operators.

    ``a_wait_s``/``b_wait_s``: the longest wait of a process for the others in the role, mean over steps
    (waiting, not the role's work); ``nested``: the roles drawn inside it, as deltas of their own.
    """

    role: str
    a_s: float
    b_s: float
    ops: list[OpDelta] = field(default_factory=list)
    a_wait_s: float = 0.0
    b_wait_s: float = 0.0
    nested: list[RoleDelta] = field(default_factory=list)

    @property
    def delta_s(self) -> float:
        """B minus A."""
        return self.b_s - self.a_s

    @property
    def change(self) -> float | None:
        """Relative change, ``None`` when absent from A."""
        return self.delta_s / self.a_s if self.a_s > 0 else None

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {"role": self.role, "a_s": self.a_s, "b_s": self.b_s, "delta_s": self.delta_s,
                "change": self.change, "a_wait_s": self.a_wait_s, "b_wait_s": self.b_wait_s,
                "nested": [n.to_json() for n in self.nested], "ops": [o.to_json() for o in self.ops]}


@dataclass
class Diff:
    """What changed from A to B, roles by absolute delta first."""

    a_label: str
    b_label: str
    roles: list[RoleDelta]
    #: ``{step: line}``: who the others waited for in each step of A and of B (see ``Summary.answer``).
    a_stragglers: dict[int, str] = field(default_factory=dict)
    b_stragglers: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Return the versioned JSON document (schema ``profctx.diff`` version 1)."""
        return {"schema": "profctx.diff", "version": 1, "a": self.a_label, "b": self.b_label,
                "roles": [r.to_json() for r in self.roles],
                "a_stragglers": {str(k): v for k, v in self.a_stragglers.items()},
                "b_stragglers": {str(k): v for k, v in self.b_stragglers.items()}}


def _per_unit(summary: Summary, role: str) -> dict[str, float]:
    """Return operator self time of ``role`` per process-step, in seconds."""
    units = sum(len(p.per_process) for p in summary.phases if p.role == role) or 1
    return {op.name: op.self_s / units for op in summary.role_ops.get(role, [])}


def diff(a: Summary, b: Summary, *, top: int = 10, a_label: str = "A", b_label: str = "B") -> Diff:
    """Return the per-role deltas from ``a`` to ``b`` and, per role, the ``top`` operators by absolute delta.

    Role time is the mean over the summary's steps of the role's time in a step (the slowest
    process); operator time is self time per process and step, so runs of different length or
    rank count compare.
    """
    names = list(dict.fromkeys([*a.roles, *b.roles]))
    roles = []
    for role in names:
        ops_a, ops_b = _per_unit(a, role), _per_unit(b, role)
        ops = [OpDelta(role, name, ops_a.get(name, 0.0), ops_b.get(name, 0.0))
               for name in dict.fromkeys([*ops_a, *ops_b])]
        ops.sort(key=lambda o: -abs(o.delta_s))
        children = list(dict.fromkeys([*a.nested_time(role), *b.nested_time(role)]))
        nested = [RoleDelta(child, a.nested_time(role).get(child, 0.0), b.nested_time(role).get(child, 0.0))
                  for child in children]
        roles.append(RoleDelta(role, a.role_time(role), b.role_time(role), ops[:top], a.role_wait(role),
                               b.role_wait(role), nested))
    roles.sort(key=lambda r: -abs(r.delta_s))
    return Diff(a_label, b_label, roles, _named(a), _named(b))


def _named(summary: Summary) -> dict[int, str]:
    """Return the steps of ``summary`` that name a straggler, with its line."""
    return {step: summary.answer(step) or "" for step, found in sorted(summary.alignment.items())
            if found.straggler is not None}
