"""Answers from a profiled run: phase breakdown, stragglers, trends, diffs and a regression gate.

``summarize(save_path)`` streams a run's manifest and traces into a :class:`Summary` (its
``to_json()`` is the versioned ``profctx.summary`` document); :func:`diff` compares two
summaries; :func:`check` turns a diff into pass/fail against thresholds. See ``docs/analysis.md``.
"""

from ..manifest import process_names
from ._align import Clocks, Lane, StepAlignment, align, align_steps, clocks
from ._check import Threshold, Violation, check, parse_threshold
from ._diff import Diff, OpDelta, RoleDelta, diff
from ._summary import (
    SCHEMA,
    SCHEMA_VERSION,
    STRAGGLER_RATIO,
    CaptureSummary,
    OpFigure,
    RoleStep,
    Summary,
    summarize,
    summarize_records,
)
from ._trace import TraceFigures, read_figures

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "STRAGGLER_RATIO",
    "CaptureSummary",
    "Clocks",
    "Diff",
    "Lane",
    "OpDelta",
    "OpFigure",
    "RoleDelta",
    "RoleStep",
    "StepAlignment",
    "Summary",
    "Threshold",
    "TraceFigures",
    "Violation",
    "align",
    "align_steps",
    "check",
    "clocks",
    "diff",
    "parse_threshold",
    "process_names",
    "read_figures",
    "summarize",
    "summarize_records",
]
