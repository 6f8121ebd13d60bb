"""Propagation: carry the ambient scope (and the config) into other processes, threads and actors.

A snapshot is a small JSON-safe dict ``{"v": VERSION, "scope": {...}, "config": {...}|None,
"rank": int|None, "world_size": int|None}``. ``inject`` writes it into a carrier (a dict, the
environment, HTTP headers), ``extract`` reads it back, ``adopt`` makes it ambient. A process
with no configuration of its own configures itself from the one carried along.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import os
from collections.abc import Callable, Mapping, MutableMapping
from contextvars import Token
from types import TracebackType
from typing import Any, Final, Literal, TypeVar, final, get_args

from ..core._config import ProfilerConfig
from ..core._scope import SCOPE, Scope
from ..core._vocab import assert_never
from ..util._errors import ConfigError
from ..util._log import first, logger, warn_once
from . import _api
from ._block import profile_step
from ._owner import OWNER

R = TypeVar("R")

#: Version of the snapshot format. A receiver refuses other versions (the call runs unprofiled).
VERSION: Final = 1
#: The key of a snapshot in a dict carrier.
CARRIER_KEY: Final = "__profctx__"
#: The environment variable carrying a snapshot into a spawned process (JSON).
ENV_VAR: Final = "PROFCTX_CONTEXT"
#: The HTTP header carrying a snapshot (URL-safe base64 of the JSON, so any header stack passes it).
HEADER: Final = "profctx-context"

Carrier = Literal["dict", "env", "headers"]
CARRIERS: Final[tuple[Carrier, ...]] = get_args(Carrier)

# -- snapshots --------------------------------------------------------------------------------


def snapshot(*, rank: int | None = None, world_size: int | None = None, config: bool = True) -> dict[str, Any]:
    """Return the ambient scope (and, with ``config``, the active configuration) as a JSON-safe dict.

    ``rank`` / ``world_size``: the receiver's place in the job, when the sender knows it
    (e.g. its position in an actor group); ``None`` lets the receiver detect its own. The
    carried config names this run's id, so every process of a run files under one id.
    """
    cfg = OWNER.config if config else None
    return {
        "v": VERSION,
        "scope": SCOPE.get().to_dict(),
        "config": None if cfg is None else _config_dict(cfg),
        "rank": rank,
        "world_size": world_size,
    }


def _config_dict(config: ProfilerConfig) -> dict[str, Any]:
    # Cached for the current config object (frozen, sent with every carried call). The
    # receiver's rank and world size are its own, never the sender's.
    runtime = OWNER.runtime
    run_id = runtime.run_id if runtime is not None and runtime.config is config else config.run_id
    cached = OWNER.carry_cache
    if cached is not None and cached[0] is config and cached[1] == run_id:
        return cached[2]
    data = config.to_dict()
    data["rank"] = None
    data["world_size"] = None
    data["run_id"] = run_id
    data["steps"] = _compact_steps(data["steps"])
    OWNER.carry_cache = (config, run_id, data)
    return data


def _compact_steps(steps: list[int] | None) -> list[int] | str | None:
    """Return an evenly spaced step list as ``"start:stop:stride"`` (a long window costs every call)."""
    if not steps or len(steps) < 3:
        return steps
    stride = steps[1] - steps[0]
    if stride <= 0 or any(b - a != stride for a, b in itertools.pairwise(steps)):
        return steps
    return f"{steps[0]}:{steps[-1] + 1}:{stride}"


def _check(data: object) -> dict[str, Any] | None:
    """Return ``data`` if it is a snapshot of this version; log an error once and return ``None`` if not."""
    if not isinstance(data, Mapping):
        _refuse(f"a snapshot must be a mapping, got {type(data).__name__}")
        return None
    version = data.get("v")
    if version != VERSION:
        _refuse(f"snapshot version {version!r} is not supported (this profctx reads version {VERSION}); "
                "upgrade profctx to the same version on every process")
        return None
    if not isinstance(data.get("scope"), Mapping):
        _refuse("the snapshot has no 'scope' mapping")
        return None
    return dict(data)


def _refuse(message: str) -> None:
    if not first(f"refused-snapshot:{message}"):
        return
    logger.error("profctx: cannot adopt the carried scope: %s; this call runs unprofiled", message)


def receive(data: object) -> Scope | None:
    """Check a carried snapshot, configure this process from it if needed, return its scope.

    Returns ``None`` (after logging once) for an unreadable or incompatible snapshot: the
    caller then runs unprofiled. Never raises.
    """
    snap = _check(data)
    if snap is None:
        return None
    try:
        scope = Scope.from_dict(snap["scope"])
        _configure_from(snap)
    except (ConfigError, ValueError, TypeError) as exc:
        _refuse(f"{type(exc).__name__}: {exc}")
        return None
    return scope


def _configure_from(snap: Mapping[str, Any]) -> None:
    """Configure this process from the carried config unless it has a configuration of its own.

    The first carried rank (and world size) this process receives is its identity from then on:
    one actor process is one rank, even if callers later name another (logged once).
    """
    carried = snap.get("config")
    if carried is None:
        return
    rank, world_size = snap.get("rank"), snap.get("world_size")
    previous = OWNER.carried
    current = OWNER.config
    if current is not None and (previous is None or current is not previous[3]):
        return  # configured by this process itself: its own config wins
    if previous is not None and current is previous[3]:
        _, had_rank, had_world, _ = previous
        if had_rank is not None:
            if rank is not None and (rank, world_size) != (had_rank, had_world):
                warn_once(f"carried-rank:{rank}:{world_size}",
                          "profctx: this process is rank %s of %s; a call named it rank %s of %s (kept %s)",
                          had_rank, had_world, rank, world_size, had_rank)
            rank, world_size = had_rank, had_world
        if previous[0] == carried and (rank, world_size) == (had_rank, had_world):
            return  # same carried config as last time: nothing to do
    data = dict(carried)
    data["rank"] = rank
    data["world_size"] = world_size
    config = _adopt_config(ProfilerConfig.from_mapping(data), replacing=previous is not None)
    OWNER.carried = (carried, rank, world_size, config) if config is not None else None


def _adopt_config(config: ProfilerConfig, *, replacing: bool) -> ProfilerConfig | None:
    """Configure this process from a carried ``config`` (it had none of its own); say so once per run.

    Adopting stays implicit for the caller (a worker's first carried call configures it), so
    it is logged: once per run id and rank, at INFO, and again, at WARNING, whenever a later
    carried config replaces the one adopted before.
    """
    adopted = _api.configure(config)
    if adopted is not None:
        what = "replaced the config adopted before by" if replacing else "configured this process from"
        if first(f"adopted-config:{adopted.run_id}:{adopted.rank}:{replacing}"):
            (logger.warning if replacing else logger.info)(
                "profctx: %s the config carried in by a snapshot (run %s, rank %s)", what,
                adopted.run_id, "detected" if adopted.rank is None else adopted.rank)
    return adopted


# -- carriers ---------------------------------------------------------------------------------


def inject(
    carrier: MutableMapping[str, Any],
    kind: Carrier | None = None,
    *,
    rank: int | None = None,
    world_size: int | None = None,
) -> MutableMapping[str, Any]:
    """Write the ambient scope and config into ``carrier``; return the carrier.

    ``kind``: ``"dict"`` (the snapshot dict under the reserved key ``__profctx__``, e.g. call
    keywords), ``"env"`` (JSON in ``PROFCTX_CONTEXT``, for a process about to be spawned) or
    ``"headers"`` (``profctx-context``, base64 JSON). Default: ``"env"`` for ``os.environ``,
    else ``"dict"``. ``rank`` / ``world_size`` set the receiver's identity when known.
    """
    import json  # json and base64: imported by the first carrier that needs them, not by import profctx

    data = snapshot(rank=rank, world_size=world_size)
    kind = _kind(carrier, kind)
    if kind == "dict":
        carrier[CARRIER_KEY] = data
    elif kind == "env":
        carrier[ENV_VAR] = json.dumps(data, separators=(",", ":"), default=str)
    elif kind == "headers":
        import base64

        raw = json.dumps(data, separators=(",", ":"), default=str).encode()
        carrier[HEADER] = base64.urlsafe_b64encode(raw).decode("ascii")
    else:
        assert_never(kind)
    return carrier


def extract(carrier: Mapping[str, Any], kind: Carrier | None = None) -> dict[str, Any] | None:
    """Return the snapshot found in ``carrier`` (see :func:`inject`), or ``None`` if there is none.

    A snapshot that cannot be read or has another version is logged once as an error and
    gives ``None``: the caller proceeds unprofiled.
    """
    import json

    kind = _kind(carrier, kind)
    raw: Any
    if kind == "dict":
        raw = carrier.get(CARRIER_KEY)
        if raw is None:
            return None
    elif kind == "env":
        text = carrier.get(ENV_VAR)
        if not text:
            return None
        try:
            raw = json.loads(text)
        except (TypeError, ValueError) as exc:
            _refuse(f"{ENV_VAR} is not JSON ({exc})")
            return None
    elif kind == "headers":
        text = next((v for k, v in carrier.items() if str(k).lower() == HEADER), None)
        if not text:
            return None
        import base64
        import binascii

        try:
            raw = json.loads(base64.urlsafe_b64decode(str(text).encode("ascii")))
        except (ValueError, binascii.Error, UnicodeError) as exc:
            _refuse(f"header {HEADER} is not base64 JSON ({exc})")
            return None
    else:
        assert_never(kind)
    return _check(raw)


def _kind(carrier: object, kind: Carrier | None) -> Carrier:
    if kind is None:
        return "env" if carrier is os.environ else "dict"
    if kind not in CARRIERS:
        raise ValueError(f"kind: {kind!r} is not valid; one of {', '.join(map(repr, CARRIERS))}")
    return kind


@final
class adopt:  # noqa: N801 - used like a function: ``with adopt(snapshot):``
    """Make a carried snapshot's scope ambient for a block (sync ``with`` or ``async with``).

    The step, role path and tags become those of the sender; the block acts as a step block
    (``mode="step"`` opens a capture for it), and roles entered inside nest under the
    sender's role path. Without a configuration of its own, this process configures itself
    from the carried one first. ``None`` or an unusable snapshot gives a block that does
    nothing (an incompatible version is logged once).
    """

    __slots__ = ("_data", "_inner", "_token")

    def __init__(self, snapshot: Mapping[str, Any] | None) -> None:
        self._data = snapshot
        self._inner: profile_step | None = None
        self._token: Token[Scope] | None = None

    def _begin(self) -> profile_step | None:
        if self._data is None:
            return None
        scope = receive(self._data)
        if scope is None:
            return None
        self._token = SCOPE.set(Scope(None, scope.roles, scope.tags))
        self._inner = profile_step(scope.step)
        return self._inner

    def _end(self) -> None:
        token, self._token, self._inner = self._token, None, None
        if token is not None:
            SCOPE.reset(token)

    def __enter__(self) -> Scope:
        inner = self._begin()
        if inner is None:
            return SCOPE.get()
        try:
            return inner.__enter__()
        except BaseException:
            self._end()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        inner = self._inner
        try:
            if inner is not None:
                inner.__exit__(exc_type, exc, tb)
        finally:
            self._end()

    async def __aenter__(self) -> Scope:
        inner = self._begin()
        if inner is None:
            return SCOPE.get()
        try:
            return await inner.__aenter__()
        except BaseException:
            self._end()
            raise

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        inner = self._inner
        try:
            if inner is not None:
                await inner.__aexit__(exc_type, exc, tb)
        finally:
            self._end()


# -- threads ----------------------------------------------------------------------------------


def bind(fn: Callable[..., R]) -> Callable[..., R]:
    """Return ``fn`` bound to a copy of the caller's context, for thread pools and executors.

    ``ThreadPoolExecutor.submit`` and ``loop.run_in_executor`` run callables in the worker
    thread's own context, so the scope is lost there; ``pool.submit(bind(fn), x)`` keeps it.
    Each call of the result runs in a fresh copy, so it can be called concurrently.
    """
    context = contextvars.copy_context()

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> R:
        return context.copy().run(fn, *args, **kwargs)

    return run
