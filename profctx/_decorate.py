"""``@profiled``: the decorator form of a role block, free when nothing can be captured."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import AsyncGenerator, Callable, Generator
from typing import Any, TypeVar, overload

from ._block import Session, profile_step
from ._owner import OWNER
from ._propagate import (
    CARRIER_KEY,
    carried_parent,
    idle,
    install_ray_support,
    ray_invocation,
    receive,
)
from ._scope import SCOPE

F = TypeVar("F", bound=Callable[..., Any])


@overload
def profiled(fn: F, /) -> F: ...


@overload
def profiled(*, role: str | None = None) -> Callable[[F], F]: ...


def profiled(fn: Any = None, /, *, role: str | None = None) -> Any:
    """Run the decorated callable inside a role block (``role`` defaults to its qualified name).

    Works with and without parentheses on functions, methods, classmethods, staticmethods,
    coroutine functions, generators, async generators and other callables (builtins,
    ``functools.partial``, ``operator.itemgetter``); keeps the signature. When this call
    cannot capture, range or start an engine — no block of the process is inside an
    in-window step, the rank is not selected, or the role is filtered out — it goes
    straight to the function (the check is one C-level call) and the role is not set in
    ``current()``. A method looked up then (``obj.method``) is the plain bound method.

    On a Ray actor, a call made from a process that profiles carries the caller's scope
    (and config) in the reserved keyword ``__profctx__``, which is removed before the
    function runs; see ``docs/distributed.md``.
    """
    if fn is None:
        return functools.partial(_decorate, role=role)
    if isinstance(fn, str):
        raise TypeError("profiled takes the role as a keyword: @profiled(role=...)")
    return _decorate(fn, role=role)


def _decorate(fn: Any, *, role: str | None) -> Any:
    target = fn.__func__ if isinstance(fn, (classmethod, staticmethod)) else fn
    if not callable(target):
        raise TypeError(f"profiled: {fn!r} is not callable; decorate a function, method or other callable")
    if role is not None and (not isinstance(role, str) or not role.strip("/")):
        raise TypeError(f"profiled: role {role!r} is not valid; give a non-empty string such as 'rollout'")
    name = role or _name_of(target)
    if inspect.isasyncgenfunction(target):
        wrapper = _async_generator_wrapper(name)
    elif inspect.iscoroutinefunction(target):
        wrapper = _coroutine_wrapper(name)
    elif inspect.isgeneratorfunction(target):
        wrapper = _generator_wrapper(name)
    else:
        wrapper = _function_wrapper(name)
    if not hasattr(target, "__ray_invocation_decorator__"):
        # Ray applies this on the caller's side of every actor call: it adds the carrier.
        with contextlib.suppress(AttributeError, TypeError):  # builtins and C callables take no attributes
            target.__ray_invocation_decorator__ = ray_invocation  # type: ignore[union-attr]
    install_ray_support()
    OWNER.mark_worker()
    switch = OWNER.switch(name)
    from . import _wrappers  # wrapt (with asyncio and ssl): at the first @profiled, not at import profctx

    get = getattr(type(fn), "__get__", None)
    cls = _wrappers.ProfiledFunction if get is None else _wrappers.method_class(fn, switch, get)
    profiled_fn = cls(fn, wrapper, enabled=switch.__len__)  # type: ignore[arg-type]
    profiled_fn._self_profctx_role = role
    profiled_fn._self_profctx_rebuild = _rebuild
    return profiled_fn


def _name_of(target: Any) -> str:
    """The default role of a callable: its qualified name, or its type's for callables without one."""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if isinstance(name, str) and name:
        return name
    inner = getattr(target, "func", None)  # functools.partial
    if inner is not None and inner is not target:
        return _name_of(inner)
    return type(target).__qualname__


def __getattr__(name: str) -> Any:
    """The wrapper types, from :mod:`profctx._wrappers` (imported on first use: it imports wrapt)."""
    if name in ("ProfiledFunction", "ProfiledBoundFunction"):
        from . import _wrappers

        return getattr(_wrappers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _rebuild(fn: Any, role: str | None) -> Any:
    """Unpickle a :class:`ProfiledFunction`: decorate ``fn`` again in this process."""
    return _decorate(fn, role=role)


_NOTHING = object()


def _carried(kwargs: dict[str, Any]) -> Any:
    """Remove the reserved carrier keyword; return the scope to adopt, ``None`` (unusable) or ``_NOTHING``."""
    data = kwargs.pop(CARRIER_KEY, _NOTHING)
    return _NOTHING if data is _NOTHING else receive(data)


def _function_wrapper(role: str) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        scope: Any = _carried(kwargs) if kwargs else _NOTHING
        if scope is _NOTHING:
            if idle():
                return wrapped(*args, **kwargs)
            with profile_step(role=role):
                return wrapped(*args, **kwargs)
        if scope is None:
            return wrapped(*args, **kwargs)
        token = SCOPE.set(carried_parent(scope))
        try:
            with profile_step(scope.step, role):
                return wrapped(*args, **kwargs)
        finally:
            SCOPE.reset(token)

    return wrapper


def _coroutine_wrapper(role: str) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        scope: Any = _carried(kwargs) if kwargs else _NOTHING
        if scope is None or (scope is _NOTHING and idle()):
            return wrapped(*args, **kwargs)

        async def run() -> Any:
            if scope is _NOTHING:
                async with profile_step(role=role):
                    return await wrapped(*args, **kwargs)
            token = SCOPE.set(carried_parent(scope))
            try:
                async with profile_step(scope.step, role):
                    return await wrapped(*args, **kwargs)
            finally:
                SCOPE.reset(token)

        return run()

    return wrapper


def _session(kwargs: dict[str, Any], role: str) -> Session | None:
    """The session of a generator call: under the carried scope if one came, else the ambient one."""
    scope: Any = _carried(kwargs) if kwargs else _NOTHING
    if scope is _NOTHING:
        return None if idle() else Session(SCOPE.get(), None, role, {})
    if scope is None:
        return None
    return Session(carried_parent(scope), scope.step, role, {})


def _generator_wrapper(role: str) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        session = _session(kwargs, role)
        if session is None:
            return wrapped(*args, **kwargs)
        return _drive(session, wrapped(*args, **kwargs))

    return wrapper


def _drive(session: Session, gen: Generator[Any, Any, Any]) -> Generator[Any, Any, Any]:
    """Run ``gen`` as one block over its whole life (captures, ranges and engines open once),
    with its role ambient during each resume only."""
    started = False
    failed = True
    try:
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            if started:
                tokens = session.activate()
            else:
                tokens = session.start()
                started = True
            try:
                item = gen.send(sent) if thrown is None else gen.throw(thrown)
            except StopIteration as stop:
                failed = False
                return stop.value
            finally:
                session.deactivate(tokens)
            sent, thrown = None, None
            try:
                sent = yield item
            except GeneratorExit:
                gen.close()
                failed = False
                raise
            except BaseException as exc:  # noqa: BLE001 - forwarded into the generator
                thrown = exc
    finally:
        if started:
            session.finish(None, in_flight=failed)


def _async_generator_wrapper(role: str) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        session = _session(kwargs, role)
        if session is None:
            return wrapped(*args, **kwargs)
        return _adrive(session, wrapped(*args, **kwargs))

    return wrapper


async def _adrive(session: Session, agen: AsyncGenerator[Any, Any]) -> AsyncGenerator[Any, Any]:
    """The async twin of :func:`_drive` (engines start and stop concurrently)."""
    started = False
    failed = True
    try:
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            if started:
                tokens = session.activate()
            else:
                tokens = await session.astart()
                started = True
            try:
                item = await (agen.asend(sent) if thrown is None else agen.athrow(thrown))
            except StopAsyncIteration:
                failed = False
                return
            finally:
                session.deactivate(tokens)
            sent, thrown = None, None
            try:
                sent = yield item
            except GeneratorExit:
                await agen.aclose()
                failed = False
                raise
            except BaseException as exc:  # noqa: BLE001 - forwarded into the generator
                thrown = exc
    finally:
        if started:
            await session.afinish(None, in_flight=failed)
