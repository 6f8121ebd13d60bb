"""Device-profiler backends, resolved by name and imported lazily."""

from __future__ import annotations

import importlib
import sys
from typing import Any, Final

from ..core._vocab import Tool
from ._base import Backend, CaptureSpec, Finish, check_config, installed, no_files

__all__ = ["Backend", "CaptureSpec", "Finish", "backend_class", "check_config", "choose_tool", "known", "no_files",
           "register", "resolve_tool"]

#: The backends profctx ships (``core._vocab.Tool`` names them; ``tests/test_vocabulary.py`` checks both
#: list the same), each imported on first use.
BUILTIN: Final[dict[Tool, str]] = {
    "torch": "profctx.backends.torch:TorchBackend",
    "noop": "profctx.backends.noop:NoopBackend",
    "recording": "profctx.backends.recording:RecordingBackend",
    "npu": "profctx.backends.npu:NpuBackend",
    "nsys": "profctx.backends.nsys:NsysBackend",
    "torch_memory": "profctx.backends.torch_memory:TorchMemoryBackend",
}
_REGISTRY: dict[str, str | type[Any]] = {name: where for name, where in BUILTIN.items()}


def register(name: str, backend: str | type[Any]) -> None:
    """Make ``tool=name`` resolve to ``backend`` (a class, or ``"module:Class"`` imported on use)."""
    _REGISTRY[name] = backend


def known() -> tuple[str, ...]:
    """Return every tool name that resolves, ``auto`` included."""
    return ("auto", *_REGISTRY)


def resolve_tool(tool: str) -> str:
    """Return the backend whose ``check_config`` judges a config naming ``tool``; import no device library.

    ``auto`` is :func:`choose_tool`'s answer where torch_npu is already imported; otherwise ``npu``
    where torch_npu is installed (found, not imported) and an npu backend is registered, else
    ``torch``. The tool a capture runs is :func:`choose_tool`'s: on a machine with torch_npu
    installed, not yet imported, and no NPU, the two differ (``npu`` checked, ``torch`` run).
    """
    if tool != "auto":
        return tool
    if sys.modules.get("torch_npu") is not None:
        return choose_tool(tool)[0]
    return "npu" if "npu" in _REGISTRY and installed("torch_npu") else "torch"


def choose_tool(tool: str) -> tuple[str, str | None]:
    """Return the concrete tool ``tool`` stands for and, for ``auto``, why it was chosen.

    ``auto`` is ``npu`` when torch_npu imports and reports an NPU, else ``torch``. torch_npu is
    imported (seconds) only where it is installed: call this only in a process that can capture.
    """
    if tool != "auto":
        return tool, None
    if "npu" not in _REGISTRY:
        return "torch", "tool='auto' chose 'torch': no npu backend is registered"
    if not installed("torch_npu"):
        return "torch", "tool='auto' chose 'torch': torch_npu is not installed"
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


def backend_class(tool: str) -> type[Any]:
    """Return the backend class registered for ``tool`` (importing it if needed; ``auto``: :func:`choose_tool`'s)."""
    concrete = choose_tool(tool)[0]
    entry = _REGISTRY[concrete]
    if isinstance(entry, str):
        module_name, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module_name), attr)
        _REGISTRY[concrete] = entry
    return entry
