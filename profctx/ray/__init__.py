"""Ray integration, driver side: worker groups whose step boundaries the driver drives.

Register the actors of each role as a named group; from then on, every in-window step the
driver enters (``with profctx.profile_step(step):``) is entered by every worker too, and left
with it, through Ray's ``ActorHandle.__ray_call__`` (no user method is wrapped, and nothing is
added to the user's calls). A worker thus has one capture per step in step mode, covering
every call it serves in that step, and its ``@profiled`` methods know the step in role mode.
Out of the window no control call is made. Needs ``ray`` (``pip install 'profctx[ray]'``).

The names live in :mod:`profctx.ray._driver`, loaded at the first use of one: every member's
join imports this package (Ray loads :mod:`profctx.ray._worker` by reference), and a member
needs none of the driver's code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import ray  # noqa: F401 - fail at import without Ray, as the driver's code would (free in an actor: Ray is loaded)

if TYPE_CHECKING:
    from ._driver import CHUNK as CHUNK
    from ._driver import CONTROL_TIMEOUT as CONTROL_TIMEOUT
    from ._driver import RELEASE_TIMEOUT as RELEASE_TIMEOUT
    from ._driver import Driver as Driver
    from ._driver import Member as Member
    from ._driver import Target as Target
    from ._driver import WorkerGroup as WorkerGroup
    from ._driver import collect as collect
    from ._driver import fan_out as fan_out
    from ._driver import fan_out_async as fan_out_async
    from ._driver import flush as flush
    from ._driver import flush_async as flush_async
    from ._driver import group as group
    from ._driver import group_async as group_async
    from ._driver import groups as groups
    from ._driver import submit as submit

__all__ = ["WorkerGroup", "fan_out", "fan_out_async", "flush", "flush_async", "group", "group_async", "groups",
           "submit"]


def __getattr__(name: str) -> Any:
    """Return the driver-side name ``name`` (:mod:`profctx.ray._driver`, imported on first use)."""
    if name.startswith("__"):
        raise AttributeError(name)
    driver = importlib.import_module(f"{__name__}._driver")  # not ``from . import``: that would ask here again
    loaded = globals().get(name)  # a submodule the import just loaded (``_driver``, ``_control``, ``_worker``)
    if loaded is not None:
        return loaded
    try:
        return getattr(driver, name)
    except AttributeError:
        raise AttributeError(f"module 'profctx.ray' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "CHUNK", "CONTROL_TIMEOUT", "RELEASE_TIMEOUT"})
