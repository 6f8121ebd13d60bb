"""A capture's state: one closed vocabulary for the process side, the manifest and its readers.

The states are strings (``Literal``), so the manifest's JSON and every reader see the same text
they always did, and mypy refuses any other string where a state goes. A process-side capture
goes ``planned`` -> ``starting`` -> ``live`` -> ``stopping`` -> an ended state, or from
``planned`` straight to ``skipped`` (another capture held the profiler, or the disk is full),
``failed`` or ``interrupted`` (its start did not complete). Readers add ``open``: started in
the manifest and never finished.
"""

from __future__ import annotations

from typing import Final, Literal

#: How a capture ended (what a ``finished`` manifest record says). ``interrupted``: a signal,
#: Ctrl-C or process exit cut it short (its trace may be missing).
Ended = Literal["ok", "failed", "skipped", "interrupted"]
#: Every state: a capture's life in the process, how it ended, and ``open`` (readers only).
State = Literal["planned", "starting", "live", "stopping", "ok", "failed", "skipped", "interrupted", "open"]

#: States in which a capture holds the process's profiler (started and not yet given back).
HOLDING: Final[tuple[State, ...]] = ("starting", "live", "stopping")
#: The states a manifest listing shows, in the order the CLI lists them.
LISTED: Final[tuple[State, ...]] = ("ok", "failed", "skipped", "open", "interrupted")
