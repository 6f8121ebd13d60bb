"""Device-profiler backends, resolved by name and imported lazily."""

from __future__ import annotations

import importlib
from typing import Any

from ._base import Backend, CaptureSpec, Finish, check_config, no_files

__all__ = ["Backend", "CaptureSpec", "Finish", "backend_class", "check_config", "choose_tool", "known", "no_files",
           "register", "resolve_tool"]

_REGISTRY: dict[str, str | type[Any]] = {
    "torch": "profctx.backends.torch:TorchBackend",
    "noop": "profctx.backends.noop:NoopBackend",
    "recording": "profctx.testing._recording:RecordingBackend",
    "npu": "profctx.backends.npu:NpuBackend",
    "nsys": "profctx.backends.nsys:NsysBackend",
    "torch_memory": "profctx.backends.torch_memory:TorchMemoryBackend",
}


def register(name: str, backend: str | type[Any]) -> None:
    """Make ``tool=name`` resolve to ``backend`` (a class, or ``"module:Class"`` imported on use)."""
    _REGISTRY[name] = backend


def known() -> tuple[str, ...]:
    """Return every tool name that resolves, ``auto`` included."""
    return ("auto", *_REGISTRY)


def resolve_tool(tool: str) -> str:
    """Return the concrete tool ``tool`` stands for (``auto`` picks ``npu`` where an NPU is present)."""
    return choose_tool(tool)[0]


def choose_tool(tool: str) -> tuple[str, str | None]:
    """Return the concrete tool ``tool`` stands for and, for ``auto``, why it was chosen.

    ``auto`` is ``npu`` when torch_npu imports and reports an NPU, else ``torch``.
    """
    if tool != "auto":
        return tool, None
    if "npu" in _REGISTRY:
        try:
            import torch_npu  # type: ignore[import-not-found]
        except ImportError:
            return "torch", "tool='auto' chose 'torch': torch_npu is not installed"
        try:
            present = bool(torch_npu.npu.is_available())
        except Exception as exc:  # noqa: BLE001 - a broken torch_npu install means: not an NPU machine
            return "torch", f"tool='auto' chose 'torch': torch_npu.npu.is_available() failed ({exc})"
        if present:
            return "npu", "tool='auto' chose 'npu': torch_npu is installed and an NPU is available"
        return "torch", "tool='auto' chose 'torch': torch_npu is installed but no NPU is available"
    return "torch", "tool='auto' chose 'torch': no npu backend is registered"


def backend_class(tool: str) -> type[Any]:
    """Return the backend class registered for ``tool`` (importing it if needed)."""
    concrete = resolve_tool(tool)
    entry = _REGISTRY[concrete]
    if isinstance(entry, str):
        module_name, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module_name), attr)
        _REGISTRY[concrete] = entry
    return entry
