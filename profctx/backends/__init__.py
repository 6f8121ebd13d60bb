"""Device-profiler backends, resolved by name and imported lazily."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from ._base import Backend, CaptureSpec, Finish, check_config, no_files

__all__ = ["Backend", "CaptureSpec", "Finish", "backend_class", "check_config", "known", "no_files", "register",
           "resolve_tool"]

_REGISTRY: dict[str, str | type[Any]] = {
    "torch": "profctx.backends.torch:TorchBackend",
    "noop": "profctx.backends.noop:NoopBackend",
    "recording": "profctx.testing._recording:RecordingBackend",
}


def register(name: str, backend: str | type[Any]) -> None:
    """Make ``tool=name`` resolve to ``backend`` (a class, or ``"module:Class"`` imported on use)."""
    _REGISTRY[name] = backend


def known() -> tuple[str, ...]:
    """Return every tool name that resolves, ``auto`` included."""
    return ("auto", *_REGISTRY)


def resolve_tool(tool: str) -> str:
    """Return the concrete tool ``tool`` stands for (``auto`` picks ``npu`` where an NPU is present)."""
    if tool != "auto":
        return tool
    if "npu" in _REGISTRY and importlib.util.find_spec("torch_npu") is not None:
        try:
            import torch_npu  # type: ignore[import-not-found]

            if torch_npu.npu.is_available():
                return "npu"
        except Exception:  # noqa: BLE001 - a broken torch_npu install means: not an NPU machine
            pass
    return "torch"


def backend_class(tool: str) -> type[Any]:
    """Return the backend class registered for ``tool`` (importing it if needed)."""
    concrete = resolve_tool(tool)
    entry = _REGISTRY[concrete]
    if isinstance(entry, str):
        module_name, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module_name), attr)
        _REGISTRY[concrete] = entry
    return entry
