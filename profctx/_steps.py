"""``Steps``: steps and roles marked by callback pairs (begin/end) instead of a ``with`` block."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any, final

from ._block import Session, check
from ._capture import Capture
from ._log import warn_once
from ._owner import OWNER
from ._scope import ROOT, Scope, split_role


@final
class Mark:
    """One step or role a :class:`Steps` object holds for the process (the owner's ``held``).

    Read as the process's held step is read (``_scope.ambient``, ``_block.Session``): blocks
    with no step of their own are inside ``scope`` and record into ``target``. ``session`` is
    ``None`` when the plan could open nothing for it (out of the window): then it only names
    the scope. :meth:`release` ends this mark and the marks it is nested in (process exit,
    ``profctx.reset()``).
    """

    __slots__ = ("parent", "scope", "session", "target", "thread")

    target: Capture | None

    def __init__(self, scope: Scope, session: Session | None, parent: Mark | None) -> None:
        self.scope = scope
        self.session = session
        self.parent = parent
        opened = session.opened if session is not None else None
        target = opened.target if opened is not None else None
        self.target = target if target is not None or parent is None else parent.target
        self.thread = threading.get_ident()

    def pop(self, in_flight: bool) -> None:
        """End this mark alone; its parent becomes the held mark."""
        if OWNER.held is self:
            OWNER.held = self.parent
        session, self.session = self.session, None
        if session is not None:
            session.finish(None, in_flight=in_flight)

    def release(self, in_flight: bool = False) -> None:
        """End this mark and every mark it is nested in, innermost first."""
        pop_all(self, None, in_flight)


def pop_all(mark: Mark | None, last: Mark | None, in_flight: bool) -> None:
    """End ``mark`` and its parents, innermost first, up to and including ``last`` (``None``: all).

    Each is ended even if ending one before it raised; the first error is raised after.
    """
    error: BaseException | None = None
    while mark is not None:
        try:
            mark.pop(in_flight)
        except BaseException as exc:  # noqa: BLE001 - re-raised once every mark is ended
            error = error or exc
        if mark is last:
            break
        mark = mark.parent
    if error is not None:
        raise error


def _opens_nothing(step: int, sets_step: bool) -> bool:
    """Whether a block at ``step`` would open nothing (no runtime, out of the window, nothing pending)."""
    rt = OWNER.runtime
    return rt is None or rt.opens_nothing(step, sets_step)


@final
class Steps:
    """Begin and end steps and roles from callback pairs, without a ``with`` block to leak.

    For frameworks that report a step as two callbacks (``on_step_begin`` / ``on_step_end``).
    The step is not set in the ambient context variable (a token nobody resets after an
    exception): it is held for the process, as a Ray worker holds its driver's step, and
    blocks with no step of their own read it (``profctx.current()``, ``profile_step(role=...)``,
    ``@profiled``). The rules:

    - :meth:`begin` ends a step left open (a missed :meth:`end`) before it starts the new one:
      its capture ends there and is written as any other.
    - :meth:`end` without a begin, and :meth:`end_role` of a role not open, do nothing.
    - :meth:`begin_role` outside a step does nothing; a role already open under the same name
      (a missed :meth:`end_role`) is ended first, with the roles inside it.
    - :meth:`close` ends whatever is open. Used as a context manager (``with steps:``), the
      exit closes, so after an exception leaves the block nothing is open and the ambient scope
      is what it was. Without the ``with``, a step whose end never comes stays in force until
      the next :meth:`begin`, :meth:`close`, ``profctx.reset()`` or process exit.

    Threads and tasks: the held step is process-wide (every thread and task without a step
    block of its own sees it). Call begin and end on one thread: a capture stops on the thread
    that started it, so an end called elsewhere stops it at that thread's next block. One
    ``Steps`` object marks one loop; a ``begin`` on another object ends this one's open step.
    Inside a Ray worker whose driver holds the step, ``begin`` does nothing (the driver's step
    stands). Profiling failures are recorded as for ``profile_step``; a bad step or role raises
    :class:`profctx.ConfigError`.
    """

    __slots__ = ("_lock", "_top")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        #: The innermost mark this object holds (a role, or the step), if any.
        self._top: Mark | None = None

    @property
    def step(self) -> int | None:
        """The step begun and not yet ended, if any."""
        top = self._top
        return None if top is None else top.scope.step

    @property
    def roles(self) -> tuple[str, ...]:
        """The role path begun inside the open step (outermost first)."""
        top = self._top
        return () if top is None else top.scope.roles

    def begin(self, step: int, **tags: Any) -> Scope:
        """End any step left open, then enter ``step`` (with ``tags``); return its scope."""
        step_ = check(step, None)
        if step_ is None:
            raise_step(step)
        with self._lock:
            self._end(None, in_flight=True)
            held = OWNER.held
            if held is not None:
                if not isinstance(held, Mark):
                    warn_once("steps-held", "profctx: Steps.begin(%s) ignored: the process already holds step %s "
                              "(its driver's)", step_, held.scope.step)
                    return held.scope  # type: ignore[no-any-return]
                held.release(in_flight=True)  # another Steps object's step, left open
            mark = self._start(ROOT, step_, None, tags, None)
            OWNER.held = self._top = mark
            return mark.scope

    def end(self) -> None:
        """End the open step and its roles; do nothing when no step is open."""
        with self._lock:
            self._end(None, in_flight=False)

    def begin_role(self, role: str, **tags: Any) -> Scope | None:
        """Enter ``role`` inside the open step; return its scope (``None``: no step is open).

        A role open under the same name is ended first (its end was missed).
        """
        check(None, role)
        with self._lock:
            top = self._top
            if top is None or OWNER.held is not top:
                return None
            if self._find(role) is not None:
                self._end(role, in_flight=True)
                top = self._top
                assert top is not None
            mark = self._start(top.scope, None, role, tags, top)
            OWNER.held = self._top = mark
            return mark.scope

    def end_role(self, role: str | None = None) -> None:
        """End ``role`` (default: the innermost) and the roles inside it; nothing if it is not open."""
        with self._lock:
            if role is None:
                top = self._top
                if top is not None and top.parent is not None:
                    self._end_through(top, in_flight=False)
            else:
                self._end(role, in_flight=False)

    def close(self) -> None:
        """End whatever this object holds open (idempotent)."""
        with self._lock:
            self._end(None, in_flight=True)

    def __enter__(self) -> Steps:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        with self._lock:
            self._end(None, in_flight=exc_type is not None)

    def __repr__(self) -> str:
        return f"Steps(step={self.step!r}, roles={self.roles!r})"

    # -- the marks ---------------------------------------------------------------------------

    @staticmethod
    def _start(parent: Scope, step: int | None, role: str | None, tags: dict[str, Any], under: Mark | None) -> Mark:
        at = parent.step if step is None else step
        assert at is not None
        if _opens_nothing(at, step is not None):  # out of the window: only the scope is held
            return Mark(parent.child(step, role, tags), None, under)
        session = Session(parent, step, role, dict(tags))
        session.context = under.target if under is not None else None  # a held step nests in nothing
        session.start_held()
        return Mark(session.scope, session, under)

    def _find(self, role: str) -> Mark | None:
        """The outermost open role mark that added ``role`` (``"a/b"``: the mark that added both)."""
        parts = split_role(role)
        found = None
        mark = self._top
        while mark is not None and mark.parent is not None:
            roles = mark.scope.roles
            if roles[-len(parts):] == parts and len(mark.parent.scope.roles) == len(roles) - len(parts):
                found = mark
            mark = mark.parent
        return found

    def _end(self, role: str | None, in_flight: bool) -> None:
        """End the marks down to ``role``'s (``None``: all, the step included)."""
        if role is None:
            top, self._top = self._top, None
            pop_all(top, None, in_flight)
            return
        target = self._find(role)
        if target is not None:
            self._end_through(target, in_flight)

    def _end_through(self, target: Mark, in_flight: bool) -> None:
        """End the marks from the innermost up to and including ``target``."""
        top, self._top = self._top, target.parent
        pop_all(top, target, in_flight)


def raise_step(step: Any) -> None:
    """Refuse a missing step (``begin`` needs one)."""
    from ._errors import ConfigError

    raise ConfigError("step", step, "Steps.begin needs the step: an integer >= 0")
