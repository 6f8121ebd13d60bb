"""``Steps``: steps and roles marked by callback pairs (begin/end) instead of a ``with`` block."""

from __future__ import annotations

from types import TracebackType
from typing import Any, final

from ..core._scope import ROOT, Scope, Unfrozen, merge_tags, role_parts
from ..util._errors import ConfigError
from ..util._log import warn_once
from ._block import Session, check, note_raised
from ._capture import Capture
from ._owner import OWNER
from ._timeline import FLUSH_EVENTS
from ._timeline import clock as _clock


@final
class Mark:
    """One step or role a :class:`Steps` object holds for the process (the owner's ``held``).

    Read as the process's held step is read (``_block.ambient``, ``_block.Session``): blocks
    with no step of their own are inside ``scope`` and record into ``target``. ``session`` is
    ``None`` when the plan could open nothing for it (out of the window): the mark then only
    names the scope, built when first read. :meth:`release` ends this mark and the marks it is
    nested in (process exit, ``profctx.reset()``). Such marks are built by :func:`idle`.
    """

    __slots__ = ("_scope", "added", "parent", "session", "step", "tags", "target")

    target: Capture | None

    def __init__(self, step: int, added: tuple[str, ...], tags: dict[str, Any], session: Session | None,
                 parent: Mark | None) -> None:
        self.step = step
        #: The role parts this mark adds to its parent's path (none for a step).
        self.added = added
        self.tags = tags
        self.session = session
        self.parent = parent
        self._scope: Scope | None = session.scope if session is not None else None
        opened = session.opened if session is not None else None
        target = opened.target if opened is not None else None
        self.target = target if target is not None or parent is None else parent.target

    @property
    def scope(self) -> Scope:
        """The scope blocks without a step of their own are in while this mark is held."""
        scope = self._scope
        if scope is None:
            base = ROOT if self.parent is None else self.parent.scope
            new = Unfrozen()
            new.step = self.step
            new.roles = base.roles + self.added
            new._tags = merge_tags(base._tags, self.tags) if self.tags else base._tags
            new.__class__ = Scope  # type: ignore[assignment]
            scope = self._scope = new  # type: ignore[assignment]
        return scope  # type: ignore[return-value]

    def pop(self, in_flight: bool) -> None:
        """End this mark alone; its parent becomes the held mark."""
        if OWNER.held is self:
            OWNER.held = self.parent
        session = self.session
        if session is not None:
            self.session = None
            session.finish(None, in_flight=in_flight)

    def release(self, in_flight: bool = False) -> None:
        """End this mark and every mark it is nested in, innermost first."""
        pop_all(self, None, in_flight)


_new = object.__new__


def idle(step: int, added: tuple[str, ...], tags: dict[str, Any], parent: Mark | None) -> Mark:
    """Return a mark that opens nothing: ``Mark(step, added, tags, None, parent)`` without its tests.

    Out of the window every step and role the integrations mark is one of these: the stores
    alone, no session to look at (a Python call and a few branches less per mark).
    """
    mark: Mark = _new(Mark)
    mark.step = step
    mark.added = added
    mark.tags = tags
    mark.session = None
    mark.parent = parent
    mark._scope = None
    mark.target = None if parent is None else parent.target
    return mark


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

    Out of the window (nothing can be captured in the step) roles are held as marks that open
    nothing, so that ``profctx.current()`` names them and a block or ``@profiled`` call inside
    one is timed as part of it, not as a top-level role of its own. With neither a window step
    nor a timeline (``timeline=False`` and no ``summary_at_exit``) only the step is held.

    Threads and tasks: the held step is process-wide (every thread and task without a step
    block of its own sees it). Call one object's methods from one thread at a time, the thread
    that runs the loop: a capture stops on the thread that started it (an end called elsewhere
    stops it at that thread's next block). One ``Steps`` object marks one loop; a ``begin`` on
    another object ends this one's open step. Inside a Ray worker whose driver holds the step,
    ``begin`` does nothing (the driver's step stands). Profiling failures are handled as for
    ``profile_step``; a bad step or role raises :class:`profctx.ConfigError`.
    """

    __slots__ = ("_timed", "_top")

    def __init__(self) -> None:
        #: The innermost mark this object holds (a role, or the step), if any.
        self._top: Mark | None = None
        #: For the timeline, while a step is open: [timeline, step, start, the top-level role open or None, its
        #: start, roles begun inside it and not ended] (marks of roles are not kept out of the window).
        self._timed: list[Any] | None = None

    @property
    def step(self) -> int | None:
        """The step begun and not yet ended, if any."""
        top = self._top
        return None if top is None else top.step

    @property
    def live(self) -> bool:
        """Whether the open step can capture or draw anything (false out of the window, or with no step)."""
        top = self._top
        while top is not None and top.parent is not None:
            top = top.parent
        return top is not None and top.session is not None

    @property
    def marks_roles(self) -> bool:
        """Whether :meth:`begin_role` does anything in the open step: it can capture, or the timeline times it."""
        return self._timed is not None or self.live

    @property
    def roles(self) -> tuple[str, ...]:
        """The role path begun inside the open step (outermost first)."""
        top = self._top
        return () if top is None else top.scope.roles

    def begin(self, step: int, **tags: Any) -> None:
        """End any step left open, then enter ``step`` (with ``tags``)."""
        if type(step) is not int or step < 0:
            checked = check(step, None)
            if checked is None:
                raise ConfigError("step", step, "Steps.begin needs the step: an integer")
            step = checked
        if self._top is not None:
            self._end_all(in_flight=True)
        owner = OWNER
        held = owner.held
        if held is not None:
            if not isinstance(held, Mark):
                warn_once("steps-held", "profctx: Steps.begin(%s) ignored: the process already holds step %s "
                          "(its driver's)", step, held.scope.step)
                return
            held.release(in_flight=True)  # another Steps object's step, left open
        rt = owner.runtime
        if rt is not None and rt.watch is not None and step >= 0:  # (a negative step: a warm-up or eval pass)
            rt.watch(step)  # the anomaly watch (``auto_capture``): it may add this step to the window
        # Runtime.opens_nothing(step, True), written out (one Python call less per step).
        if owner.env_read and (rt is None or step not in rt.busy_steps):  # nothing can open: name it only
            owner.last_step = step
            mark = _new(Mark)  # idle(step, (), tags, None), written out
            mark.step = step
            mark.added = ()
            mark.tags = tags
            mark.session = mark.parent = mark._scope = mark.target = None
        else:
            session = Session(ROOT, step, None, tags)
            session.context = None  # a held step nests in nothing, whatever the calling task holds
            session.start_held()
            mark = Mark(step, (), tags, session, None)
        owner.held = self._top = mark
        timeline = rt.timeline if rt is not None else None
        if timeline is not None:
            self._timed = [timeline, step, _clock(), None, 0.0, 0]
            owner.timed.append(True)

    def end(self) -> None:
        """End the open step and its roles; do nothing when no step is open."""
        top = self._top
        if top is None:
            return
        timed = self._timed
        if timed is None or top.parent is not None or top.session is not None:
            self._end_all(False)
            return
        # A step out of the window, no role open (the common case): _end_all, written out.
        self._timed = self._top = None
        end = _clock()
        timeline = timed[0]
        events = timeline.events
        if timed[3] is not None:
            events.append((timed[3], timed[4], end))
        events.append((timed[1], timed[2], end))
        if end >= timeline.due or len(events) >= FLUSH_EVENTS:
            timeline.hand_over(end)
        owner = OWNER
        counted = owner.timed  # untime(), written out
        if counted:
            counted.pop()
        if owner.held is top:
            owner.held = None

    def begin_role(self, role: str, **tags: Any) -> None:
        """Enter ``role`` inside the open step; do nothing when no step is open.

        A role open under the same name is ended first (its end was missed).
        """
        top = self._top
        timed = self._timed
        if (timed is not None and top is not None and top.session is None and top.parent is None and timed[3] is None
                and not tags and type(role) is str and role and OWNER.held is top):
            # The common case out of the window: the step's first top-level role, timed, opening nothing.
            # What the general path below does for it, written out: the clock read, and a mark that names it.
            rt = OWNER.runtime
            if rt is None or top.step not in rt.busy_roles:  # Runtime.opens_nothing(step, False), written out
                mark: Mark = _new(Mark)  # idle(top.step, role_parts(role), tags, top), written out
                mark.added = role_parts(role)  # (raises for a role such as "/")
                mark.step = top.step
                mark.tags = tags
                mark.session = mark._scope = mark.target = None  # (the step's target: None, as it opens nothing)
                mark.parent = top
                timed[3], timed[4], timed[5] = role, _clock(), 0
                OWNER.held = self._top = mark
                return
        if type(role) is not str or not role:
            check(None, role)
            role_parts(role)  # raises for an empty role
        if top is None or OWNER.held is not top:
            return
        if timed is not None:  # the timeline: the first role begun in the step is its top-level role
            if timed[3] is None or timed[3] == role:
                if timed[3] is not None:  # begun again: its end was missed
                    timed[0].role(timed[3], timed[4], _clock())
                timed[3], timed[4], timed[5] = role, _clock(), 0
            else:
                timed[5] += 1
        rt = OWNER.runtime
        if (timed is None and top.session is None and top.parent is None
                and (rt is None or rt.opens_nothing(top.step, False))):
            return  # out of the window with no timeline: the step alone is held (see the class notes)
        parts = role_parts(role)
        found = self._find(parts)
        if found is not None:
            self._end_through(found, in_flight=True)
            top = self._top
            assert top is not None
        if rt is None or rt.opens_nothing(top.step, False):
            mark = idle(top.step, parts, tags, top)
        else:
            session = Session(top.scope, None, role, tags)
            session.context = top.target
            session.start_held()
            mark = Mark(top.step, parts, tags, session, top)
        OWNER.held = self._top = mark

    def end_role(self, role: str | None = None) -> None:
        """End ``role`` (default: the innermost) and the roles inside it; nothing if it is not open."""
        timed = self._timed
        top = self._top
        if (timed is not None and top is not None and top.session is None and role is not None and role == timed[3]
                and not timed[5]):
            # The common case out of the window: the step's top-level role, innermost, opening nothing. What
            # the general path below does for it, written out: the timeline's append and the mark popped.
            parent = top.parent
            # (``(role,)``: role_parts(role) for a role of one part, without the call; "a/b" takes the path below.)
            if parent is not None and parent.parent is None and top.added == (role,):
                events = timed[0].events
                events.append((role, timed[4], _clock()))
                if len(events) >= FLUSH_EVENTS:
                    timed[0].hand_over(None)
                timed[3] = None
                self._top = parent
                if OWNER.held is top:
                    OWNER.held = parent
                return
        if timed is not None and timed[3] is not None:  # the timeline: the top-level role, or one inside it
            if role == timed[3] or (role is None and not timed[5]):
                events = timed[0].events  # Timeline.role, written out (one Python call less per role)
                events.append((timed[3], timed[4], _clock()))
                if len(events) >= FLUSH_EVENTS:
                    timed[0].hand_over(None)
                timed[3] = None
            elif timed[5]:
                timed[5] -= 1
        top = self._top
        if top is None or top.parent is None:
            return
        if role is not None:
            if type(role) is not str:
                check(None, role)
            parts = role_parts(role)
            if top.added != parts:
                found = self._find(parts)
                if found is None:
                    return
                top = found
        if top.session is None and top is self._top:  # the innermost, opening nothing: _end_through, written out
            self._top = parent = top.parent
            if OWNER.held is top:
                OWNER.held = parent
            return
        self._end_through(top, in_flight=False)

    def switch_role(self, ending: str | None, beginning: str | None) -> None:
        """End role ``ending``, then begin role ``beginning`` (either ``None``: skipped); what the two calls do.

        For a framework event that is both the end of one phase and the start of the next (the
        ``Trainer``'s ``on_pre_optimizer_step``, a micro-batch's ``on_substep_end``): one call.
        """
        timed = self._timed
        top = self._top
        if (timed is not None and top is not None and top.session is None and ending is not None
                and ending == timed[3] and not timed[5] and type(beginning) is str and beginning):
            # Out of the window, from one top-level role to the next (see end_role and begin_role): one clock
            # read ends the one and starts the other, the mark of the one replaced by the other's.
            parent = top.parent
            owner = OWNER
            rt = owner.runtime
            if (parent is not None and parent.parent is None and owner.held is top and top.added == (ending,)
                    and (rt is None or top.step not in rt.busy_roles)):
                mark: Mark = _new(Mark)
                mark.added = role_parts(beginning)  # (raises for a role such as "/")
                mark.step = top.step
                mark.tags = {}
                mark.session = mark._scope = mark.target = None
                mark.parent = parent
                now = _clock()
                events = timed[0].events
                events.append((ending, timed[4], now))
                if len(events) >= FLUSH_EVENTS:
                    timed[0].hand_over(None)
                timed[3], timed[4] = beginning, now
                owner.held = self._top = mark
                return
        if ending is not None:
            self.end_role(ending)
        if beginning is not None:
            self.begin_role(beginning)

    def close(self) -> None:
        """End whatever this object holds open (idempotent)."""
        if self._top is not None:
            self._end_all(in_flight=True)

    def __enter__(self) -> Steps:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._top is not None:
            if exc_type is not None:
                mark: Mark | None = self._top
                while mark is not None:  # each open step and role capture notes the exception that left it
                    if mark.session is not None:
                        note_raised(mark.session, exc_type)
                    mark = mark.parent
            self._end_all(in_flight=exc_type is not None)

    def __repr__(self) -> str:
        return f"Steps(step={self.step!r}, roles={self.roles!r})"

    # -- the marks ---------------------------------------------------------------------------

    def _find(self, parts: tuple[str, ...]) -> Mark | None:
        """The outermost open role mark that added ``parts``."""
        found = None
        mark = self._top
        while mark is not None and mark.parent is not None:
            if mark.added == parts:
                found = mark
            mark = mark.parent
        return found

    def _end_all(self, in_flight: bool) -> None:
        timed, self._timed = self._timed, None
        if timed is not None:  # Timeline.role and .step, written out
            end = _clock()
            timeline = timed[0]
            events = timeline.events
            if timed[3] is not None:
                events.append((timed[3], timed[4], end))
            events.append((timed[1], timed[2], end))
            if end >= timeline.due or len(events) >= FLUSH_EVENTS:
                timeline.hand_over(end)
            counted = OWNER.timed  # untime(), written out
            if counted:
                counted.pop()
        top, self._top = self._top, None
        if top is not None and top.session is None and top.parent is None:  # a step out of the window
            if OWNER.held is top:
                OWNER.held = None
            return
        pop_all(top, None, in_flight)

    def _end_through(self, target: Mark, in_flight: bool) -> None:
        """End the marks from the innermost up to and including ``target``."""
        top, self._top = self._top, target.parent
        pop_all(top, target, in_flight)
