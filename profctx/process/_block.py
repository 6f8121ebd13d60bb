"""``profile_step``: the block that sets the ambient scope and runs what the plan opens for it."""

from __future__ import annotations

import operator
import threading
import weakref
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any, final

from ..core._scope import ROOT, SCOPE, Scope, Unfrozen, merge_tags, role_parts, under
from ..util._errors import ConfigError
from ._api import configure_from_environment
from ._capture import Capture, Range
from ._owner import OWNER
from ._runtime import Opened, Runtime

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

    __slots__ = ("__weakref__", "_guard", "context", "opened", "runtime", "scope", "sets_role", "sets_step")

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
        try:
            self.open()
            if self.wants_engines():
                self.enter_engines()
        except BaseException:
            self.finish(None, in_flight=True)
            raise

    # -- the whole life, for the with-statement and the decorators -------------------------------

    def start(self) -> Tokens:
        """Open, start engines, activate; on any failure undo all of it and re-raise."""
        tokens: Tokens | None = None
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

    __slots__ = ("scope", "session", "target", "thread")

    def __init__(self, session: Session) -> None:
        self.session = session
        self.scope = session.scope
        opened = session.opened
        self.target = opened.target if opened is not None else None
        self.thread = threading.get_ident()

    def release(self, in_flight: bool = False) -> None:
        """End the step: stop its hooks and close what it opened (call on the holding thread)."""
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
    new = Unfrozen()  # parent.child(None, role, {}) written out (tests/test_fast_path.py checks they agree)
    new.step = parent.step
    new.roles = parent.roles + role_parts(role)
    new._tags = parent._tags
    if rt.role_block(None, new.step, new.roles) != "":
        return None
    new.__class__ = Scope  # type: ignore[assignment]
    return SCOPE.set(new)  # type: ignore[arg-type]


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
    if step is None or (type(step) is int and step >= 0):
        return step
    if isinstance(step, str):
        raise ConfigError("step", step, f"a step is an integer >= 0; to name a role write profile_step(role={step!r})")
    if isinstance(step, bool):
        raise ConfigError("step", step, "a step is an integer >= 0, not a bool")
    try:
        value = operator.index(step)
    except TypeError:
        raise ConfigError(
            "step", step, "a step is an integer >= 0 (int, numpy integer or 0-d integer tensor) or None"
        ) from None
    if value < 0:
        raise ConfigError("step", step, "a step is an integer >= 0 or None")
    return value


@final
class profile_step:  # noqa: N801 - used like a function: ``with profile_step(3):``
    """Set the ambient step, role and tags for a block; capture when the config selects it.

    ``step`` and ``role`` not given are inherited from the enclosing block; a role nests
    under the enclosing role path (``"train/actor_update"``). Works with ``with`` and
    ``async with``; the scope is restored exactly on exit, exceptions included, and
    exceptions raised in the block pass through unchanged. One object per ``with``.
    """

    __slots__ = ("_entered", "_role", "_step", "_tags", "_tokens")

    def __init__(self, step: int | None = None, role: str | None = None, **tags: Any) -> None:
        self._step = step
        self._role = role
        self._tags = tags
        #: While entered: the block's Session; only its scope token when it opened nothing; or
        #: (scope token, capture, range) for a role-only block in the window that needs no Session.
        self._entered: Session | Token[Scope] | tuple[Token[Scope], Capture | None, Range | None] | None = None
        self._tokens: Tokens | None = None

    def _new(self) -> Session:
        if self._entered is not None:
            raise RuntimeError("a profile_step object is already entered; create one per with-block")
        session = self._entered = Session(SCOPE.get(), self._step, self._role, self._tags)
        return session

    def __enter__(self) -> Scope:
        # A held step (a Ray worker inside its driver's step) nests blocks under it: Session does that.
        owner = OWNER
        held = owner.held
        # A step marked by ``profctx.Steps`` out of the window (its ``session`` is None) opens nothing
        # either: such blocks take the fast path too, and ``current()`` adds the held step when read.
        if owner.env_read and (held is None or held.session is None) and self._entered is None:
            step = self._step
            role = self._role
            if (step is not None and (type(step) is not int or step < 0)) or (
                role is not None and type(role) is not str
            ):
                # Raises, or returns a numpy/tensor integer as an int (an int or str subclass passes through).
                step = self._step = check(step, role)
            # Nothing can open without a runtime, nor out of the window when no stop is pending
            # (``rt.deferred``) and no contiguous run waits for a step block to close it
            # (``rt.run``): only the ambient scope changes (no Session). Most blocks of a run take
            # this path, so the test and the child scope are written out here (no Python call).
            rt = owner.runtime
            parent = SCOPE.get()
            at = parent.step if step is None else step
            if at is None and held is not None:
                at = held.step
            if step is not None and rt is not None and rt.watch is not None:
                rt.watch(step)  # the anomaly watch (``auto_capture``): it may add this step to the window
            if rt is None or (not rt.deferred and at not in rt.in_window
                              and (step is None or rt.run is None)):  # rt.opens_nothing(...), written out
                tags = self._tags
                new = Unfrozen()
                if step is None:
                    new.step = parent.step
                else:  # a step block: one store per step, the step named should nothing be captured
                    new.step = owner.last_step = step
                new.roles = parent.roles if role is None else parent.roles + role_parts(role)
                new._tags = merge_tags(parent._tags, tags) if tags else parent._tags
                new.__class__ = Scope  # type: ignore[assignment]
                self._entered = SCOPE.set(new)  # type: ignore[arg-type]
                return new  # type: ignore[return-value]
            if step is None and role is not None and held is None:
                # A role that opens nothing, or is a range of a live capture: drawn here (no Session).
                tags = self._tags
                new = Unfrozen()
                new.step = at
                new.roles = parent.roles + role_parts(role)
                new._tags = merge_tags(parent._tags, tags) if tags else parent._tags
                new.__class__ = Scope  # type: ignore[assignment]
                scope: Scope = new  # type: ignore[assignment]
                capture = CONTEXT.get()
                name = rt.role_block(capture, at, scope.roles)
                if name is not None:
                    owner.open_gate(self)
                    entry: Range | None = None
                    try:
                        if name and capture is not None:
                            entry = capture.open_range(name)
                        self._entered = (SCOPE.set(scope), capture, entry)
                        return scope
                    except BaseException:
                        try:
                            if entry is not None and capture is not None:
                                capture.close_range(entry)
                        finally:
                            owner.close_gate(self)
                        raise
        session = self._new()
        tokens: Tokens | None = None
        try:
            tokens = self._tokens = session.start()
            return session.scope
        except BaseException:
            self._entered = self._tokens = None
            if tokens is not None:  # started, then interrupted: the with-body will not run
                session.finish(tokens, in_flight=True)
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        entered = self._entered
        self._entered = None
        kind = type(entered)
        if kind is Token:  # entered without opening anything: most blocks
            SCOPE.reset(entered)  # type: ignore[arg-type]
        elif kind is Session:
            tokens, self._tokens = self._tokens, None
            entered.finish(tokens, in_flight=exc_type is not None)  # type: ignore[union-attr]
        elif kind is tuple:  # a range in a live capture
            token, capture, entry = entered  # type: ignore[misc]
            try:
                SCOPE.reset(token)
            finally:
                try:
                    if entry is not None:
                        capture.close_range(entry)  # type: ignore[union-attr]
                finally:
                    OWNER.close_gate(self)
        else:
            raise RuntimeError("a profile_step object was exited without being entered")

    async def __aenter__(self) -> Scope:
        session = self._new()
        tokens: Tokens | None = None
        try:
            tokens = self._tokens = await session.astart()
            return session.scope
        except BaseException:
            self._entered = self._tokens = None
            if tokens is not None:
                await session.afinish(tokens, in_flight=True)
            raise

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        session, tokens = self._entered, self._tokens
        self._entered = self._tokens = None
        assert isinstance(session, Session)
        await session.afinish(tokens, in_flight=exc_type is not None)
