"""The process as engine adapters see it: handed to ``profctx.engines`` (which never imports the process layer)."""

from __future__ import annotations

from typing import Any, final

from ..core._config import ProfilerConfig
from ..core._scope import Scope
from ..engines import _host
from ._block import current
from ._owner import OWNER


@final
class EngineView:
    """The owner's configuration, runtime and role hooks, and the ambient scope (``engines._host.Process``)."""

    __slots__ = ()

    @property
    def config(self) -> ProfilerConfig | None:
        return OWNER.config

    def host(self) -> _host.Host | None:
        return OWNER.runtime

    def scope(self) -> Scope:
        return current()

    def add_hook(self, hook: Any) -> None:
        OWNER.add_hook(hook)

    def remove_hook(self, hook: Any) -> None:
        OWNER.remove_hook(hook)


_host.serve(EngineView())
