"""``profile_step``: the block that sets the ambient scope and runs what the plan opens for it."""

from __future__ import annotations

import operator
import threading
import weakref
from contextvars import ContextVar, Token
from types import TracebackType
from typing import TYPE_CHECKING, Any, final

from ..core._scope import ROOT, SCOPE, Scope, Unfrozen, keep, mark_quiet, merge_tags, role_parts, under
from ..util._errors import ConfigError
from ._api import configure_from_environment
from ._capture import Capture, Range
from ._owner import OWNER
from ._runtime import Opened, Runtime
from ._timeline import FLUSH_EVENTS, Timeline
from ._timeline import clock as _clock

if TYPE_CHECKING:
    from collections.abc import Callable

#: The capture blocks of this task record into (their own, a joined run, or one refused).
CONTEXT: ContextVar[Capture | None] = ContextVar("profctx.capture", default=None)

Tokens = tuple[Token[Scope], Token[Capture | None] | None]


def current() -> Scope:
    """Return the ambient scope of the calling task or thread.

    Outside any step block, a step held for the whole process (a Ray worker inside a step its
    driver entered, ``profctx.ray.group``) is the step, with the task's own roles and tags.
    """
    return ambient(SCOPE.get())


def ambient(scope: Scope) -> Scope:
    """Return ``scope`` (the task's own), under the process's held step when it has no step of its own.

    A held step's roles (``profctx.Steps.begin_role``) come first in the role path.
    """
    held = OWNER.held
    if held is None or scope.step is not None:
        return scope
    return under(scope, held.scope)


class Session:
    """One block's life: open (ask the runtime), activate (make the scope ambient), close.

    ``profile_step`` opens and activates on entry; decorated generators activate around
    each resume but open once and close once. Engines start after the block's captures
    open and stop before they close.
    """

    __slots__ = ("__weakref__", "_guard", "context", "opened", "runtime", "scope", "sets_role", "sets_step", "tokens")

    def __init__(self, parent: Scope, step: int | None, role: str | None, tags: dict[str, Any]) -> None:
        step = check(step, role)
        #: The capture enclosing blocks record into: the task's, else the held step's.
        self.context: Capture | None = CONTEXT.get()
        held = OWNER.held
        if held is not None and parent.step is None and step is None:
            parent = ambient(parent)
            if self.context is None:
                self.context = held.target
        self.scope = parent.child(step, role, tags)
        self.sets_step = step is not None
        self.sets_role = role is not None
        self.opened: Opened | None = None
        if not OWNER.env_read:
            configure_from_environment()
        self.runtime: Runtime | None = OWNER.runtime
        self._guard: weakref.finalize[Any, Any] | None = None
        #: What :meth:`start` returned, kept by ``profile_step`` for its exit.
        self.tokens: Tokens | None = None

    def open(self) -> None:
        """Open the captures and ranges the plan asks for (call with the parent scope active).

        A block that opened a capture is guarded: should it be dropped without closing (an
        interrupt between statements of ``__exit__``), the runtime ends what it opened at the
        next block of that thread, or at exit.
        """
        rt = self.runtime
        if rt is not None:
            opened = self.opened = rt.open(self.scope, self.sets_step, self.sets_role, self.context)
            if opened is not None and (opened.owned is not None or opened.closes_run):
                self._guard = weakref.finalize(self, rt.orphaned, opened)

    def activate(self) -> Tokens:
        """Make this scope (and its capture) ambient; return the tokens for :meth:`deactivate`."""
        opened = self.opened
        target = opened.target if opened is not None else None
        capture_token = CONTEXT.set(target) if target is not None else None
        return SCOPE.set(self.scope), capture_token

    @staticmethod
    def deactivate(tokens: Tokens) -> None:
        """Restore the scope that was ambient before :meth:`activate`."""
        scope_token, capture_token = tokens
        try:
            if capture_token is not None:
                CONTEXT.reset(capture_token)
        finally:
            SCOPE.reset(scope_token)

    def wants_engines(self) -> bool:
        """Whether hooks start for this block: attached engines for a role, the driver's workers for a step."""
        opened = self.opened
        return opened is not None and ((opened.actions.engines and bool(OWNER.hooks))
                                       or (opened.actions.workers and bool(OWNER.step_hooks)))

    def _hooks(self) -> list[Any]:
        actions = self.opened.actions if self.opened is not None else None
        if actions is None:
            return []
        return [*(OWNER.step_hooks if actions.workers else ()), *(OWNER.hooks if actions.engines else ())]

    def enter_engines(self) -> None:
        """Start every attached role hook (blocking)."""
        assert self.opened is not None and self.runtime is not None
        rt = self.runtime
        for hook in self._hooks():
            try:
                handle = hook.enter(rt, self.scope)
            except Exception as exc:  # noqa: BLE001
                rt.failure("engine start", exc)
                continue
            if handle is not None:
                self.opened.hooks.append((hook, handle))

    async def aenter_engines(self) -> None:
        """Start every attached role hook concurrently."""
        import asyncio  # only async engine users pay for it: ``import profctx`` stays without asyncio/ssl

        assert self.opened is not None and self.runtime is not None
        rt = self.runtime
        hooks = self._hooks()
        results = await asyncio.gather(*(h.aenter(rt, self.scope) for h in hooks), return_exceptions=True)
        for hook, result in zip(hooks, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                rt.failure("engine start", result)
            elif result is not None:
                self.opened.hooks.append((hook, result))

    def exit_engines(self) -> None:
        """Stop the hooks :meth:`enter_engines` started, last first."""
        if self.opened is None or not self.opened.hooks or self.runtime is None:
            return
        rt = self.runtime
        hooks, self.opened.hooks = self.opened.hooks, []
        for hook, handle in reversed(hooks):
            try:
                hook.exit(rt, handle)
            except Exception as exc:  # noqa: BLE001
                rt.failure("engine stop", exc, in_flight=True)

    async def aexit_engines(self) -> None:
        """Stop the hooks :meth:`aenter_engines` started, concurrently."""
        import asyncio

        if self.opened is None or not self.opened.hooks or self.runtime is None:
            return
        rt = self.runtime
        hooks, self.opened.hooks = self.opened.hooks, []
        results = await asyncio.gather(*(h.aexit(rt, handle) for h, handle in hooks), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                rt.failure("engine stop", result, in_flight=True)

    def close(self, in_flight: bool) -> None:
        """Close what :meth:`open` opened."""
        opened = self.opened
        if opened is not None and self.runtime is not None:
            self.runtime.close(opened, in_flight=in_flight)
        self.opened = None
        if self._guard is not None:  # last: until here, a dropped block is still ended by its guard
            self._guard.detach()

    def start_held(self) -> None:
        """Open and start hooks without making the scope ambient (a held step: see :func:`hold`)."""
        if OWNER.settle:
            self._settle()
        try:
            self.open()
            if self.wants_engines():
                self.enter_engines()
        except BaseException:
            self.finish(None, in_flight=True)
            raise

    def _settle(self) -> None:
        """Finish what must land before anything opens (``OWNER.settle``: Ray joins under way); never raises."""
        for pending in list(OWNER.settle):
            try:
                pending.settle()
            except Exception as exc:  # noqa: BLE001 - recorded; the block goes on
                if self.runtime is not None:
                    self.runtime.failure("worker joins", exc)

    async def _asettle(self) -> None:
        """The async twin of :meth:`_settle` (awaits; never blocks the event loop)."""
        for pending in list(OWNER.settle):
            try:
                await pending.asettle()
            except Exception as exc:  # noqa: BLE001
                if self.runtime is not None:
                    self.runtime.failure("worker joins", exc)

    # -- the whole life, for the with-statement and the decorators -------------------------------

    def start(self) -> Tokens:
        """Open, start engines, activate; on any failure undo all of it and re-raise."""
        tokens: Tokens | None = None
        if OWNER.settle:
            self._settle()
        try:
            self.open()
            if self.wants_engines():
                self.enter_engines()
            tokens = self.activate()
            return tokens
        except BaseException:
            self.finish(tokens, in_flight=True)
            raise

    async def astart(self) -> Tokens:
        """The async twin of :meth:`start` (engines start concurrently)."""
        tokens: Tokens | None = None
        if OWNER.settle:
            await self._asettle()
        try:
            self.open()
            if self.wants_engines():
                await self.aenter_engines()
            tokens = self.activate()
            return tokens
        except BaseException:
            await self.afinish(tokens, in_flight=True)
            raise

    def finish(self, tokens: Tokens | None, in_flight: bool) -> None:
        """Deactivate (if active), stop engines, close."""
        try:
            if tokens is not None:
                self.deactivate(tokens)
        finally:
            try:
                self.exit_engines()
            finally:
                self.close(in_flight)

    async def afinish(self, tokens: Tokens | None, in_flight: bool) -> None:
        """The async twin of :meth:`finish`."""
        try:
            if tokens is not None:
                self.deactivate(tokens)
        finally:
            try:
                await self.aexit_engines()
            finally:
                self.close(in_flight)


@final
class Held:
    """A step held open for the whole process, not by one task's block (``hold``).

    While held, blocks with no step of their own, on any thread or task of the process, are
    inside this step (:func:`ambient`) and record into its capture. Released on the thread
    that held it, because the native profiler stops on the thread that started it.
    """

    __slots__ = ("scope", "session", "target", "thread", "timed")

    def __init__(self, session: Session) -> None:
        self.session = session
        self.scope = session.scope
        opened = session.opened
        self.target = opened.target if opened is not None else None
        self.thread = threading.get_ident()
        rt = OWNER.runtime
        timeline = rt.timeline if rt is not None else None
        step = self.scope.step
        #: (timeline, step, start) while the step is under way and the timeline keeps steps.
        self.timed = None if timeline is None or step is None else (timeline, step, _clock())
        if self.timed is not None:
            OWNER.timed.append(True)

    def release(self, in_flight: bool = False) -> None:
        """End the step: stop its hooks and close what it opened (call on the holding thread)."""
        timed, self.timed = self.timed, None
        if timed is not None:
            timed[0].step(timed[1], timed[2], _clock())
            untime()
        if OWNER.held is self:
            OWNER.held = None
        self.session.finish(None, in_flight=in_flight)


def hold(step: int, tags: dict[str, Any] | None = None) -> Held:
    """Enter ``step`` for the whole process (a Ray worker told by its driver); return it for :meth:`Held.release`.

    A step already held is released first. The plan decides what opens, as for a
    ``profile_step(step)`` block: a capture in step mode, nothing but the gate in role mode.
    """
    previous = OWNER.held
    if previous is not None:
        previous.release(in_flight=True)
    session = Session(ROOT, step, None, dict(tags or {}))
    session.context = None  # a held step nests in nothing, whatever the calling task holds
    session.start_held()
    held = Held(session)
    OWNER.held = held
    return held


def note_raised(session: Session, exc_type: type[BaseException]) -> None:
    """Note in the record of the capture ``session`` opened that an exception left its block (no user code runs)."""
    opened = session.opened
    owned = opened.owned if opened is not None else None
    if owned is not None and owned.raised is None:
        owned.raised = f"the block was left by an exception: {exc_type.__name__}"


def untime() -> None:
    """Note that a step the timeline timed has ended (``OWNER.timed`` loses one entry)."""
    timed = OWNER.timed
    if timed:  # (emptied by reset() while the step ran: nothing to take)
        timed.pop()


def top_timeline(parent: Scope | None = None) -> Timeline | None:
    """The timeline a role block under ``parent`` (default the ambient scope) is timed for, if any.

    A role block is timed when a step is ambient and no role encloses it: the same test as
    :meth:`profile_step._clock_in` (the held step counts, unless a role is held in it).
    """
    if parent is None:
        parent = SCOPE.get()
    if parent.roles:
        return None
    rt = OWNER.runtime
    timeline = rt.timeline if rt is not None else None
    if timeline is None or parent.step is not None:
        return timeline
    held = OWNER.held
    return timeline if held is not None and not held.scope.roles else None


def timed_call(role: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run a ``@profiled`` call nothing is captured for: a top-level role of a step is set and timed.

    Called when a step the timeline times is under way and the role's switch is off. A call
    inside a role, or outside any step, goes straight through (its time is its parent's).
    """
    parent = SCOPE.get()
    if parent.roles:  # top_timeline, _role_child and Timeline.role written out: one Python call per call
        return fn(*args, **kwargs)
    rt = OWNER.runtime
    timeline = rt.timeline if rt is not None else None
    if timeline is None:
        return fn(*args, **kwargs)
    if parent.step is None:
        held = OWNER.held
        if held is None or held.scope.roles:
            return fn(*args, **kwargs)
    try:
        kids = parent._kids
    except AttributeError:  # a scope filled in without it
        kids = None
    child = kids.get(role) if kids else None
    token = SCOPE.set(_role_child(parent, role) if child is None else child)
    start = _clock()
    try:
        return fn(*args, **kwargs)
    finally:
        end = _clock()
        SCOPE.reset(token)
        events = timeline.events
        events.append((role, start, end))
        if len(events) >= FLUSH_EVENTS:
            timeline.hand_over(None)


async def atimed_call(role: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The coroutine twin of :func:`timed_call`."""
    parent = SCOPE.get()
    timeline = top_timeline(parent)
    if timeline is None:
        return await fn(*args, **kwargs)
    token = SCOPE.set(_role_child(parent, role))
    start = _clock()
    try:
        return await fn(*args, **kwargs)
    finally:
        end = _clock()
        SCOPE.reset(token)
        timeline.role(role, start, end)


def enter_role(role: str) -> Token[Scope] | None:
    """Set the scope of a ``@profiled`` call of ``role`` when that is all its block would do; return the token.

    ``None``: the call needs the whole block (:class:`profile_step`). Called only while a
    block of the process is inside an in-window step (the gate is open, and stays open around
    the call): a role the plan neither captures, ranges nor starts engines for, outside any
    capture — in role mode, a role the filter leaves out, kept in the scope because a role
    it holds may open a capture whose path names it — then costs one scope change, with no
    block object and no gate of its own.
    """
    owner = OWNER
    rt = owner.runtime
    if rt is None or owner.held is not None or CONTEXT.get() is not None:
        return None
    parent = SCOPE.get()
    scope = _role_child(parent, role)
    # rt.role_block's answer kept on the kept child for the policies in force (Scope._quiet), with its
    # window test: no Python call.
    if scope._quiet is rt._policies and not rt.deferred and parent.step in rt.in_window:
        return SCOPE.set(scope)
    roles = scope.roles
    if rt.role_block(None, parent.step, roles) != "":
        return None
    quiet = rt.quiet.get(roles)
    if quiet is not None:
        mark_quiet(scope, quiet)
    return SCOPE.set(scope)


def _role_child(parent: Scope, role: str) -> Scope:
    """Return ``parent.child(None, role, {})``: the one ``parent`` keeps (``_scope.keep``), else a new one kept."""
    try:
        kids = parent._kids
    except AttributeError:  # a scope filled in without it
        kids = None
    if kids is not None:
        found = kids.get(role)
        if found is not None:
            return found
    new = Unfrozen()  # parent.child(None, role, {}) written out (tests/test_fast_path.py checks they agree)
    new.step = parent.step
    new.roles = parent.roles + role_parts(role)
    new._tags = parent._tags
    new._kids = new._quiet = None
    new.__class__ = Scope  # type: ignore[assignment]
    keep(parent, role, new)  # type: ignore[arg-type]
    return new  # type: ignore[return-value]


def leave_role(token: Token[Scope]) -> None:
    """Undo :func:`enter_role` (a function: a by-value copy of a wrapper pickles it by name)."""
    SCOPE.reset(token)


def check(step: Any, role: Any) -> int | None:
    """Return ``step`` as an ``int`` (or ``None``); raise :class:`ConfigError` for a step or role a block cannot take.

    A step is what ``operator.index`` accepts (``int``, numpy integers, 0-d integer tensors),
    0 or more; ``bool`` is refused (a flag passed where the step goes). A string where the step
    goes is taken for a role and the error says to write ``role=``.
    """
    if role is not None and not isinstance(role, str):
        raise ConfigError("role", role, "a role is a string such as 'rollout'")
    if step is None or type(step) is int:
        return step
    if isinstance(step, str):
        raise ConfigError("step", step, f"a step is an integer; to name a role write profile_step(role={step!r})")
    if isinstance(step, bool):
        raise ConfigError("step", step, "a step is an integer, not a bool")
    try:
        return operator.index(step)
    except TypeError:
        raise ConfigError(
            "step", step, "a step is an integer (int, numpy integer or 0-d integer tensor) or None"
        ) from None


@final
class profile_step:  # noqa: N801 - used like a function: ``with profile_step(3):``
    """Set the ambient step, role and tags for a block; capture when the config selects it.

    ``step`` and ``role`` not given are inherited from the enclosing block; a role nests
    under the enclosing role path (``"train/actor_update"``). Works with ``with`` and
    ``async with``; the scope is restored exactly on exit, exceptions included, and
    exceptions raised in the block pass through unchanged. One object per ``with``.
    """

    __slots__ = ("_entered", "_role", "_step", "_t0", "_tags", "_tl")

    def __init__(self, step: int | None = None, role: str | None = None, **tags: Any) -> None:
        self._step = step
        self._role = role
        self._tags = tags
        #: While entered: the block's Session; only its scope token when it opened nothing; or
        #: (scope token, capture, range) for a role-only block in the window that needs no Session. (A
        #: Session keeps its own tokens: one store less per block, about 15 ns.)
        self._entered: Session | Token[Scope] | tuple[Token[Scope], Capture | None, Range | None] | None = None
        #: The timeline this block is timed for (a step, or a role directly under the step); ``_t0``: its start,
        #: set only with it.
        self._tl: Timeline | None = None

    def _new(self) -> Session:
        if self._entered is not None:
            raise RuntimeError("a profile_step object is already entered; create one per with-block")
        session = self._entered = Session(SCOPE.get(), self._step, self._role, self._tags)
        return session

    def __enter__(self) -> Scope:
        owner = OWNER
        held = owner.held
        # The fast path, for blocks that open nothing and role blocks an in-window step draws nothing or
        # a range for (no Session). Most blocks of a run take it, so its tests, the child scope and the
        # timeline are written out here (no Python call). A step marked by ``profctx.Steps`` out of the
        # window (its ``session`` is None) opens nothing either: ``current()`` adds it when read.
        if (held is None or held.session is None) and owner.env_read and self._entered is None:
            step = self._step
            role = self._role
            if (step is not None and (type(step) is not int or step < 0)) or (
                role is not None and type(role) is not str
            ):
                # Raises, or returns a numpy/tensor integer as an int (an int or str subclass passes through).
                step = self._step = check(step, role)
            rt = owner.runtime
            parent = SCOPE.get()
            if step is not None:
                if rt is not None and rt.watch is not None and step >= 0:  # (a negative step: a warm-up or eval pass)
                    rt.watch(step)  # the anomaly watch (``auto_capture``): it may add this step to the window
                # Runtime.opens_nothing(step, True), written out: busy_steps holds the window's steps, or
                # every step while a stop is pending or a contiguous run waits for a step block to close it.
                if rt is None or step not in rt.busy_steps:
                    tags = self._tags
                    new = Unfrozen()
                    new.step = owner.last_step = step  # one store per step: the step named should nothing be captured
                    new.roles = parent.roles if role is None else parent.roles + role_parts(role)
                    new._tags = merge_tags(parent._tags, tags) if tags else parent._tags
                    new._kids = None  # (``_quiet`` is read on kept children only: one store less)
                    new.__class__ = Scope  # type: ignore[assignment]
                    self._entered = SCOPE.set(new)  # type: ignore[arg-type]
                    if rt is not None and parent.step is None and held is None:  # timed (_clock_in, written out)
                        timeline = rt.timeline
                        if timeline is not None:
                            self._tl = timeline
                            self._t0 = _clock()
                            owner.timed.append(True)
                    return new  # type: ignore[return-value]
            else:
                at = parent.step
                if at is None and held is not None:
                    at = held.step
                tags = self._tags
                if role is not None and not tags:
                    # A role-only block: the child its parent keeps (_role_child, written out).
                    try:
                        kids = parent._kids
                    except AttributeError:  # a scope filled in without it
                        kids = None
                    child = kids.get(role) if kids else None
                    if child is None:
                        child = _role_child(parent, role)
                    if rt is None or at not in rt.busy_roles:  # Runtime.opens_nothing(at, False), written out
                        self._entered = SCOPE.set(child)
                        if (rt is not None and at is not None and not parent.roles  # timed (_clock_in)
                                and (parent.step is not None or not held.scope.roles)):
                            timeline = rt.timeline
                            if timeline is not None:
                                self._tl = timeline
                                self._t0 = _clock()
                        return child
                    if held is None:
                        capture = CONTEXT.get()
                        # Runtime.role_block's answer, kept on the kept child for the policies in force
                        # (Scope._quiet): one identity test, and the gate (Owner.open_gate) written out.
                        if capture is None and child._quiet is rt._policies and not rt.deferred:
                            owner.gate.append(self)
                            if not owner._lit:
                                owner.refresh()
                            self._entered = (SCOPE.set(child), None, None)
                            if at is not None and not parent.roles:  # timed (_clock_in, written out)
                                timeline = rt.timeline
                                if timeline is not None:
                                    self._tl = timeline
                                    self._t0 = _clock()
                            return child
                        return self._in_window(owner, rt, parent, at, child, capture)
                elif rt is None or at not in rt.busy_roles:
                    new = Unfrozen()
                    new.step = parent.step
                    new.roles = parent.roles if role is None else parent.roles + role_parts(role)
                    new._tags = merge_tags(parent._tags, tags) if tags else parent._tags
                    new._kids = None
                    new.__class__ = Scope  # type: ignore[assignment]
                    self._entered = SCOPE.set(new)  # type: ignore[arg-type]
                    if (rt is not None and role is not None and at is not None and not parent.roles  # timed
                            and (parent.step is not None or not held.scope.roles)):
                        timeline = rt.timeline
                        if timeline is not None:
                            self._tl = timeline
                            self._t0 = _clock()
                    return new  # type: ignore[return-value]
                elif role is not None and held is None:
                    new = Unfrozen()
                    new.step = at
                    new.roles = parent.roles + role_parts(role)
                    new._tags = merge_tags(parent._tags, tags)
                    new._kids = new._quiet = None
                    new.__class__ = Scope  # type: ignore[assignment]
                    return self._in_window(owner, rt, parent, at, new, CONTEXT.get())  # type: ignore[arg-type]
        return self._enter_session()

    def _enter_session(self) -> Scope:
        """Enter through a Session: open what the plan asks for, start engines, make the scope ambient."""
        parent = SCOPE.get()
        session = self._new()
        tokens: Tokens | None = None
        try:
            tokens = session.tokens = session.start()
            self._clock_in(parent)
            return session.scope
        except BaseException:
            self._entered = None
            if tokens is not None:  # started, then interrupted: the with-body will not run
                session.finish(tokens, in_flight=True)
            raise

    def _in_window(self, owner: Any, rt: Runtime, parent: Scope, at: int | None, scope: Scope,
                   capture: Capture | None) -> Scope:
        """Enter a role block of an in-window step: nothing or a range of the live capture, else a Session.

        The block keeps the gate open while it runs (``@profiled`` switches stay on, also in a
        task that outlives its step block).
        """
        roles = scope.roles
        if capture is None and not rt.deferred and rt.quiet.get(roles) is rt._policies:
            name: str | None = ""  # Runtime.role_block's answer, kept (a block with tags: its scope is not kept)
        else:
            name = rt.role_block(capture, at, roles)
        if name is None:
            return self._enter_session()
        if not name and capture is None:
            quiet = rt.quiet.get(roles)
            if quiet is not None:  # the next block of this role (its kept child) takes __enter__'s identity test
                mark_quiet(scope, quiet)
        owner.open_gate(self)
        entry: Range | None = None
        try:
            if name and capture is not None:
                entry = capture.open_range(name)
            self._entered = (SCOPE.set(scope), capture, entry)
            self._clock_in(parent)
            return scope
        except BaseException:
            try:
                if entry is not None and capture is not None:
                    capture.close_range(entry)
            finally:
                owner.close_gate(self)
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        timeline = self._tl
        if timeline is not None:  # the timeline: Timeline.role and .step written out (no Python call per block)
            self._tl = None
            events = timeline.events
            if self._step is None:
                events.append((self._role, self._t0, _clock()))
                if len(events) >= FLUSH_EVENTS:
                    timeline.hand_over(None)
            else:
                end = _clock()
                events.append((self._step, self._t0, end))
                if end >= timeline.due or len(events) >= FLUSH_EVENTS:
                    timeline.hand_over(end)
                untime()
        entered = self._entered
        self._entered = None
        kind = type(entered)
        if kind is Token:  # entered without opening anything: most blocks
            SCOPE.reset(entered)  # type: ignore[arg-type]
        elif kind is tuple:  # a role block in an in-window step: a range in a live capture, or nothing
            token, capture, entry = entered  # type: ignore[misc]
            try:
                SCOPE.reset(token)
            finally:
                try:
                    if entry is not None:
                        capture.close_range(entry)  # type: ignore[union-attr]
                finally:
                    owner = OWNER  # Owner.close_gate(self), written out
                    gate = owner.gate
                    try:
                        gate.remove(self)
                    except ValueError:
                        pass
                    else:
                        if not gate:
                            owner.refresh()
        elif kind is Session:
            tokens, entered.tokens = entered.tokens, None  # type: ignore[union-attr]
            if exc_type is not None:
                note_raised(entered, exc_type)  # type: ignore[arg-type]
            entered.finish(tokens, in_flight=exc_type is not None)  # type: ignore[union-attr]
        else:
            raise RuntimeError("a profile_step object was exited without being entered")

    def _clock_in(self, parent: Scope) -> None:
        """Start timing this block for the timeline when it is a step, or a role directly under the step.

        A step block is timed when no step is ambient (its task's, or one held for the process); a
        role block when it sets no step, a step is ambient and no role encloses it.
        """
        rt = OWNER.runtime
        timeline = rt.timeline if rt is not None else None
        if timeline is None:
            return
        held = OWNER.held
        if self._step is not None:
            if parent.step is not None or held is not None:
                return
        elif self._role is None or parent.roles or (parent.step is None and (held is None or held.scope.roles)):
            return
        self._tl = timeline
        self._t0 = _clock()
        if self._step is not None:
            OWNER.timed.append(True)

    def _clock_out(self) -> None:
        """Note this block's time in the timeline it was timed for (see :meth:`_clock_in`)."""
        end = _clock()
        timeline, self._tl = self._tl, None
        assert timeline is not None
        if self._step is None:
            timeline.role(self._role, self._t0, end)  # type: ignore[arg-type]
        else:
            timeline.step(self._step, self._t0, end)
            untime()

    async def __aenter__(self) -> Scope:
        parent = SCOPE.get()
        session = self._new()
        tokens: Tokens | None = None
        try:
            tokens = session.tokens = await session.astart()
            self._clock_in(parent)
            return session.scope
        except BaseException:
            self._entered = None
            if tokens is not None:
                await session.afinish(tokens, in_flight=True)
            raise

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._tl is not None:
            self._clock_out()
        session = self._entered
        self._entered = None
        assert isinstance(session, Session)
        tokens, session.tokens = session.tokens, None
        if exc_type is not None:
            note_raised(session, exc_type)
        await session.afinish(tokens, in_flight=exc_type is not None)
