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
    """One role: its time per step (max over processes, mean over steps) in A and B, and its operators."""

    role: str
    a_s: float
    b_s: float
    ops: list[OpDelta] = field(default_factory=list)

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
                "change": self.change, "ops": [o.to_json() for o in self.ops]}


@dataclass
class Diff:
    """What changed from A to B, roles by absolute delta first."""

    a_label: str
    b_label: str
    roles: list[RoleDelta]

    def to_json(self) -> dict[str, Any]:
        """Return the versioned JSON document (schema ``profctx.diff`` version 1)."""
        return {"schema": "profctx.diff", "version": 1, "a": self.a_label, "b": self.b_label,
                "roles": [r.to_json() for r in self.roles]}


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
        roles.append(RoleDelta(role, a.role_time(role), b.role_time(role), ops[:top]))
    roles.sort(key=lambda r: -abs(r.delta_s))
    return Diff(a_label, b_label, roles)
