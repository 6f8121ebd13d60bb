"""``@profiled``: the decorator form of a role block, free when nothing can be captured."""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import AsyncGenerator, Callable, Generator
from typing import Any, TypeVar, overload

from ..core._scope import SCOPE
from ..records._manifest import failed_call
from ._block import Session, atimed_call, current, enter_role, leave_role, profile_step, timed_call, top_timeline
from ._owner import OWNER
from ._timeline import clock as _clock

F = TypeVar("F", bound=Callable[..., Any])


@overload
def profiled(fn: F, /) -> F: ...


@overload
def profiled(*, role: str | None = None) -> Callable[[F], F]: ...


def profiled(fn: Any = None, /, *, role: str | None = None) -> Any:
    """Run the decorated callable inside a role block (``role`` defaults to its qualified name).

    Works with and without parentheses on functions, methods, classmethods, staticmethods,
    coroutine functions, generators, async generators and other callables (builtins,
    ``functools.partial``, ``operator.itemgetter``); keeps the signature. A class is refused
    (``TypeError``): decorate its methods. When this call
    cannot capture, range or start an engine — no block of the process is inside an
    in-window step, the rank is not selected, or the role is filtered out — it goes
    straight to the function (the check is one C-level call) and the role is not set in
    ``current()``. A plain function or method stays a Python function with the same
    parameters (``obj.method()`` binds it as usual; a method bound early checks at each call).

    On a Ray actor registered in a worker group (``profctx.ray.group``), the call knows the
    step its driver is in; nothing is added to the call itself (``docs/distributed.md``).
    """
    if fn is None:
        return functools.partial(_decorate, role=role)
    if isinstance(fn, str):
        raise TypeError("profiled takes the role as a keyword: @profiled(role=...)")
    return _decorate(fn, role=role)


def _decorate(fn: Any, *, role: str | None) -> Any:
    target = fn.__func__ if isinstance(fn, (classmethod, staticmethod)) else fn
    if isinstance(target, type):
        raise TypeError(f"profiled: {target.__qualname__} is a class; @profiled on it would time only the "
                        "construction of its instances: decorate the methods to profile instead (e.g. "
                        "@profiled(role=...) on its __call__ or update method)")
    if not callable(target):
        raise TypeError(f"profiled: {fn!r} is not callable; decorate a function, method or other callable")
    if role is not None and (not isinstance(role, str) or not role.strip("/")):
        raise TypeError(f"profiled: role {role!r} is not valid; give a non-empty string such as 'rollout'")
    name = role or _name_of(target)
    import inspect  # here, not at import profctx (it costs several ms)

    switch = OWNER.switch(name)
    if inspect.isasyncgenfunction(target):
        wrapper = _async_generator_wrapper(name)
    elif inspect.iscoroutinefunction(target):
        wrapper = _coroutine_wrapper(name, switch)
    elif inspect.isgeneratorfunction(target):
        wrapper = _generator_wrapper(name)
    else:
        wrapper = _function_wrapper(name, switch)
    with contextlib.suppress(AttributeError, TypeError):  # builtins and C callables take no attributes
        # Survives cloudpickle's by-value copy of the function (which drops this wrapper): a
        # worker can then tell the user which methods arrived undecorated (profctx.ray).
        target.__profctx_role__ = name  # type: ignore[union-attr]
    plain = _plain_function(fn)
    if plain is not None:
        made = _generated(plain, switch, wrapper)
        if made is not None:
            return made if plain is fn else type(fn)(made)
    from . import _wrappers  # wrapt (with asyncio and ssl): at the first @profiled, not at import profctx

    get = getattr(type(fn), "__get__", None)
    extra = _by_value(fn, role) if isinstance(fn, types.FunctionType) else {}
    cls = _wrappers.ProfiledFunction if get is None else _wrappers.method_class(fn, switch, get, extra)
    profiled_fn = cls(fn, wrapper, enabled=switch.__len__)  # type: ignore[arg-type]
    profiled_fn._self_profctx_role = role
    profiled_fn._self_profctx_rebuild = _rebuild
    return profiled_fn


def _plain_function(fn: Any) -> types.FunctionType | None:
    """The Python function or coroutine function (not a generator function) ``fn`` is or holds."""
    inner = fn.__func__ if isinstance(fn, (classmethod, staticmethod)) else fn
    if type(inner) is not types.FunctionType or inner.__code__.co_flags & _GENERATORS:
        return None
    return inner


#: Code flags of generator, iterable coroutine and async generator functions (``inspect.CO_*``).
_GENERATORS = 0x20 | 0x100 | 0x200
_COROUTINE = 0x80
_VARARGS, _VARKEYWORDS = 0x04, 0x08
#: The file name of generated wrappers' code: how a worker tells a decorated method from a bare copy.
GENERATED_FILE = "<profctx @profiled>"


def is_proxy(fn: object) -> bool:
    """Return whether ``fn`` is a wrapt proxy ``@profiled`` returned (``_wrappers.ProfiledFunction``).

    Asks the type, not the proxy (which answers for the function it wraps), and imports nothing:
    before the first such proxy wrapt is not loaded, and nothing is one.
    """
    return getattr(type(fn), "_profctx_proxy", False) is True


_NAMES = ("_profctx_switch", "_profctx_fn", "_profctx_on", "_profctx_timed")
#: Wrapper factories by signature shape (the code is shared by functions of the same shape).
_FACTORIES: dict[tuple[Any, ...], Callable[..., Any]] = {}


def _generated(fn: types.FunctionType, switch: list[bool], on: Callable[..., Any]) -> Any:
    """Return a function with ``fn``'s exact parameters that calls ``fn``, or ``on`` while ``switch`` is on.

    For a coroutine function, a coroutine function that awaits either.

    A real Python function, not a proxy: ``obj.method()`` binds it like any method (no
    Python-level ``__get__``), its off path is one extra frame, and it pickles by reference,
    or by value with its closure (the function and the role's switch, which unpickles as the
    receiving process's switch). Returns ``None`` where a parameter name is one of the
    wrapper's own (then a wrapt proxy is used).
    """
    code = fn.__code__
    count = code.co_argcount + code.co_kwonlyargcount
    star = code.co_varnames[count] if code.co_flags & _VARARGS else None
    dstar = code.co_varnames[count + (star is not None)] if code.co_flags & _VARKEYWORDS else None
    key = (code.co_varnames[:count], code.co_posonlyargcount, code.co_argcount, star, dstar,
           bool(code.co_flags & _COROUTINE))
    factory = _FACTORIES.get(key)
    if factory is None:
        if set(_NAMES) & {*code.co_varnames[:count], star, dstar}:
            return None
        factory = _FACTORIES[key] = _factory(*key)
    made = factory(switch, fn, on, OWNER.timed)
    functools.update_wrapper(made, fn)
    # No ``__wrapped__``: Ray reads ``@ray.method`` options (num_returns, max_task_retries,
    # concurrency_group...) from the end of the ``__wrapped__`` chain (``inspect.unwrap``), so a
    # link to ``fn`` would hide the options set on this wrapper. The signature needs no link:
    # this function has ``fn``'s parameters, defaults and annotations.
    del made.__wrapped__
    made.__defaults__ = fn.__defaults__
    made.__kwdefaults__ = fn.__kwdefaults__
    return made


def _factory(names: tuple[str, ...], posonly: int, positional: int, star: str | None,
             dstar: str | None, coroutine: bool) -> Callable[..., Any]:
    params = list(names[:positional])
    if posonly:
        params.insert(posonly, "/")
    keywords = names[positional:]
    if star is not None:
        params.append("*" + star)
    elif keywords:
        params.append("*")
    params.extend(keywords)
    if dstar is not None:
        params.append("**" + dstar)
    args = ", ".join([*names[:positional], *(["*" + star] if star else [])])
    kwargs = ", ".join([*(f"{k!r}: {k}" for k in keywords), *(["**" + dstar] if dstar else [])])
    forward = ", ".join([*names[:positional], *(["*" + star] if star else []),
                         *(f"{k}={k}" for k in keywords), *(["**" + dstar] if dstar else [])])
    run, wait = ("async ", "await ") if coroutine else ("", "")
    source = (f"def factory(_profctx_switch, _profctx_fn, _profctx_on, _profctx_timed):\n"
              f"    {run}def call({', '.join(params)}):\n"
              f"        if _profctx_switch or _profctx_timed:\n"
              f"            return {wait}_profctx_on(_profctx_fn, None, ({args}{',' if args else ''}), {{{kwargs}}})\n"
              f"        return {wait}_profctx_fn({forward})\n"
              f"    return call\n")
    namespace: dict[str, Any] = {}
    exec(compile(source, GENERATED_FILE, "exec"), {"__builtins__": {}}, namespace)
    return namespace["factory"]  # type: ignore[no-any-return]


def _by_value(fn: types.FunctionType, role: str | None) -> dict[str, Any]:
    """Return properties that make a by-value copy of the wrapper call profctx again.

    cloudpickle copies a function it cannot import by name (a method of a class made remote
    with ``@ray.remote``, or defined in ``__main__``) from its ``__code__``, ``__globals__``,
    ``__closure__`` and defaults, and a wrapt wrapper hands out the wrapped function's (so the
    copy would be the bare function: cloudpipe/cloudpickle#464). The wrapper shows, for these
    five attributes only, those of a trampoline of the same kind (plain, coroutine, generator,
    async generator) that decorates ``fn`` again where it is called; name, qualified name,
    module, docstring, annotations and ``inspect.signature`` stay the user's.
    """
    trampoline = _trampoline(fn, role)

    def shown(name: str) -> property:
        return property(lambda self: getattr(trampoline, name))

    return {name: shown(name) for name in ("__code__", "__globals__", "__closure__", "__defaults__", "__kwdefaults__")}


#: The trampolines' function names, and the end of the path of the file they are defined in (how a
#: worker tells them from bare copies; the copy keeps the path of the process that pickled it).
TRAMPOLINES = frozenset({"agen", "coro", "gen", "call"})
TRAMPOLINE_FILE = "profctx/process/_decorate.py"


def _trampoline(fn: Any, role: str | None) -> Callable[..., Any]:
    import inspect

    made: list[Any] = []  # this copy's wrapper, built at its first call (in the process it was copied to)

    if inspect.isasyncgenfunction(fn):
        async def agen(*args: Any, **kwargs: Any) -> Any:
            if not made:
                made.append(_decorate(fn, role=role))
            async for item in made[0](*args, **kwargs):
                yield item

        return agen
    if inspect.iscoroutinefunction(fn):
        async def coro(*args: Any, **kwargs: Any) -> Any:
            if not made:
                made.append(_decorate(fn, role=role))
            return await made[0](*args, **kwargs)

        return coro
    if inspect.isgeneratorfunction(fn):
        def gen(*args: Any, **kwargs: Any) -> Any:
            if not made:
                made.append(_decorate(fn, role=role))
            return (yield from made[0](*args, **kwargs))

        return gen

    def call(*args: Any, **kwargs: Any) -> Any:
        if not made:
            made.append(_decorate(fn, role=role))
        return made[0](*args, **kwargs)

    return call


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
    """The wrapper types, from :mod:`profctx.process._wrappers` (imported on first use: it imports wrapt)."""
    if name in ("ProfiledFunction", "ProfiledBoundFunction"):
        from . import _wrappers

        return getattr(_wrappers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _rebuild(fn: Any, role: str | None) -> Any:
    """Unpickle a :class:`ProfiledFunction`: decorate ``fn`` again in this process."""
    return _decorate(fn, role=role)


def idle() -> bool:
    """Return whether no block of this process is inside an in-window step."""
    return not OWNER.gate


def _raised(exc: Exception) -> None:
    """Record that a ``@profiled`` call raised, in a worker inside its driver's in-window step.

    The worker knows what the driver cannot: the role it was in, its group and rank, and the
    error itself (not Ray's wrapped, coloured copy). Never raises.
    """
    runtime = OWNER.runtime
    if OWNER.held is None or runtime is None:
        return
    try:
        scope = current()
        if scope.step is None or scope.step not in runtime.window:
            return
        text = str(exc).strip().splitlines()
        runtime.record(failed_call(scope.step, scope.path, f"{type(exc).__name__}: {text[0] if text else ''}",
                                   f"the call {scope.path} raised"))
    except Exception:  # noqa: BLE001 - recording a failure must not add one
        pass


def _function_wrapper(role: str, switch: list[bool]) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not switch:  # only the timeline wants this call: a step is under way, nothing to capture
            return timed_call(role, wrapped, args, kwargs)
        # No idle() test here: the switch that led here is on only while the gate is open, and a
        # call that races the last block out finds the step out of the window in enter_role's plan
        # answer and goes through profile_step's fast path.
        timeline = top_timeline()  # before the role joins the scope (no SCOPE here: the wrapper pickles by value)
        token = enter_role(role)
        if token is not None:  # the role only joins the scope
            start = _clock() if timeline is not None else 0.0
            try:
                return wrapped(*args, **kwargs)
            except Exception as exc:
                _raised(exc)
                raise
            finally:
                leave_role(token)
                if timeline is not None:
                    timeline.role(role, start, _clock())
        with profile_step(role=role):
            try:
                return wrapped(*args, **kwargs)
            except Exception as exc:
                _raised(exc)
                raise

    return wrapper


def _coroutine_wrapper(role: str, switch: list[bool]) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not switch:  # only the timeline wants this call (see _function_wrapper)
            return atimed_call(role, wrapped, args, kwargs)
        if idle():
            return wrapped(*args, **kwargs)

        async def run() -> Any:
            timeline = top_timeline()
            token = enter_role(role)
            if token is not None:  # the role only joins the scope
                start = _clock() if timeline is not None else 0.0
                try:
                    return await wrapped(*args, **kwargs)
                except Exception as exc:
                    _raised(exc)
                    raise
                finally:
                    leave_role(token)
                    if timeline is not None:
                        timeline.role(role, start, _clock())
            async with profile_step(role=role):
                try:
                    return await wrapped(*args, **kwargs)
                except Exception as exc:
                    _raised(exc)
                    raise

        return run()

    return wrapper


def _session(role: str) -> Session | None:
    """The session of a generator call, or ``None`` when it runs unprofiled."""
    return None if idle() else Session(SCOPE.get(), None, role, {})


def _generator_wrapper(role: str) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        session = _session(role)
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
        session = _session(role)
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
