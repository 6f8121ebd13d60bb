"""profctx: step- and role-aware profiling for distributed RL and LLM training."""

from .core._config import EngineConfig, ProfilerConfig
from .core._scope import Scope
from .core._window import StepWindow
from .process._api import attach, configure, detach, flush, get_config, is_configured, reset
from .process._block import current, profile_step
from .process._decorate import profiled
from .process._engines import EngineView as _EngineView  # noqa: F401 - serves engines their view of the process
from .process._hooks import on_capture, remove_on_capture
from .process._last import RoleTime, StepTimes, last_step
from .process._propagate import adopt, bind, extract, inject
from .process._steps import Steps
from .util._errors import ConfigError, ProfilingError

__all__ = [
    "ConfigError",
    "EngineConfig",
    "ProfilerConfig",
    "ProfilingError",
    "RoleTime",
    "Scope",
    "ScopedThreadPoolExecutor",
    "StepTimes",
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
    "last_step",
    "on_capture",
    "profile_step",
    "profiled",
    "remove_on_capture",
    "reset",
]

__version__ = "0.1.0"

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .util._pool import ScopedThreadPoolExecutor


def __getattr__(name: str) -> object:
    """``ScopedThreadPoolExecutor``, imported on first use (``concurrent.futures`` costs a few ms)."""
    if name == "ScopedThreadPoolExecutor":
        from .util._pool import ScopedThreadPoolExecutor

        return ScopedThreadPoolExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
