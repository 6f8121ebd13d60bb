"""Check the type of every verl profiler field a block sets, as verl's dataclasses would, at conversion time.

A wrong type anywhere in a profiler block (a tool of an unused role, a finish hook profctx does not
carry) raises :class:`ConfigError` naming the verl field, the value and what verl allows, rather than
an ``AttributeError`` deep in the conversion or a garbage value in a note.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from ..util._errors import ConfigError, one_of
from ._verl_input import as_flag, as_mapping
from ._verl_options import NPU_LEVELS

#: Tool names verl's ProfilerConfig accepts.
VERL_TOOLS: Final = ("torch", "npu", "nsys", "torch_memory", "precision_debugger", "memray")


def _flag(path: str, value: object) -> None:
    as_flag(path, value)


def _text_or_null(path: str, value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(path, value, "a string or null")


def _path_or_null(path: str, value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ConfigError(path, value, "a non-empty folder path or null")


def _tool(path: str, value: object) -> None:
    if value is not None and value not in VERL_TOOLS:
        raise ConfigError(path, value, f"a verl tool: {one_of(VERL_TOOLS)}, or null")


def _ranks(path: str, value: object) -> None:
    if value is None:
        return
    if not isinstance(value, (list, tuple)) or any(
        isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in value
    ):
        raise ConfigError(path, value, "a list of ranks (integers >= 0)")


def _steps(path: str, value: object) -> None:
    if value is not None and (not isinstance(value, (list, tuple)) or any(
        isinstance(s, bool) or not isinstance(s, int) for s in value
    )):
        raise ConfigError(path, value, "a list of global steps (integers >= 1), or null")


def _positive(path: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(path, value, "an integer > 0")


def _count_or_null(path: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ConfigError(path, value, "an integer >= 0 or null")


def _contents(path: str, value: object) -> None:
    if value is None:
        return
    if not isinstance(value, (list, tuple)) or any(not isinstance(v, str) for v in value):
        raise ConfigError(path, value, "a list of content names (strings)")


def _level(path: str, value: object) -> None:
    if value not in NPU_LEVELS:
        raise ConfigError(path, value, one_of(NPU_LEVELS))


def _schedule(path: str, value: object) -> None:
    if value is None:
        return
    for key, item in as_mapping(path, value).items():
        if key != "_target_" and (isinstance(item, bool) or not isinstance(item, int) or item < 0):
            raise ConfigError(f"{path}.{key}", item, "an integer >= 0")


def _mapping(path: str, value: object) -> None:
    if value is not None:
        as_mapping(path, value)


_Check = Callable[[str, object], None]
#: Fields of a role's (or the global) profiler block, and their check.
BLOCK: Final[Mapping[str, _Check]] = {
    "tool": _tool,
    "enable": _flag,
    "all_ranks": _flag,
    "ranks": _ranks,
    "save_path": _path_or_null,
    "relocate_results": _flag,
    "finish_hook_cmd": _text_or_null,
    "finish_hook_all_ranks": _flag,
    "finish_hook_ranks": _ranks,
    "profile_continuous_steps": _flag,
    "steps": _steps,
    "tool_config": _mapping,
    "global_tool_config": _mapping,
}
#: Fields of the tool blocks (``tool_config.<tool>`` and ``global_tool_config.<tool>``), any tool.
TOOL: Final[Mapping[str, _Check]] = {
    "contents": _contents,
    "discrete": _flag,
    "level": _level,
    "analysis": _flag,
    "profile_token_start": _count_or_null,
    "profile_token_end": _count_or_null,
    "schedule": _schedule,
    "trace_alloc_max_entries": _positive,
    "stack_depth": _positive,
    "memory_snapshot_num_steps": _positive,
    "kw_args": _mapping,
    "controller_nsight_options": _mapping,
    "worker_nsight_options": _mapping,
    "name": _text_or_null,
}


def check_block(path: str, block: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` for the first field of profiler ``block`` (at verl ``path``) with a wrong type."""
    for key, value in block.items():
        check = BLOCK.get(key)
        if check is not None:
            check(f"{path}.{key}", value)
    for group in ("tool_config", "global_tool_config"):
        tools = block.get(group) or {}
        for name, tool_block in tools.items():
            if tool_block is None:
                continue
            base = f"{path}.{group}.{name}"
            for key, value in as_mapping(base, tool_block).items():
                check = TOOL.get(key)
                if check is not None and not (key == "discrete" and value is None):  # nsys: interpolated null
                    check(f"{base}.{key}", value)
