"""Process-global state, all of it, in one place. ``reset()`` returns it to import-time values."""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ._capture import Capture
    from ._config import ProfilerConfig
    from ._runtime import Runtime
    from ._scope import Scope


class RoleHook(Protocol):
    """Called when a role block is entered and left inside an in-window step (engines use it).

    ``enter`` returns a handle passed back to ``exit``; ``None`` means "not for me".
    Exceptions are caught, logged once and recorded by the caller. Optional methods:
    ``shutdown()`` (stop what is open; called at exit and on SIGTERM) and ``reset()``
    (forget everything; called by ``profctx.reset()``).
    """

    def enter(self, scope: Scope) -> object: ...

    def exit(self, handle: object) -> None: ...

    async def aenter(self, scope: Scope) -> object: ...

    async def aexit(self, handle: object) -> None: ...


#: The configuration given to ``configure()`` (``None``: never configured or reset).
CONFIG: ProfilerConfig | None = None
#: The live runtime: ``None`` whenever nothing can be captured (unconfigured or disabled).
RUNTIME: Runtime | None = None
#: Non-empty while any block of this process is inside an in-window step. ``@profiled``
#: reads ``GATE.__len__`` (a C call) to skip all wrapper work when it is empty.
GATE: list[Any] = []
#: Role hooks (attached engines).
ROLE_HOOKS: list[RoleHook] = []
#: The capture whose ranges blocks in this context go to (set per block, per task).
LIVE: ContextVar[Capture | None] = ContextVar("profctx.live", default=None)
#: The configuration this process adopted from a carried snapshot: ``(carried config dict, rank,
#: world size, the config built from them)``. Only a ``CONFIG`` that *is* this config is replaced
#: by a later carrier.
CARRIED: tuple[Any, int | None, int | None, ProfilerConfig | None] | None = None
