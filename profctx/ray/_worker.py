"""The worker side of a worker group: what the driver's control calls run in each actor process.

The driver runs these through Ray's ``ActorHandle.__ray_call__`` (a DeveloperAPI: it runs a
callable on an actor instance without changing its class), so no user method is wrapped,
renamed or given an extra argument. Each function takes the actor instance first, as
``__ray_call__`` passes it, and never raises: a failure is logged once and reported back.

Thread: the native profiler records CPU operators of the thread that started it and must
stop on that thread. Ray runs every call of a plain (sync) actor on the process's main
thread, so there the held step starts and stops on the thread the user's methods run on.
Async and threaded actors run ``__ray_call__`` on pool threads; there the step is held on
one profctx control thread, so it always stops where it started.
"""

from __future__ import annotations

import inspect
import os
import socket
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from .. import _api, _lifecycle
from .._block import Held, hold
from .._config import ProfilerConfig
from .._errors import ConfigError
from .._log import logger, warn_once
from .._owner import OWNER

R = TypeVar("R")

#: Seconds a control call waits for the control thread (a capture's start or stop).
CONTROL_TIMEOUT = 600.0


def _on_control_thread(fn: Callable[[], R]) -> R:
    """Run ``fn`` here on the main thread, else on the process's one profctx control thread."""
    if threading.current_thread() is threading.main_thread():
        return fn()
    control = OWNER.control
    if control is None:
        control = OWNER.control = ThreadPoolExecutor(1, thread_name_prefix="profctx-control")
    result: R = control.submit(fn).result(CONTROL_TIMEOUT)
    return result


def join(actor: Any, spec: Mapping[str, Any]) -> dict[str, Any]:
    """Make this process a member of a worker group: its identity, and the driver's config unless it has its own.

    ``spec``: ``group``, ``rank``, ``world_size`` and ``config`` (the driver's, as carried:
    ``None`` when the driver is not configured). The first (group, rank) this process is given
    stays its identity; a later one is logged once. Returns where the member runs and the
    ``@profiled`` methods of its class that arrived without their wrapper.
    """
    group, rank, world = spec["group"], spec["rank"], spec["world_size"]
    carried = OWNER.carried
    own = OWNER.config is not None and (carried is None or carried[3] is not OWNER.config)
    if carried is not None:
        _, had_rank, had_world, _ = carried
        had_group = carried[3].group if carried[3] is not None else None
        if (group, rank, world) != (had_group, had_rank, had_world) and had_group is not None:
            warn_once(f"group-identity:{group}:{rank}",
                      "profctx: this process is %s rank %s of %s; a driver named it %s rank %s of %s (kept the first)",
                      had_group, had_rank, had_world, group, rank, world)
            group, rank, world = had_group, had_rank, had_world
    error = None
    if not own and spec.get("config") is not None:
        data = dict(spec["config"])
        data.update(rank=rank, world_size=world, group=group)
        same = carried is not None and carried[0] == spec["config"] and carried[3] is OWNER.config
        if not same:
            try:
                config = _api.configure(ProfilerConfig.from_mapping(data))
                OWNER.carried = (spec["config"], rank, world, config) if config is not None else None
            except ConfigError as exc:
                error = str(exc)
                logger.error("profctx: the driver's configuration cannot be used in this worker: %s", exc)
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "main": threading.current_thread() is threading.main_thread(),
        "own_config": own,
        "undecorated": _undecorated(type(actor)),
        "error": error,
    }


def _undecorated(cls: type) -> list[str]:
    """Return the methods of ``cls`` that ``@profiled`` decorated but arrive here as plain functions.

    cloudpickle copies a class defined in the driver's ``__main__`` by value and drops the
    wrapper (it sees the function the wrapper proxies); the role it had survives as an attribute.
    A decorator applied over ``@profiled`` with ``functools.wraps`` (verl's ``@register``) copies
    that attribute too, onto a function that calls the wrapper: such a method is decorated,
    found by following ``__wrapped__`` down to the wrapper.
    """
    from .._decorate import ProfiledFunction

    def profiled(fn: Any) -> bool:
        return isinstance(fn, ProfiledFunction)

    seen: dict[str, Any] = {}
    for klass in cls.__mro__:  # the raw class attributes: looking them up would bind the wrappers
        for name, value in vars(klass).items():
            seen.setdefault(name, value)
    found = []
    for name, value in seen.items():
        inner = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
        if getattr(inner, "__profctx_role__", None) is None or profiled(inner):
            continue
        try:
            innermost = inspect.unwrap(inner, stop=profiled)
        except ValueError:  # a __wrapped__ cycle: nothing to follow
            innermost = inner
        if not profiled(innermost):
            found.append(name)
    return sorted(found)


def step_enter(actor: Any, step: int) -> bool:
    """Hold ``step`` for this process (the driver entered it); return whether profctx is configured here."""
    if OWNER.runtime is None:
        return False

    def enter() -> bool:
        try:
            hold(step)
        except Exception as exc:  # noqa: BLE001 - never break the worker for profiling
            warn_once(f"hold:{type(exc).__name__}", "profctx: cannot enter step %s in this worker: %s", step, exc)
            return False
        return True

    return _on_control_thread(enter)


def step_exit(actor: Any, step: int) -> bool:
    """Release the step :func:`step_enter` held (the driver left it); return whether one was held."""
    held: Held | None = OWNER.held
    if held is None or held.scope.step != step:
        return False

    def leave() -> bool:
        try:
            held.release()
        except Exception as exc:  # noqa: BLE001
            warn_once(f"release:{type(exc).__name__}", "profctx: cannot leave step %s in this worker: %s", step, exc)
            return False
        return True

    return _on_control_thread(leave)


def flush(actor: Any, timeout: float | None) -> bool:
    """Leave any held step, stop any open capture and write everything; return whether all was written."""
    held: Held | None = OWNER.held
    if held is not None:
        _on_control_thread(lambda: held.release(in_flight=True))
    runtime = OWNER.runtime
    if runtime is None:
        return True
    _lifecycle.finalize(timeout)
    return runtime.flush(0)
