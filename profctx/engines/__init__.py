"""Engine adapters: start and stop vLLM and SGLang profilers from the ambient role scope.

``attach(adapter, ...)`` once; every block entering a role that matches ``engines.roles``
inside an in-window step then starts the attached engines concurrently, and leaving it
stops them. See ``docs/engines.md``.
"""

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
