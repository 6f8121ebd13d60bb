"""A dataclass schema of profctx's config for ``OmegaConf.structured`` and Hydra's ``ConfigStore``.

The schema mirrors :class:`profctx.ProfilerConfig` field for field, with types OmegaConf can
check (fields that take several forms, such as ``steps`` or ``ranks``, are ``Any``); profctx
itself validates every value when the node is passed to ``profctx.configure(cfg.profctx)``.
One default differs: ``enable`` is ``False``, so an application that composes the schema runs
unprofiled until ``profctx.enable=true profctx.steps=...`` is given (``ProfilerConfig`` needs
steps whenever it is enabled).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..core._config import (
    DEFAULT_EXIT_TIMEOUT,
    DEFAULT_MAX_TIMELINE_BYTES,
    DEFAULT_MAX_TRACE_BYTES,
    DEFAULT_MAX_TRACE_BYTES_PER_HOUR,
)

__all__ = ["EngineSchema", "ProfilerSchema", "register"]

# OmegaConf reads these annotations at run time on Python 3.10, so they use typing.Optional,
# List and Dict forms it understands, not PEP 604 unions.


def _rollout() -> list[str]:
    return ["rollout"]


def _first() -> list[int]:
    return [0]


@dataclass
class EngineSchema:
    """Schema of ``engines``: see :class:`profctx.EngineConfig`."""

    roles: list[str] = field(default_factory=_rollout)
    replicas: Any = field(default_factory=_first)
    contents: list[str] = field(default_factory=list)
    delay: Optional[int] = None  # noqa: UP045 - OmegaConf evaluates the annotation on 3.10
    count: Optional[int] = None  # noqa: UP045
    by_stage: bool = False
    merge_profiles: bool = False
    absolute_start_step: Optional[int] = None  # noqa: UP045
    start_timeout: float = 120.0
    stop_timeout: float = 1800.0


@dataclass
class ProfilerSchema:
    """Schema of profctx's config: see :class:`profctx.ProfilerConfig` and ``docs/configuration.md``."""

    enable: bool = False
    steps: Any = None
    mode: str = "step"
    contiguous: bool = False
    roles: list[str] = field(default_factory=list)
    ranks: Any = field(default_factory=_first)
    rank: Optional[int] = None  # noqa: UP045
    world_size: Optional[int] = None  # noqa: UP045
    group: Optional[str] = None  # noqa: UP045
    groups: dict[str, Any] = field(default_factory=dict)
    profile_driver: Optional[bool] = None  # noqa: UP045
    save_path: str = "./profiles"
    tool: str = "torch"
    contents: list[str] = field(default_factory=list)
    compress: bool = True
    on_error: str = "log"
    exit_hooks: bool = True
    exit_timeout: float = DEFAULT_EXIT_TIMEOUT
    max_trace_bytes: Optional[int] = DEFAULT_MAX_TRACE_BYTES  # noqa: UP045
    max_trace_bytes_per_hour: Optional[int] = DEFAULT_MAX_TRACE_BYTES_PER_HOUR  # noqa: UP045
    max_timeline_bytes: Optional[int] = DEFAULT_MAX_TIMELINE_BYTES  # noqa: UP045
    warmup: bool = True
    private: bool = False
    on_demand: bool = False
    on_demand_max_captures: int = 10
    auto_capture: Any = None
    timeline: bool = True
    summary_at_exit: bool = False
    run_id: Optional[str] = None  # noqa: UP045
    engines: EngineSchema = field(default_factory=EngineSchema)
    tool_options: dict[str, Any] = field(default_factory=dict)


def register(name: str = "profctx", group: str | None = None) -> None:
    """Store :class:`ProfilerSchema` in Hydra's ``ConfigStore`` as ``name`` (in ``group`` if given).

    Call it before ``@hydra.main`` runs; then ``defaults: [profctx_schema@profctx]``-style
    composition, or a ``profctx:`` node typed by ``name``, is checked by Hydra. Raise
    ``ImportError`` when hydra-core is not installed.
    """
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=name, node=ProfilerSchema, group=group)
