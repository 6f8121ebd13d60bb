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

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ..core._ondemand import parse
from ..process import _api, _lifecycle
from ..process._block import Held, hold
from ..process._owner import OWNER
from ..records._manifest import failed_call
from ..util._errors import ConfigError
from ..util._log import logger, warn_once
from ..util._untrusted import open_regular

R = TypeVar("R")

#: Seconds a control call waits for the control thread (a capture's start or stop).
CONTROL_TIMEOUT = 600.0


def _on_control_thread(fn: Callable[[], R]) -> R:
    """Run ``fn`` here on the main thread, else on the process's one profctx control thread."""
    if threading.current_thread() is threading.main_thread():
        return fn()
    control = OWNER.control
    if control is None:
        from concurrent.futures import ThreadPoolExecutor  # async and threaded actors only: not at every join

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
    probe = spec.get("probe")
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
                config = _api.configure(data)  # checked once, by configure (a ProfilerConfig would be twice)
                OWNER.carried = (spec["config"], rank, world, config) if config is not None else None
            except ConfigError as exc:
                error = str(exc)
                logger.error("profctx: the driver's configuration cannot be used in this worker: %s", exc)
    runtime = OWNER.runtime
    save_path = str(runtime.save_path) if runtime is not None else None
    identity = runtime.identity() if runtime is not None else None
    # Files reach the driver by themselves when this process writes where the driver reads:
    # the same folder, on a file system both see (the driver's probe file is visible here).
    shared = save_path is not None and save_path == spec.get("save_path") and (
        probe is None or os.path.exists(probe))
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "main": threading.current_thread() is threading.main_thread(),
        "undecorated": _undecorated(type(actor)),
        "error": error,
        "save_path": save_path,
        "collect": save_path is not None and not shared,
        # What this process files as (its own configuration may say otherwise than the driver).
        "identity": None if identity is None else [identity.group, identity.rank],
        # Such a member acts in every step whatever the driver's selection says.
        "own": own,
        # Names the member in the driver's records when Ray reports its death by actor id.
        "actor_id": _actor_id(),
        "engines": bool(OWNER.hooks),
    }


def _actor_id() -> str | None:
    try:
        import ray

        found = ray.get_runtime_context().get_actor_id()
    except Exception:  # noqa: BLE001 - only a name for records
        return None
    return found if isinstance(found, str) else None


def _undecorated(cls: type) -> list[str]:
    """Return the methods of ``cls`` that ``@profiled`` decorated but arrive here as plain functions.

    cloudpickle copies a class defined in the driver's ``__main__`` by value and drops the
    wrapper (it sees the function the wrapper proxies); the role it had survives as an attribute.
    A decorator applied over ``@profiled`` with ``functools.wraps`` (verl's ``@register``) copies
    that attribute too, onto a function that calls the wrapper: such a method is decorated,
    found by following ``__wrapped__`` down to the wrapper.
    """
    seen: dict[str, Any] = {}
    for klass in cls.__mro__:  # the raw class attributes: looking them up would bind the wrappers
        for name, value in vars(klass).items():
            seen.setdefault(name, value)
    found = []
    for name, value in seen.items():
        inner = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
        if getattr(inner, "__profctx_role__", None) is not None and not _decorated(inner):
            found.append(name)
    return sorted(found)


def _decorated(fn: Any) -> bool:
    """Whether ``fn``, or a function it wraps (Ray wraps actor methods in its tracing shims), is profctx's."""
    from ..process._decorate import GENERATED_FILE, TRAMPOLINE_FILE, TRAMPOLINES, is_proxy

    for _ in range(8):
        if is_proxy(fn):
            return True
        code = getattr(fn, "__code__", None)
        if code is not None and code.co_filename == GENERATED_FILE:
            return True  # a plain function's wrapper (_decorate._generated), or its by-value copy
        if code is not None and code.co_name in TRAMPOLINES and code.co_filename.replace("\\", "/").endswith(
                TRAMPOLINE_FILE):
            return True  # a by-value copy that decorates itself again when called (_decorate._by_value)
        fn = getattr(fn, "__wrapped__", None)
        if fn is None:
            return False
    return False


def step_enter(actor: Any, step: int, request: Mapping[str, Any] | None = None,
               sent: tuple[float, float] | None = None) -> bool:
    """Hold ``step`` for this process (the driver entered it); return whether profctx is configured here.

    ``request``: the on-demand or anomaly request whose steps the driver captures now (see
    :mod:`profctx.process._ondemand`): this member captures them as the request says.
    ``sent``: (wall-clock time of the oldest control call the driver still waited on from this
    member when it sent this one, control timeout). Served more than the timeout after that, the
    call is a leftover of a time this process did not run (stopped, starved, partitioned): the
    driver has moved on, so the step is not held, and is recorded ``lost`` here instead.
    """
    runtime = OWNER.runtime
    if runtime is None:
        return False
    if sent is not None and time.time() - sent[0] > sent[1]:
        _missed(runtime, step, time.time() - sent[0], sent[1])
        return True
    if request is not None:
        _follow(runtime, request)

    def enter() -> bool:
        try:
            hold(step)
        except Exception as exc:  # noqa: BLE001 - never break the worker for profiling
            warn_once(f"hold:{type(exc).__name__}", "profctx: cannot enter step %s in this worker: %s", step, exc)
            return False
        return True

    return _on_control_thread(enter)


def _follow(runtime: Any, data: Mapping[str, Any]) -> None:
    """Add the steps of a request the driver accepted to this member's window (once per request)."""
    from ..process._ondemand import OnDemand  # on-demand machinery: loaded where a request arrives, not at join

    try:
        if runtime.ondemand is None:  # configured on its own, without on_demand: the driver's request still counts
            runtime.ondemand = OnDemand(runtime)
        runtime.ondemand.admit(parse(data), follow=True)
    except Exception as exc:  # noqa: BLE001 - never break the worker for profiling
        warn_once(f"follow:{type(exc).__name__}", "profctx: this worker cannot follow the driver's on-demand "
                  "request: %s", exc)


def _missed(runtime: Any, step: int, behind: float, timeout: float) -> None:
    """Record that this process did not run ``step``: the driver's call to enter it came ``behind`` seconds late."""
    identity = runtime.identity()
    who = f"{identity.group} rank {identity.rank}"
    warn_once("missed-steps", "profctx: %s served the driver's call to enter step %s %.1fs after it was due "
              "(control_timeout %gs): this process was not running; such steps are recorded lost, not captured",
              who, step, behind, timeout)
    try:
        runtime.record(failed_call(
            step, None, f"{who} did not run step {step}: its call to enter it was served {behind:.1f}s late",
            f"not running for longer than control_timeout ({timeout:g}s): stopped, starved or partitioned",
            lost=True))
    except Exception as exc:  # noqa: BLE001 - recording must not break the worker
        logger.debug("profctx: could not record a missed step: %s", exc)


def step_exit(actor: Any, step: int, collect: bool = False, sent: tuple[float, float] | None = None) -> bool:
    """Release the step :func:`step_enter` held (the driver left it); return whether one was held.

    ``collect``: the driver copies this worker's files next (no shared file system), so wait
    until the writer thread has written them. ``sent``: (wall-clock time the driver sent this
    call, control timeout): served later than the timeout, the capture is noted as covering
    time this process did not run.
    """
    held: Held | None = OWNER.held
    if held is None or held.scope.step != step:
        if collect and OWNER.runtime is not None:
            OWNER.runtime.flush(CONTROL_TIMEOUT)
        return False
    behind = 0.0 if sent is None else time.time() - sent[0]
    spec = getattr(held.target, "spec", None)
    if sent is not None and behind > sent[1] and spec is not None:
        spec.notes.append(f"left step {step} {behind:.1f}s after the driver did (control_timeout {sent[1]:g}s): "
                          "this process did not run for part of the capture (stopped, starved or partitioned)")

    def leave() -> bool:
        try:
            held.release()
        except Exception as exc:  # noqa: BLE001
            warn_once(f"release:{type(exc).__name__}", "profctx: cannot leave step %s in this worker: %s", step, exc)
            return False
        return True

    left = _on_control_thread(leave)
    if collect and OWNER.runtime is not None:
        OWNER.runtime.flush(CONTROL_TIMEOUT)
    return left


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


# -- files for a driver that does not share this worker's file system ---------------------------


def listing(actor: Any) -> list[tuple[str, int]]:
    """Return ``(path relative to save_path, size)`` of this worker's finished traces, timeline, shard and index.

    Traces first, then the step timeline, then the shard, then its listing index (``profctx ls``
    reads it to skip parsing the shard): a driver copying in this order never shows a record whose
    files are not there yet.
    """
    from ..records._listing import index_path  # a collected member's copies only: not at every join

    runtime = OWNER.runtime
    writer = runtime.manifest_writer() if runtime is not None else None
    if runtime is None or writer is None or not writer.path.is_file():
        return []
    root = runtime.save_path
    files: dict[str, int] = {}
    with open_regular(writer.path, root) as shard:
        for line in shard:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            for entry in record.get("files") or ():
                path = root / str(entry.get("path", ""))
                if record.get("event") == "finished" and path.is_file():
                    files[str(entry["path"])] = path.stat().st_size
    out = sorted(files.items())
    timeline = runtime.timeline.path if runtime.timeline is not None else None
    if timeline is not None and os.path.isfile(timeline):
        # Appended to, a whole line per step: a copy of its first bytes is a timeline of the steps so far.
        out.append((os.path.relpath(timeline, root), os.path.getsize(timeline)))
    index = index_path(writer.path)
    # The index's size is taken before the shard's: it never describes shard bytes the copy lacks.
    indexed = index.stat().st_size if index.is_file() else None
    out.append((str(writer.path.relative_to(root)), writer.path.stat().st_size))
    if indexed is not None:
        out.append((str(index.relative_to(root)), indexed))
    return out


def read_chunk(actor: Any, relative: str, offset: int, size: int) -> bytes:
    """Return up to ``size`` bytes of ``relative`` (under this worker's save_path) from ``offset``."""
    runtime = OWNER.runtime
    if runtime is None:
        return b""
    root = runtime.save_path.resolve()
    path = (root / relative).resolve()
    if root not in path.parents:
        raise ValueError(f"{relative!r} is not under this worker's save_path")
    with open_regular(path, root) as file:  # a regular file of one name, never a link
        file.seek(offset)
        return file.read(size)
