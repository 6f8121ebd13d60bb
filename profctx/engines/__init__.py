"""Engine adapters: start and stop vLLM and SGLang profilers from the ambient role scope.

``attach(adapter, ...)`` once; every block entering a role that matches ``engines.roles``
inside an in-window step then starts the attached engines concurrently, and leaving it
stops them. See ``docs/engines.md``.

The names load on first use (they pull asyncio and HTTP): ``import profctx`` loads this
package only for ``_host``, the light module through which the process layer serves engines.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._attach import EngineHook, attach, attached, detach, stop_all
    from ._base import AlreadyActive, EngineAdapter, EngineError, EngineRequest, Outcome, plan
    from .sglang import SGLangEngineAdapter, SGLangHttpAdapter, SGLangTokenizerAdapter
    from .vllm import LaunchSettings, VLLMAdapter, VLLMAsyncAdapter, VLLMCapabilities, VLLMHttpAdapter, launch_settings

__all__ = [
    "AlreadyActive",
    "EngineAdapter",
    "EngineError",
    "EngineHook",
    "EngineRequest",
    "LaunchSettings",
    "Outcome",
    "SGLangEngineAdapter",
    "SGLangHttpAdapter",
    "SGLangTokenizerAdapter",
    "VLLMAdapter",
    "VLLMAsyncAdapter",
    "VLLMCapabilities",
    "VLLMHttpAdapter",
    "attach",
    "attached",
    "detach",
    "launch_settings",
    "plan",
    "stop_all",
]

#: Where each public name lives (loaded on first access).
_WHERE = {
    **dict.fromkeys(("EngineHook", "attach", "attached", "detach", "stop_all"), "._attach"),
    **dict.fromkeys(("AlreadyActive", "EngineAdapter", "EngineError", "EngineRequest", "Outcome", "plan"), "._base"),
    **dict.fromkeys(("SGLangEngineAdapter", "SGLangHttpAdapter", "SGLangTokenizerAdapter"), ".sglang"),
    **dict.fromkeys(("LaunchSettings", "VLLMAdapter", "VLLMAsyncAdapter", "VLLMCapabilities", "VLLMHttpAdapter",
                     "launch_settings"), ".vllm"),
}


def __getattr__(name: str) -> object:
    """Load a public name from its module on first access."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
