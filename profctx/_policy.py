"""``profile_step``: the block that sets the ambient scope and opens what the config asks for."""

from __future__ import annotations

import asyncio
from contextvars import Token
from types import TracebackType
from typing import Any, final

from . import _state
from ._capture import Capture
from ._runtime import Frame
from ._scope import SCOPE, Scope


class Session:
    """A scope whose opening, activation and closing the caller times.

    ``profile_step`` opens and activates on entry; decorated generators activate around
    each resume but open once and close once.
    """

    __slots__ = ("frame", "runtime", "scope", "sets_role", "sets_step")

    def __init__(self, parent: Scope, step: int | None, role: str | None, tags: dict[str, Any]) -> None:
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise ValueError(f"step: {step!r} is not valid; a step is an integer >= 0 or None")
        if role is not None and not isinstance(role, str):
            raise ValueError(f"role: {role!r} is not valid; a role is a string such as 'rollout'")
        self.scope = parent.child(step, role, tags)
        self.sets_step = step is not None
        self.sets_role = role is not None
        self.frame: Frame | None = None
        self.runtime = _state.RUNTIME

    def open(self) -> None:
        """Open the captures and ranges the config asks for (call with the parent scope active)."""
        rt = self.runtime
        if rt is not None:
            self.frame = rt.enter(self.scope, self.sets_step, self.sets_role)

    def activate(self) -> tuple[Token[Scope], Token[Capture | None] | None]:
        """Make this scope (and its capture) ambient; return the tokens for :meth:`deactivate`."""
        frame = self.frame
        live_token = _state.LIVE.set(frame.live) if frame is not None and frame.live is not None else None
        return SCOPE.set(self.scope), live_token

    @staticmethod
    def deactivate(tokens: tuple[Token[Scope], Token[Capture | None] | None]) -> None:
        """Restore the scope that was ambient before :meth:`activate`."""
        scope_token, live_token = tokens
        if live_token is not None:
            _state.LIVE.reset(live_token)
        SCOPE.reset(scope_token)

    def hooks_wanted(self) -> bool:
        """Whether role hooks (engines) are to be called for this block."""
        return self.frame is not None and self.sets_role and bool(_state.ROLE_HOOKS)

    def enter_hooks(self) -> None:
        """Start every attached role hook (sync)."""
        assert self.frame is not None and self.runtime is not None
        for hook in list(_state.ROLE_HOOKS):
            try:
                handle = hook.enter(self.scope)
            except Exception as exc:  # noqa: BLE001
                self.runtime.failure("engine start", exc)
                continue
            if handle is not None:
                self.frame.hooks.append((hook, handle))

    async def aenter_hooks(self) -> None:
        """Start every attached role hook concurrently."""
        assert self.frame is not None and self.runtime is not None
        hooks = list(_state.ROLE_HOOKS)
        results = await asyncio.gather(*(h.aenter(self.scope) for h in hooks), return_exceptions=True)
        for hook, result in zip(hooks, results, strict=False):
            if isinstance(result, BaseException):
                self.runtime.failure("engine start", result)
            elif result is not None:
                self.frame.hooks.append((hook, result))

    def exit_hooks(self) -> None:
        """Stop the hooks started by :meth:`enter_hooks`, last first."""
        assert self.frame is not None and self.runtime is not None
        hooks, self.frame.hooks = self.frame.hooks, []
        for hook, handle in reversed(hooks):
            try:
                hook.exit(handle)
            except Exception as exc:  # noqa: BLE001
                self.runtime.failure("engine stop", exc, in_flight=True)

    async def aexit_hooks(self) -> None:
        """Stop the hooks started by :meth:`aenter_hooks`, concurrently."""
        assert self.frame is not None and self.runtime is not None
        hooks, self.frame.hooks = self.frame.hooks, []
        results = await asyncio.gather(*(h.aexit(handle) for h, handle in hooks), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                self.runtime.failure("engine stop", result, in_flight=True)

    def close(self, in_flight: bool) -> None:
        """Close what :meth:`open` opened."""
        if self.frame is not None and self.runtime is not None:
            frame, self.frame = self.frame, None
            self.runtime.exit(frame, in_flight=in_flight)


@final
class profile_step:  # noqa: N801 - used like a function: ``with profile_step(3):``
    """Set the ambient step, role and tags for a block; capture when the config selects it.

    ``step`` and ``role`` not given are inherited from the enclosing block; a role nests
    under the enclosing role path (``"train/actor_update"``). Works with ``with`` and
    ``async with``; the scope is restored exactly on exit, exceptions included, and
    exceptions raised in the block pass through unchanged. One object per ``with``.
    """

    __slots__ = ("_role", "_session", "_step", "_tags", "_tokens")

    def __init__(self, step: int | None = None, role: str | None = None, **tags: Any) -> None:
        self._step = step
        self._role = role
        self._tags = tags
        self._session: Session | None = None
        self._tokens: tuple[Token[Scope], Token[Capture | None] | None] | None = None

    def _begin(self) -> Session:
        if self._tokens is not None:
            raise RuntimeError("a profile_step object is already entered; create one per with-block")
        session = Session(SCOPE.get(), self._step, self._role, self._tags)
        session.open()
        self._session = session
        return session

    def __enter__(self) -> Scope:
        session = self._begin()
        if session.hooks_wanted():
            try:
                session.enter_hooks()
            except BaseException:
                self._session = None
                session.close(in_flight=True)
                raise
        self._tokens = session.activate()
        return session.scope

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        session, tokens = self._session, self._tokens
        self._session = self._tokens = None
        assert session is not None and tokens is not None
        try:
            session.deactivate(tokens)
        finally:
            try:
                if session.frame is not None and session.frame.hooks:
                    session.exit_hooks()
            finally:
                session.close(in_flight=exc_type is not None)

    async def __aenter__(self) -> Scope:
        session = self._begin()
        if session.hooks_wanted():
            try:
                await session.aenter_hooks()
            except BaseException:
                self._session = None
                session.close(in_flight=True)
                raise
        self._tokens = session.activate()
        return session.scope

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        session, tokens = self._session, self._tokens
        self._session = self._tokens = None
        assert session is not None and tokens is not None
        try:
            session.deactivate(tokens)
        finally:
            try:
                if session.frame is not None and session.frame.hooks:
                    await session.aexit_hooks()
            finally:
                session.close(in_flight=exc_type is not None)
