"""The oracle: the captures a one-threaded loop makes, by executing the plan with no profiler.

``profctx.testing.expected_captures`` (users' property tests), the test suite's properties and
the nsys range count use it. Kept apart from :mod:`profctx.core._plan` so that ``import profctx``
does not build these types (the runtime never needs them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, final

from ._plan import Actions, CaptureKey, Enter, Policy, decide


@final
@dataclass(frozen=True)
class RoleBlock:
    """A role block and the blocks nested inside it, in the order a step enters them."""

    role: str
    children: tuple[RoleBlock, ...] = ()

    def paths(self, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
        """Return the role path of this block and of every nested block, in entry order."""
        here = (*prefix, self.role)
        out = [here]
        for child in self.children:
            out.extend(child.paths(here))
        return out


@dataclass
class Expected:
    """One capture a sequential loop makes: what it covers, whether it records, its ranges in order."""

    key: CaptureKey
    status: Literal["ok", "skipped"] = "ok"
    ranges: list[str] = field(default_factory=list)
    markers: list[str] = field(default_factory=list)

    @property
    def steps(self) -> tuple[int, ...]:
        """The steps the capture covers."""
        return self.key.steps

    @property
    def role(self) -> str | None:
        """The role path of a role capture (``None`` for a step capture)."""
        return "/".join(self.key.roles) or None


def simulate(policy: Policy, steps: Iterable[int], blocks: Sequence[RoleBlock] = ()) -> list[Expected]:
    """Return the captures a one-threaded loop makes: ``for step in steps: with profile_step(step): blocks``.

    Each step enters ``blocks`` (role blocks, nested as given) one after another. Steps may
    repeat or skip (a retried or resumed step). This is the plan executed with no profiler:
    the runtime must produce exactly these captures (a property the test suite checks).
    """
    captures: list[Expected] = []
    run: Expected | None = None
    live: Expected | None = None  # the process's one recording capture

    def open_capture(key: CaptureKey) -> Expected:
        nonlocal live
        capture = Expected(key, "ok" if live is None else "skipped")
        captures.append(capture)
        if live is None:
            live = capture
        return capture

    def close(capture: Expected | None) -> None:
        nonlocal live
        if capture is not None and capture is live:
            live = None

    def enter(event: Enter, target: Expected | None) -> tuple[Expected | None, Expected | None, Actions]:
        """Enter a block; return the capture its ranges go to and the one it owns."""
        nonlocal run
        actions = decide(policy, event)
        if actions.close_run and run is not None:
            close(run)
            run = None
        owned: Expected | None = None
        if actions.join_run:
            target = run
        if actions.open is not None:
            capture = open_capture(actions.open)
            if actions.keep_run:
                run = capture if capture.status == "ok" else None
            else:
                owned = capture
            target = capture if capture.status == "ok" else live
            if capture.status != "ok" and actions.keep_run:
                target = live
        if target is not None and target is live:
            if actions.marker is not None:
                refused = actions.open is not None and captures[-1] is not target
                if refused and actions.open is not None and actions.open.kind == "role":
                    target.ranges.append(actions.marker)
                else:
                    target.markers.append(actions.marker)
            target.ranges.extend(actions.ranges)
        return target, owned, actions

    def context_of(target: Expected | None) -> Literal["live", "dead"] | None:
        if target is None:
            return None
        return "live" if target is live else "dead"

    def walk(block: RoleBlock, step: int, parent: tuple[str, ...], target: Expected | None) -> None:
        roles = (*parent, block.role)
        event = Enter(step, roles, sets_step=False, sets_role=True, context=context_of(target),
                      run=run.steps if run is not None else None)
        inner, owned, _ = enter(event, target)
        for child in block.children:
            walk(child, step, roles, inner)
        close(owned)

    for step in steps:
        event = Enter(step, (), sets_step=True, context=None, run=run.steps if run is not None else None)
        target, owned, actions = enter(event, None)
        for block in blocks:
            walk(block, step, (), target)
        close(owned)
        if actions.close_run_at_exit and run is not None:
            close(run)
            run = None
    if run is not None:
        close(run)
    return captures


def blocks_of(paths: Iterable[str]) -> tuple[RoleBlock, ...]:
    """Return the role blocks a step enters, from role paths in entry order.

    ``["rollout", "train", "train/actor_update"]`` is ``rollout``, then ``train`` with
    ``actor_update`` nested in it; a path's parents are created where missing.
    """
    roots: list[tuple[str, list[Any]]] = []

    def place(parts: list[str], level: list[tuple[str, list[Any]]]) -> None:
        if not parts:
            return
        head = parts[0]
        for name, children in reversed(level):
            if name == head:
                place(parts[1:], children)
                return
        fresh: list[Any] = []
        level.append((head, fresh))
        place(parts[1:], fresh)

    for path in paths:
        place([p for p in path.split("/") if p], roots)

    def build(level: list[tuple[str, list[Any]]]) -> tuple[RoleBlock, ...]:
        return tuple(RoleBlock(name, build(children)) for name, children in level)

    return build(roots)
