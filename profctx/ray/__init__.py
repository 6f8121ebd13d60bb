"""Ray integration, driver side: call groups of actors with the ambient scope, concurrently.

Any ``handle.method.remote(...)`` of a ``@profiled`` actor method already carries the caller's
scope and config (profctx sets Ray's ``__ray_invocation_decorator__`` on the method). This
module adds what a plain call cannot know: the worker's rank and world size (explicit, or its
position in a group), concurrent fan-out from sync and async code, failure records, and
flushing the workers' traces. Needs ``ray`` (``pip install 'profctx[ray]'``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import ray

from .. import _lifecycle
from .._owner import OWNER
from .._propagate import TARGET, install_ray_support
from .._scope import SCOPE

__all__ = ["as_rank", "fan_out", "fan_out_async", "flush", "flush_async", "submit"]

#: A target: a bound actor method (``handle.method``) or ``(handle, "method")``.
Target = Any

install_ray_support()


@contextlib.contextmanager
def as_rank(rank: int | None, world_size: int | None = None) -> Iterator[None]:
    """Make actor calls made in the block tell the worker it is ``rank`` of ``world_size``."""
    token = TARGET.set((rank, world_size))
    try:
        yield
    finally:
        TARGET.reset(token)


def _method(target: Target) -> Any:
    if isinstance(target, tuple):
        if len(target) != 2 or not isinstance(target[1], str):
            raise TypeError(f"target {target!r}: expected (actor handle, 'method name') or handle.method")
        return getattr(target[0], target[1])
    if not hasattr(target, "remote"):
        raise TypeError(f"target {target!r}: expected (actor handle, 'method name') or handle.method")
    return target


def _ranks(count: int, ranks: Sequence[int | None] | None) -> list[int | None]:
    if ranks is None:
        return list(range(count))
    if len(ranks) != count:
        raise ValueError(f"ranks: {list(ranks)!r} has {len(ranks)} entries for {count} targets; give one per target")
    return list(ranks)


def submit(
    targets: Sequence[Target],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    ranks: Sequence[int | None] | None = None,
    world_size: int | None = None,
) -> list[Any]:
    """Call one method on every target with the same arguments; return the object refs, in order.

    Each call carries the ambient scope, with rank = the target's position in ``targets``
    (or ``ranks[i]``; ``None`` lets the worker detect it) and world size ``world_size``
    (default: the number of targets). Does not wait.
    """
    methods = [_method(t) for t in targets]
    chosen = _ranks(len(methods), ranks)
    world = len(methods) if world_size is None else world_size
    call_kwargs = dict(kwargs or {})
    refs = []
    for method, rank in zip(methods, chosen, strict=True):
        token = TARGET.set((rank, world if rank is not None else world_size))
        try:
            refs.append(method.remote(*args, **call_kwargs))
        finally:
            TARGET.reset(token)
    return refs


def fan_out(
    targets: Sequence[Target],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    ranks: Sequence[int | None] | None = None,
    world_size: int | None = None,
    return_exceptions: bool = False,
    timeout: float | None = None,
) -> list[Any]:
    """Call one method on every target concurrently and wait for all; return the results in order.

    Every call runs to its end even if another fails, so every worker stops and writes its
    capture. Then, if any call failed, the first error is raised exactly as ``ray.get``
    raises it (``return_exceptions=True`` returns errors in the list instead); each failure
    is recorded in this process's manifest. Raise ``RuntimeError`` when called from inside
    a running event loop: use ``await fan_out_async(...)`` there. ``timeout`` (seconds)
    raises ``ray.exceptions.GetTimeoutError`` if the calls are not all done in time.
    """
    _refuse_inside_loop("fan_out", "fan_out_async")
    refs = submit(targets, args, kwargs, ranks=ranks, world_size=world_size)
    if not refs:
        return []
    _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    if pending:
        raise ray.exceptions.GetTimeoutError(f"fan_out: {len(pending)} of {len(refs)} calls not done in {timeout}s")
    results: list[Any] = []
    for ref in refs:
        try:
            results.append(ray.get(ref))
        except Exception as exc:  # noqa: BLE001 - collected, recorded, re-raised below
            results.append(exc)
    return _settle(targets, results, ranks, return_exceptions)


async def fan_out_async(
    targets: Sequence[Target],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    ranks: Sequence[int | None] | None = None,
    world_size: int | None = None,
    return_exceptions: bool = False,
    timeout: float | None = None,
) -> list[Any]:
    """The async twin of :func:`fan_out`: awaits the object refs with ``asyncio.gather``, never ``ray.get``.

    ``timeout`` raises ``TimeoutError`` (the calls themselves keep running).
    """
    refs = submit(targets, args, kwargs, ranks=ranks, world_size=world_size)
    gathered = asyncio.gather(*refs, return_exceptions=True)
    results = list(await (gathered if timeout is None else asyncio.wait_for(gathered, timeout)))
    return _settle(targets, results, ranks, return_exceptions)


def _settle(
    targets: Sequence[Target], results: list[Any], ranks: Sequence[int | None] | None, return_exceptions: bool
) -> list[Any]:
    failures = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]
    if not failures:
        return results
    chosen = _ranks(len(results), ranks)
    for index, error in failures:
        _record_failure(_describe(targets[index]), chosen[index], error)
    if return_exceptions:
        return results
    raise failures[0][1]


def _describe(target: Target) -> str:
    if isinstance(target, tuple):
        return str(target[1])
    return str(getattr(target, "_method_name", None) or target)


def _record_failure(method: str, rank: int | None, error: BaseException) -> None:
    """Record a failed actor call in this process's manifest (when it profiles)."""
    runtime = OWNER.runtime
    if runtime is None:
        return
    scope = SCOPE.get()
    if scope.step is None:
        return
    died = isinstance(error, ray.exceptions.RayActorError)
    reason = f"the actor running {method} died" if died else f"the actor call {method} raised"
    now = time.time()
    runtime.record({
        "capture": uuid.uuid4().hex[:12],
        "event": "finished",
        "kind": "remote",
        "status": "failed",
        "steps": [scope.step],
        "step": scope.step,
        "last_step": scope.step,
        "role": "/".join((*scope.roles, method)),
        "target_rank": rank,
        "rank": rank,
        "time": now,
        "start_time": now,
        "end_time": now,
        "files": [],
        "bytes": 0,
        "error": _first_line(error),
        "reason": reason,
    })


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def _refuse_inside_loop(name: str, twin: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(f"{name} blocks on ray.get and was called inside a running event loop; "
                       f"use 'await profctx.ray.{twin}(...)' there")


def _handles(actors: Sequence[Any]) -> list[Any]:
    return [a[0] if isinstance(a, tuple) else a for a in actors]


def _flush_actor(actor: Any, timeout: float | None) -> bool:
    """Run in an actor (via ``__ray_call__``): stop any open capture and write everything."""
    runtime = OWNER.runtime
    if runtime is None:
        return True
    _lifecycle.finalize(timeout)
    return runtime.flush(0)


def flush(actors: Sequence[Any], timeout: float | None = 60.0) -> list[bool]:
    """Make every actor stop its open capture and write its files; return, per actor, whether all finished.

    ``actors``: actor handles (or ``(handle, name)`` targets). Call before reading the
    manifest or shutting Ray down: workers write traces on a background thread. A dead
    actor gives ``False``.
    """
    _refuse_inside_loop("flush", "flush_async")
    refs = [h.__ray_call__.remote(_flush_actor, timeout) for h in _handles(actors)]
    out = []
    for ref in refs:
        try:
            out.append(bool(ray.get(ref)))
        except Exception:  # noqa: BLE001 - a dead actor has nothing left to write
            out.append(False)
    return out


async def flush_async(actors: Sequence[Any], timeout: float | None = 60.0) -> list[bool]:
    """The async twin of :func:`flush`."""
    refs = [h.__ray_call__.remote(_flush_actor, timeout) for h in _handles(actors)]
    results = await asyncio.gather(*refs, return_exceptions=True)
    return [r is True for r in results]
