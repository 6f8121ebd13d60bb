"""A regression gate: the roles and operators of a diff that got slower than allowed."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any

from ..util._errors import ConfigError
from ._diff import Diff

_THRESHOLD = re.compile(r"^(?P<pattern>.+?)=(?P<value>[0-9]+(?:\.[0-9]+)?)%?$")


@dataclass(frozen=True)
class Threshold:
    """The largest allowed slowdown (``0.1``: 10 %) of roles or operators whose name matches ``pattern``."""

    kind: str  # "role" or "op"
    pattern: str
    max_change: float

    def matches(self, name: str) -> bool:
        """Whether ``name`` is covered (fnmatch pattern)."""
        return fnmatch.fnmatchcase(name, self.pattern)


@dataclass(frozen=True)
class Violation:
    """A role or operator slower than its threshold allows."""

    kind: str
    role: str
    name: str
    a_s: float
    b_s: float
    change: float | None
    threshold: Threshold

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {"kind": self.kind, "role": self.role, "name": self.name, "a_s": self.a_s, "b_s": self.b_s,
                "change": self.change, "max_change": self.threshold.max_change,
                "pattern": self.threshold.pattern}


def parse_threshold(text: str, kind: str = "role") -> Threshold:
    """Parse ``NAME=PCT%`` (``actor_update=10%``, ``*=25``, ``aten::mm=5%``) into a :class:`Threshold`.

    Raise :class:`profctx.ConfigError` naming the value and the form allowed.
    """
    match = _THRESHOLD.match(text.strip())
    if match is None:
        raise ConfigError(f"max-{'op-' if kind == 'op' else ''}slowdown", text,
                          "NAME=PERCENT, e.g. 'actor_update=10%' or '*=20%' (fnmatch patterns)")
    return Threshold(kind, match["pattern"], float(match["value"]) / 100)


def check(result: Diff, thresholds: list[Threshold], *, min_delta_s: float = 0.001) -> list[Violation]:
    """Return every role or operator of ``result`` slower than the first threshold matching it allows.

    A delta under ``min_delta_s`` seconds never fails (timer noise); a role or operator absent
    from the baseline fails when it adds more than ``min_delta_s``.
    """
    found: list[Violation] = []
    roles = [t for t in thresholds if t.kind == "role"]
    ops = [t for t in thresholds if t.kind == "op"]
    for role in result.roles:
        rule = next((t for t in roles if t.matches(role.role)), None)
        if rule is not None and _exceeds(role.a_s, role.b_s, rule.max_change, min_delta_s):
            found.append(Violation("role", role.role, role.role, role.a_s, role.b_s, role.change, rule))
        for op in role.ops:
            op_rule = next((t for t in ops if t.matches(op.name)), None)
            if op_rule is not None and _exceeds(op.a_s, op.b_s, op_rule.max_change, min_delta_s):
                found.append(Violation("op", role.role, op.name, op.a_s, op.b_s, op.change, op_rule))
    return found


def _exceeds(a: float, b: float, max_change: float, min_delta: float) -> bool:
    if b - a <= min_delta:
        return False
    return a <= 0 or (b - a) / a > max_change
