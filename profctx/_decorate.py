"""``@profiled``: the decorator form of a role block, free when nothing can be captured."""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncGenerator, Callable, Generator
from typing import Any, TypeVar, overload

import wrapt

from . import _state
from ._policy import Session, profile_step
from ._scope import SCOPE

F = TypeVar("F", bound=Callable[..., Any])


@overload
def profiled(fn: F, /) -> F: ...


@overload
def profiled(*, role: str | None = None) -> Callable[[F], F]: ...


def profiled(fn: Any = None, /, *, role: str | None = None) -> Any:
    """Run the decorated callable inside a role block (``role`` defaults to its qualified name).

    Works with and without parentheses on functions, methods, classmethods, staticmethods,
    coroutine functions, generators and async generators; keeps the signature. When no
    block of this process is inside an in-window step, the call goes straight to the
    function (the check is one C-level call); the role is then not set in ``current()``.
    """
    if fn is None:
        return functools.partial(_decorate, role=role)
    if isinstance(fn, str):
        raise TypeError("profiled takes the role as a keyword: @profiled(role=...)")
    return _decorate(fn, role=role)


def _decorate(fn: Any, *, role: str | None) -> Any:
    target = fn.__func__ if isinstance(fn, (classmethod, staticmethod)) else fn
    if not callable(target):
        raise TypeError(f"profiled: {fn!r} is not callable")
    name = role or getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
    if inspect.isasyncgenfunction(target):
        wrapper = _async_generator_wrapper(name)
    elif inspect.iscoroutinefunction(target):
        wrapper = _coroutine_wrapper(name)
    elif inspect.isgeneratorfunction(target):
        wrapper = _generator_wrapper(name)
    else:
        wrapper = _function_wrapper(name)
    return wrapt.FunctionWrapper(fn, wrapper, enabled=_state.GATE.__len__)  # type: ignore[arg-type]


def _function_wrapper(role: str) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with profile_step(role=role):
            return wrapped(*args, **kwargs)

    return wrapper


def _coroutine_wrapper(role: str) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        async def run() -> Any:
            async with profile_step(role=role):
                return await wrapped(*args, **kwargs)

        return run()

    return wrapper


def _generator_wrapper(role: str) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        session = Session(SCOPE.get(), None, role, {})
        return _drive(session, wrapped(*args, **kwargs))

    return wrapper


def _drive(session: Session, gen: Generator[Any, Any, Any]) -> Generator[Any, Any, Any]:
    """Run ``gen`` with the role ambient during each resume and one capture over its whole life."""
    opened = False
    failed = True
    try:
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            if not opened:
                session.open()
                opened = True
            tokens = session.activate()
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
        if opened:
            session.close(in_flight=failed)


def _async_generator_wrapper(role: str) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        session = Session(SCOPE.get(), None, role, {})
        return _adrive(session, wrapped(*args, **kwargs))

    return wrapper


async def _adrive(session: Session, agen: AsyncGenerator[Any, Any]) -> AsyncGenerator[Any, Any]:
    """The async twin of :func:`_drive`."""
    opened = False
    failed = True
    try:
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            if not opened:
                session.open()
                opened = True
            tokens = session.activate()
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
        if opened:
            session.close(in_flight=failed)
