"""profctx: step- and role-aware profiling for distributed RL and LLM training."""

from ._api import attach, configure, detach, flush, get_config, is_configured, reset
from ._block import profile_step
from ._config import EngineConfig, ProfilerConfig
from ._decorate import profiled
from ._errors import ConfigError, ProfilingError
from ._hooks import on_capture, remove_on_capture
from ._propagate import adopt, bind, extract, inject
from ._scope import Scope, current
from ._steps import Steps
from ._window import StepWindow

__all__ = [
    "ConfigError",
    "EngineConfig",
    "ProfilerConfig",
    "ProfilingError",
    "Scope",
    "ScopedThreadPoolExecutor",
    "StepWindow",
    "Steps",
    "adopt",
    "attach",
    "bind",
    "configure",
    "current",
    "detach",
    "extract",
    "flush",
    "get_config",
    "inject",
    "is_configured",
    "on_capture",
    "profile_step",
    "profiled",
    "remove_on_capture",
    "reset",
]

__version__ = "0.1.0"

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._pool import ScopedThreadPoolExecutor


def __getattr__(name: str) -> object:
    """``ScopedThreadPoolExecutor``, imported on first use (``concurrent.futures`` costs a few ms)."""
    if name == "ScopedThreadPoolExecutor":
        from ._pool import ScopedThreadPoolExecutor

        return ScopedThreadPoolExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
